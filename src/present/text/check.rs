//! The compiler-style `--check` listing: one block per finding, then a summary line.

use std::fmt::Write;

use crate::findings::{Finding, Fix, SavingNote, Severity};
use crate::present::escape::one_line;
use crate::report::CaptureReport;

/// `--check --format text`: one block per finding, then a summary line.
pub(crate) fn check(reports: &[CaptureReport], unreadable: usize) -> String {
    let mut out = String::new();
    for r in reports {
        for f in &r.findings {
            finding(&mut out, r, f);
        }
    }
    out.push_str(&summary(reports, unreadable));
    // The summary names captures by path: a file name's control characters are shown too.
    match crate::present::escape::terminal(&out) {
        std::borrow::Cow::Borrowed(_) => out,
        std::borrow::Cow::Owned(escaped) => escaped,
    }
}

/// `file:line: severity[CODE] message`, then the evidence, fixes and capture, indented.
fn finding(out: &mut String, r: &CaptureReport, f: &Finding) {
    // Capture strings (frame and file names) reach these lines: each is kept one line with no
    // control character (`present::escape::one_line`).
    let _ = writeln!(out, "{}", finding_line(&place(r, f), f));
    for e in &f.evidence {
        let _ = writeln!(out, "  = {}: {}", e.label.as_str(), one_line(&e.text));
    }
    for x in &f.fixes {
        let mut line = format!("  = fix: {}{}", one_line(&x.title), one_line(&fix_notes(x)));
        if x.edit.is_some() {
            line.push_str(" [edit available]");
        }
        let _ = writeln!(out, "{line}");
    }
    if let Some(w) = whence(r, f) {
        let _ = writeln!(out, "{w}");
    }
}

/// `  = capture: NAME (scope)` under a finding placed on a line, `  = scope: (…)` under one
/// placed on its capture, else nothing.
pub(crate) fn whence(r: &CaptureReport, f: &Finding) -> Option<String> {
    let scope = f
        .scope
        .as_deref()
        .map(|s| format!(" ({})", one_line(s)))
        .unwrap_or_default();
    if f.location.is_some() {
        Some(format!(
            "  = capture: {}{scope}",
            one_line(&r.display_path())
        ))
    } else if !scope.is_empty() {
        Some(format!("  = scope:{scope}"))
    } else {
        None
    }
}

/// Where a finding is: its `file:line` (the shown file), else the capture it came from.
pub(crate) fn place(r: &CaptureReport, f: &Finding) -> String {
    match &f.location {
        Some(l) => format!("{}:{}", l.shown(), l.line),
        None => r.display_path(),
    }
}

/// `place: severity[CODE] message`: a finding's first line as `--check` prints it (and the MCP
/// tools say it), kept one line with no control character.
pub(crate) fn finding_line(place: &str, f: &Finding) -> String {
    format!(
        "{}: {}[{}] {}",
        one_line(place),
        f.severity.as_str(),
        f.code,
        one_line(&f.message)
    )
}

/// ` (saves ~1.00 GiB, inferred; cost: …)` after a fix title, or nothing.
pub(crate) fn fix_notes(x: &Fix) -> String {
    let mut notes = Vec::new();
    // Titles often state the saving already; the label is what must not go missing.
    match x.saving_note() {
        Some(SavingNote::InTitle) => notes.push("saving inferred".to_string()),
        Some(SavingNote::Amount(a)) => notes.push(format!("saves {a}, inferred")),
        None => {}
    }
    if let Some(c) = &x.cost {
        notes.push(format!("cost: {c}"));
    }
    if let Some(sim) = &x.simulated {
        notes.push(sim.summary());
    }
    if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    }
}

/// `3 findings (1 error, 2 warnings) in 2 captures` / `no findings in 2 captures`, and how many
/// could not be read.
fn summary(reports: &[CaptureReport], unreadable: usize) -> String {
    let mut captures = plural(reports.len(), "capture", "captures");
    if unreadable > 0 {
        captures.push_str(&format!(" ({unreadable} more could not be read)"));
    }
    let all: Vec<Severity> = reports
        .iter()
        .flat_map(|r| r.findings.iter().map(|f| f.severity))
        .collect();
    if all.is_empty() {
        return format!("no findings in {captures}\n");
    }
    let parts: Vec<String> = [
        (Severity::Error, "error", "errors"),
        (Severity::Warning, "warning", "warnings"),
        (Severity::Information, "information", "information"),
        (Severity::Hint, "hint", "hints"),
    ]
    .iter()
    .filter_map(|&(sev, one, many)| {
        let n = all.iter().filter(|s| **s == sev).count();
        (n > 0).then(|| plural(n, one, many))
    })
    .collect();
    format!(
        "{} ({}) in {captures}\n",
        plural(all.len(), "finding", "findings"),
        parts.join(", ")
    )
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
