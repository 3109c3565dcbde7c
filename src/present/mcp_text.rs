//! The MCP tools' text content (what an agent reads beside the structured JSON): a report's
//! summary, the lines `explain_line` finds, `check_baseline`'s verdict, `compare_ranks`' ranks.
//! A finding is said the way `memlsp --check` says it (`present::text::finding_line`:
//! `place: severity[CODE] message`), so the agent and the CLI read the same words.

use crate::error::CaptureError;
use crate::findings::{Code, Finding, Label, Severity, fmt_bytes};
use crate::present::text::{finding_line, place, tag, whence};
use crate::report::{CaptureReport, Site};

/// How many findings a summary lists per capture before it counts the rest.
const SUMMARY_FINDINGS: usize = 5;

/// `analyze`, `diff`: each capture's headline, then its findings (at most five), one line each.
pub fn summary(reports: &[CaptureReport]) -> String {
    let mut out = Vec::new();
    for r in reports {
        out.push(format!("{}: {}", r.display_path(), r.headline()));
        for f in r.findings.iter().take(SUMMARY_FINDINGS) {
            out.push(format!("  {}", finding_line(&place(r, f), f)));
        }
        if r.findings.len() > SUMMARY_FINDINGS {
            out.push(format!(
                "  … and {} more finding(s)",
                r.findings.len() - SUMMARY_FINDINGS
            ));
        }
    }
    out.join("\n")
}

/// What one capture says about the asked line: its findings, then its sites.
pub struct LineHit<'a> {
    /// The capture, as shown (`report.display_path()`).
    pub capture: &'a str,
    pub findings: &'a [&'a Finding],
    pub sites: &'a [&'a Site],
}

/// `explain_line`, one capture: `CAPTURE: severity[CODE] message` per finding, then
/// `CAPTURE: site 40.00 MiB (13.8% of peak) [read]` per site.
pub fn explain_line_hit(h: &LineHit) -> String {
    let mut out = Vec::new();
    for f in h.findings {
        out.push(finding_line(h.capture, f));
    }
    for s in h.sites {
        out.push(format!(
            "{}: site {} ({:.1}% of {}) {}",
            h.capture,
            fmt_bytes(s.bytes),
            s.percent,
            s.percent_of.as_str(),
            tag(s.label)
        ));
    }
    out.join("\n")
}

/// `explain_line`: `FILE:LINE: N capture(s) of M scanned say something about this line`, the
/// notes on what was left out, then each capture's lines ([`explain_line_hit`]).
pub fn explain_line(
    file: &str,
    line: u32,
    analysed: usize,
    hits: usize,
    notes: &[&String],
    hit_lines: &[String],
) -> String {
    let mut out = vec![format!(
        "{file}:{line}: {hits} capture(s) of {analysed} scanned say something about this line"
    )];
    out.extend(notes.iter().map(|n| n.to_string()));
    out.extend(hit_lines.iter().cloned());
    out.join("\n")
}

/// `check_baseline`'s outcome, as the text says it.
pub struct BaselineCheck<'a> {
    pub passed: bool,
    pub reports: &'a [CaptureReport],
    pub baseline: &'a str,
    pub compared: usize,
    pub max_growth: f64,
    pub fail_on: Severity,
    pub errors: &'a [CaptureError],
    /// What the budget left out (the cut, captures outside the roots).
    pub notes: &'a [&'a String],
}

fn bl001(r: &CaptureReport) -> impl Iterator<Item = &Finding> {
    r.findings.iter().filter(|f| f.code == Code::BL001)
}

/// `check_baseline`: `passed|failed: …` then each BL001 and each other finding at or above
/// `fail_on` as `--check` starts it (its line, the capture it came from), each unreadable
/// capture and what the budget left out.
pub fn baseline_check(c: &BaselineCheck) -> String {
    let count: usize = c.reports.iter().map(|r| bl001(r).count()).sum();
    let mut out = vec![format!(
        "{}: {} capture(s) against {} ({} number(s) compared, allowed growth {:.1}%, failing on {}); {} BL001{}",
        if c.passed { "passed" } else { "failed" },
        c.reports.len(),
        c.baseline,
        c.compared,
        c.max_growth * 100.0,
        c.fail_on.as_str(),
        count,
        match c.errors.len() {
            0 => String::new(),
            n => format!("; {n} capture(s) unreadable"),
        }
    )];
    for r in c.reports {
        let others = r
            .findings
            .iter()
            .filter(|f| f.code != Code::BL001 && f.severity >= c.fail_on);
        for f in bl001(r).chain(others) {
            out.push(finding_line(&place(r, f), f));
            out.extend(whence(r, f));
        }
    }
    out.extend(c.errors.iter().map(|e| e.to_string()));
    out.extend(c.notes.iter().map(|n| n.to_string()));
    out.join("\n")
}

/// `compare_ranks`: how uneven the ranks are, then each rank's headline.
pub fn ranks(imbalance: Option<f64>, ranks: &[(&CaptureReport, usize)]) -> String {
    let mut text = match imbalance {
        Some(x) => format!(
            "{} ranks; {x:.2}× live memory between the fullest and the emptiest {}",
            ranks.len(),
            tag(Label::Measured)
        ),
        None => format!("{} ranks", ranks.len()),
    };
    for (r, rank) in ranks {
        text.push_str(&format!(
            "\nrank {rank} ({}): {}",
            r.display_path(),
            r.headline()
        ));
    }
    text
}

/// The line a trend adds to the tool's text: how many sites grew at every snapshot.
pub fn trend_line(reports: &[CaptureReport]) -> Option<String> {
    let Some(crate::report::Engine::Torch(t)) = reports.first().map(|r| &r.engine) else {
        return None;
    };
    let tr = t.trend.as_ref()?;
    let growing = tr.sites.iter().filter(|s| s.grows_every_step).count();
    Some(format!(
        "  trend over {} snapshots: {} site(s) grew at every one [measured bytes, inferred verdict]",
        tr.steps.len(),
        growing
    ))
}
