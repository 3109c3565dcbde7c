//! The editor's short texts about a finding or a site: a diagnostic's message and related
//! information, inlay hints' labels and tooltips, a fix's code-action title. The language server
//! puts them into its protocol types (`lsp/to_proto.rs`, `lsp/handlers/`); the words are here,
//! beside the other renderings. The hover's Markdown is `present::hover`; a finding's own inlay
//! words `present::hint`.

use crate::findings::{Finding, Fix, Location, Simulated, fmt_bytes};
use crate::report::{PercentOf, Site};

/// A diagnostic's message: the finding's message, then where it comes from
/// (`… (capture step_100.pickle, rank 0; also in step_90.pickle)`).
pub fn diagnostic_message(f: &Finding, capture: &str, also_in: &[String]) -> String {
    let mut whence = format!("capture {capture}");
    if let Some(scope) = &f.scope {
        whence.push_str(&format!(", {scope}"));
    }
    if !also_in.is_empty() {
        whence.push_str(&format!("; also in {}", also_in.join(", ")));
    }
    format!("{} ({whence})", f.message)
}

/// The related-information line pointing at the capture: `evidence: NAME, 1.00 GiB (38%) measured`.
pub fn evidence_note(f: &Finding, capture: &str) -> String {
    let mut what = format!("evidence: {capture}");
    if let Some(b) = f.bytes {
        what.push_str(&format!(", {}", fmt_bytes(b)));
        if let Some(p) = f.percent {
            what.push_str(&format!(" ({p:.0}%)"));
        }
        if let Some(l) = f.bytes_label {
            what.push_str(&format!(" {}", l.as_str()));
        }
    }
    what
}

/// The related-information line of a caller frame of the allocation stack.
pub fn called_from(fr: &Location) -> String {
    format!(
        "called from `{}` (recorded as {}:{})",
        fr.function, fr.file, fr.line
    )
}

/// What replaying the recorded requests with a fix gave, as the diagnostic's data carries it.
pub fn simulated_outcome(s: &Simulated) -> String {
    format!("{} — {}", s.change, s.outcome())
}

/// A fix's code-action title: `Add loss.detach() — peak 23.1 → 11.8 GiB (simulated)`.
pub fn fix_title(fix: &Fix) -> String {
    match &fix.simulated {
        Some(sim) => format!("{} — {}", fix.title, sim.summary()),
        None => fix.title.clone(),
    }
}

/// A site's inlay label: `38% live memory` (PyTorch) or `41% of heap peak` (JAX).
pub fn site_hint(site: &Site) -> String {
    let p = site.percent;
    match site.percent_of {
        PercentOf::LiveMemory => format!("{p:.0}% live memory"),
        other => format!("{p:.0}% of {}", other.as_str()),
    }
}

/// A site's inlay tooltip: `1.00 GiB in 3 blocks (38.0% of live memory) measured, capture NAME`.
pub fn site_tooltip(s: &Site, capture: &str) -> String {
    let mut tip = format!(
        "{} in {} block{} ({:.1}% of {}) {}, capture {}",
        fmt_bytes(s.bytes),
        s.blocks,
        if s.blocks == 1 { "" } else { "s" },
        s.percent,
        s.percent_of.as_str(),
        s.label.as_str(),
        capture
    );
    if let Some(scope) = &s.scope {
        tip.push_str(&format!(", {scope}"));
    }
    tip
}

/// A finding's inlay tooltip: `PT002 retained-graph (measured bytes), capture NAME`.
pub fn finding_tooltip(f: &Finding, capture: &str) -> String {
    let mut tip = format!(
        "{} {}{}, capture {}",
        f.code,
        f.code.pattern(),
        f.bytes_label
            .map(|l| format!(" ({} bytes)", l.as_str()))
            .unwrap_or_default(),
        capture
    );
    if let Some(scope) = &f.scope {
        tip.push_str(&format!(", {scope}"));
    }
    tip
}
