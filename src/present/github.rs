//! `--check --format github`: GitHub Actions workflow commands, one annotation per finding.

use std::fmt::Write;

use crate::findings::Severity;
use crate::report::CaptureReport;

pub(crate) fn check(reports: &[CaptureReport]) -> String {
    let mut out = String::new();
    for r in reports {
        for f in &r.findings {
            let level = match f.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
                Severity::Information | Severity::Hint => "notice",
            };
            let location = match &f.location {
                Some(l) => format!("file={},line={},", property(l.shown()), l.line),
                None => format!("file={},", property(&r.display_path())),
            };
            let mut message = f.message.clone();
            for e in &f.evidence {
                let _ = write!(message, "\n{}: {}", e.label.as_str(), e.text);
            }
            for x in &f.fixes {
                let _ = write!(message, "\nfix: {}{}", x.title, super::text::fix_notes(x));
            }
            let _ = writeln!(
                out,
                "::{level} {location}title={}::{}",
                property(&format!("memlsp {}", f.code)),
                data(&message)
            );
        }
    }
    out
}

/// Escaping of a workflow command's message: control characters of capture strings shown as
/// `\x1b` (the log would interpret them), then GitHub's own escapes.
fn data(s: &str) -> String {
    crate::present::escape::terminal(s)
        .replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// Escaping of a workflow command's property value.
fn property(s: &str) -> String {
    data(s).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_github_requires() {
        assert_eq!(data("50% of\nx"), "50%25 of%0Ax");
        // A carriage return or an escape sequence of a capture string is shown, not obeyed.
        assert_eq!(data("a\r\x1b[2Jb"), "a\\x0d\\x1b[2Jb");
        assert_eq!(property("C:\\a,b.py"), "C%3A\\a%2Cb.py");
    }
}
