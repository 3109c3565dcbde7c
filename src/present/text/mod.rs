//! Human text: the `report` body (one renderer for the sections both engines share — headline,
//! Diagnosis, Next steps, Uncertainty — and a small one per engine for its own sections) and the
//! compiler-style `--check` listing.
//!
//! Every number carries its label: `[measured]`, `[read]`, `[inferred]` or `[simulated]`.

mod check;
mod torch;
mod xla;

use crate::present::escape::one_line;
use std::fmt::Write;

use crate::findings::{Finding, Kind, Label, SavingNote, fmt_bytes};
use crate::report::{CaptureReport, Engine};

pub(crate) use check::{check, finding_line, fix_notes, place, whence};
pub(crate) use torch::ranks_table;

/// `[measured]` etc.
pub(crate) fn tag(l: Label) -> &'static str {
    match l {
        Label::Measured => "[measured]",
        Label::Read => "[read]",
        Label::Inferred => "[inferred]",
        Label::Simulated => "[simulated]",
    }
}

/// `report`: per capture, the headline sentence, the engine's sections, then the shared ones.
pub(crate) fn report(reports: &[CaptureReport], top: usize) -> String {
    let mut out = String::new();
    // A comparison of ranks is printed with the first rank of its group, once.
    let (_, groups) = crate::report::rank_groups(reports);
    let mut shown = std::collections::HashSet::new();
    for (i, r) in reports.iter().enumerate() {
        let first_of_group = groups[i].is_some_and(|g| shown.insert(g));
        if i > 0 {
            out.push('\n');
        }
        if reports.len() > 1 {
            let _ = writeln!(out, "== {} ==", r.path.display());
        }
        let _ = writeln!(out, "{}\n", r.headline());
        match &r.engine {
            Engine::Torch(t) => torch::sections(&mut out, r, t, top, first_of_group),
            Engine::Xla(x) => xla::sections(&mut out, r, x, top),
        }
        if matches!(&r.engine, Engine::Xla(x) if x.plan.is_none()) {
            continue;
        }
        diagnosis(&mut out, r);
        next_steps(&mut out, r);
        uncertainty(&mut out, r);
    }
    // Capture strings (frame, file and module names) are in it: no control character reaches
    // the terminal raw.
    match crate::present::escape::terminal(&out) {
        std::borrow::Cow::Borrowed(_) => out,
        std::borrow::Cow::Owned(escaped) => escaped,
    }
}

/// `memlsp compare SUMMARY…` (ranks from their JSON summaries): the ranks table, then the
/// findings it raised as `--check` lists them.
pub(crate) fn rank_comparison(
    cmp: &crate::torch::ranks::RankComparison,
    reports: &[CaptureReport],
) -> String {
    let mut s = ranks_table(cmp);
    s.push_str(&check(reports, 0));
    // Site names of the ranks' captures are in the table: shown, not obeyed.
    crate::present::escape::terminal(&s).into_owned()
}

/// Findings that diagnose (attribution hints are the top-sites rows already shown).
fn diagnoses(r: &CaptureReport) -> impl Iterator<Item = &Finding> {
    r.findings
        .iter()
        .filter(|f| f.code.kind() == Kind::Diagnosis)
}

fn at(f: &Finding) -> Option<String> {
    f.location
        .as_ref()
        .map(|l| one_line(&format!("{}:{}", l.file, l.line)).into_owned())
}

fn diagnosis(s: &mut String, r: &CaptureReport) {
    let _ = writeln!(s, "Diagnosis");
    if diagnoses(r).next().is_none() {
        let _ = writeln!(
            s,
            "  {} {}",
            match &r.engine {
                Engine::Torch(_) =>
                    "no leak, retention or OOM pattern matches this snapshot's evidence",
                Engine::Xla(_) =>
                    "no problem found: parameters donated or nothing to donate, no growth evidence, no single line dominates the peak",
            },
            tag(Label::Inferred)
        );
    }
    for f in diagnoses(r) {
        // The diagnosis is our reading of the evidence (an OOM's message restates the recorded
        // entry); the evidence lines carry their own labels.
        let _ = writeln!(
            s,
            "  {} {} ({}){}: {} {}",
            f.code,
            f.code.pattern(),
            f.severity.as_str(),
            at(f).map(|a| format!(" at {a}")).unwrap_or_default(),
            one_line(&f.message),
            tag(f.code.message_label())
        );
        for e in &f.evidence {
            let _ = writeln!(s, "      {} {}", tag(e.label), one_line(&e.text));
        }
    }
    s.push('\n');
}

fn next_steps(s: &mut String, r: &CaptureReport) {
    let _ = writeln!(s, "Next steps");
    let mut n = 0;
    for f in diagnoses(r) {
        let at = at(f).map(|a| format!(" {a}")).unwrap_or_default();
        for fix in &f.fixes {
            n += 1;
            // Savings are estimates: labelled, and said once; a bound from the plan as a range.
            let saving = match fix.saving_note() {
                Some(SavingNote::InTitle) => format!(" {}", tag(Label::Inferred)),
                Some(SavingNote::Amount(a)) => format!(" — saves {a} {}", tag(Label::Inferred)),
                None => String::new(),
            };
            let cost = fix
                .cost
                .as_ref()
                .map(|c| format!("; cost: {c}"))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  {n}. {}{at}: {}{saving}{cost}",
                f.code,
                one_line(&fix.title)
            );
            if let Some(sim) = &fix.simulated {
                let retries = sim
                    .retries_words()
                    .map(|r| format!("; {r}"))
                    .unwrap_or_default();
                let _ = writeln!(
                    s,
                    "      {} {}: {}; reserved {} → {}{retries}",
                    tag(Label::Simulated),
                    sim.change,
                    sim.peak_words(),
                    fmt_bytes(sim.peak_reserved_before),
                    fmt_bytes(sim.peak_reserved_after)
                );
            }
        }
    }
    let extra = match &r.engine {
        Engine::Torch(t) => torch::next_steps(r, t),
        Engine::Xla(_) => xla::next_steps(),
    };
    for step in extra {
        n += 1;
        let _ = writeln!(s, "  {n}. {step}");
    }
    s.push('\n');
}

fn uncertainty(s: &mut String, r: &CaptureReport) {
    let _ = writeln!(s, "Uncertainty");
    let lines = match &r.engine {
        Engine::Torch(t) => torch::uncertainty(t),
        Engine::Xla(x) => xla::uncertainty(x),
    };
    for l in lines {
        let _ = writeln!(s, "  - {l}");
    }
}
