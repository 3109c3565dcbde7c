//! The only place where memlsp's data meets LSP types (the rust-analyzer `to_proto` pattern).
//!
//! Columns inside memlsp are 0-based UTF-8 byte offsets; LSP columns are in the negotiated
//! position encoding (UTF-16 unless the client offers UTF-8).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::json;
use tower_lsp_server::ls_types as lsp;
use tower_lsp_server::ls_types::Uri;

use crate::findings::{self, Severity};
use crate::frames::FrameFilter;
use crate::lsp::index::{LineEntry, LineFinding, LineSite, capture_name};
use crate::present::{editor, hover};

/// How LSP columns are counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    Utf8,
    #[default]
    Utf16,
}

impl Encoding {
    /// Pick UTF-8 when the client offers it (no conversion), else the mandatory UTF-16.
    pub fn negotiate(offered: Option<&[lsp::PositionEncodingKind]>) -> Encoding {
        match offered {
            Some(list) if list.contains(&lsp::PositionEncodingKind::UTF8) => Encoding::Utf8,
            _ => Encoding::Utf16,
        }
    }

    pub fn to_proto(self) -> lsp::PositionEncodingKind {
        match self {
            Encoding::Utf8 => lsp::PositionEncodingKind::UTF8,
            Encoding::Utf16 => lsp::PositionEncodingKind::UTF16,
        }
    }
}

/// A byte column of `line` as an LSP column. Columns past the end clamp to the end; a column
/// inside a UTF-8 sequence counts up to the character's start.
pub fn column(line: &str, byte_col: u32, enc: Encoding) -> u32 {
    let b = (byte_col as usize).min(line.len());
    let mut end = b;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    match enc {
        Encoding::Utf8 => end as u32,
        Encoding::Utf16 => line[..end].encode_utf16().count() as u32,
    }
}

/// LSP column → byte column of `line` (for ranges the client sends).
pub fn byte_column(line: &str, col: u32, enc: Encoding) -> u32 {
    match enc {
        Encoding::Utf8 => col.min(line.len() as u32),
        Encoding::Utf16 => {
            let mut units = 0u32;
            for (i, ch) in line.char_indices() {
                if units >= col {
                    return i as u32;
                }
                units += ch.len_utf16() as u32;
            }
            line.len() as u32
        }
    }
}

/// Line `n` (0-based) of `text` without its line ending.
pub fn line_of(text: &str, n: u32) -> Option<&str> {
    text.split('\n')
        .nth(n as usize)
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
}

pub fn uri(path: &Path) -> Option<Uri> {
    Uri::from_file_path(path)
}

pub fn path(uri: &Uri) -> Option<PathBuf> {
    uri.to_file_path().map(|p| p.into_owned())
}

pub fn severity(s: Severity) -> lsp::DiagnosticSeverity {
    match s {
        Severity::Error => lsp::DiagnosticSeverity::ERROR,
        Severity::Warning => lsp::DiagnosticSeverity::WARNING,
        Severity::Information => lsp::DiagnosticSeverity::INFORMATION,
        Severity::Hint => lsp::DiagnosticSeverity::HINT,
    }
}

/// The range a line-level finding covers: first non-blank column to the end of the line.
fn line_range(line0: u32, text: Option<&str>, enc: Encoding) -> lsp::Range {
    let (start, end) = match text {
        Some(t) => {
            let first = t.len() - t.trim_start().len();
            (column(t, first as u32, enc), column(t, t.len() as u32, enc))
        }
        None => (0, 0),
    };
    lsp::Range::new(
        lsp::Position::new(line0, start),
        lsp::Position::new(line0, end),
    )
}

/// The diagnostic for a finding now on line `line` (1-based; where the culprit line's text is
/// after the user's edits), whose current text is `line_text`.
pub fn diagnostic(
    lf: &LineFinding,
    line: u32,
    line_text: Option<&str>,
    enc: Encoding,
) -> lsp::Diagnostic {
    let f = &lf.finding;
    let line0 = line.saturating_sub(1);
    let name = lf.capture_name();
    let message = editor::diagnostic_message(f, &name, &lf.also_in);

    let mut related = Vec::new();
    if let Some(cap) = uri(&lf.capture) {
        related.push(lsp::DiagnosticRelatedInformation {
            location: lsp::Location::new(cap, lsp::Range::default()),
            message: editor::evidence_note(f, &name),
        });
    }
    // The next frames of the allocation stack that resolve, outermost callers last.
    for fr in lf
        .finding
        .stack
        .iter()
        .skip(1)
        .filter(|fr| fr.local().is_some())
        .take(5)
    {
        let Some(u) = fr.local().and_then(uri) else {
            continue;
        };
        let l0 = fr.line.saturating_sub(1);
        related.push(lsp::DiagnosticRelatedInformation {
            location: lsp::Location::new(
                u,
                lsp::Range::new(lsp::Position::new(l0, 0), lsp::Position::new(l0, 0)),
            ),
            message: editor::called_from(fr),
        });
    }

    let fixes: Vec<_> = f
        .fixes
        .iter()
        .map(|x| {
            json!({
                "title": x.title,
                "fix": x.kind,
                "preferred": x.preferred,
                "saving_bytes": x.saving_bytes,
                "saving_range": x.saving_range.map(|(lo, hi)| [lo, hi]),
                // What replaying the recorded requests with the fix gave (absent until the
                // simulations ran: the first publish shows what the capture records).
                "simulated": x.simulated.as_ref().map(editor::simulated_outcome),
            })
        })
        .collect();

    lsp::Diagnostic {
        range: line_range(line0, line_text, enc),
        severity: Some(severity(f.severity)),
        code: Some(lsp::NumberOrString::String(f.code.to_string())),
        code_description: lsp::Uri::from_str(&f.code.docs_url())
            .ok()
            .map(|href| lsp::CodeDescription { href }),
        source: Some("memlsp".into()),
        message,
        related_information: Some(related),
        tags: None,
        data: Some(json!({
            "capture": lf.capture.to_string_lossy(),
            "code": f.code,
            "line": line0 + 1,
            "scope": f.scope,
            "fixes": fixes,
        })),
    }
}

/// The inlay hint at the end of `line_text` (line `line0`, 0-based).
pub fn inlay_hint(ls: &LineSite, line0: u32, line_text: &str, enc: Encoding) -> lsp::InlayHint {
    let s = &ls.site;
    let tip = editor::site_tooltip(s, &capture_name(&ls.capture));
    lsp::InlayHint {
        position: lsp::Position::new(line0, column(line_text, line_text.len() as u32, enc)),
        label: lsp::InlayHintLabel::String(editor::site_hint(s)),
        kind: None,
        text_edits: None,
        tooltip: Some(lsp::InlayHintTooltip::String(tip)),
        padding_left: Some(true),
        padding_right: None,
        data: None,
    }
}

/// A finding's own hint at the end of `line_text` (`72.00 MiB not donated`), when it has one.
pub fn finding_hint(
    lf: &LineFinding,
    line0: u32,
    line_text: &str,
    enc: Encoding,
) -> Option<lsp::InlayHint> {
    let f = &lf.finding;
    let label = crate::present::hint::finding_hint(f)?;
    let tip = editor::finding_tooltip(f, &lf.capture_name());
    Some(lsp::InlayHint {
        position: lsp::Position::new(line0, column(line_text, line_text.len() as u32, enc)),
        label: lsp::InlayHintLabel::String(label),
        kind: None,
        text_edits: None,
        tooltip: Some(lsp::InlayHintTooltip::String(tip)),
        padding_left: Some(true),
        padding_right: None,
        data: None,
    })
}

/// Markdown hover for a line (`present::hover`), its stack frames linked by file URI.
pub fn hover_markdown(entry: &LineEntry, filter: &FrameFilter) -> String {
    let findings: Vec<hover::HoverFinding> = entry
        .findings
        .iter()
        .map(|lf| hover::HoverFinding {
            finding: &lf.finding,
            capture: lf.capture_name(),
            stage_at_peak: lf.stage_at_peak.as_ref(),
        })
        .collect();
    let sites: Vec<hover::HoverSite> = entry
        .sites
        .iter()
        .map(|ls| hover::HoverSite {
            site: &ls.site,
            capture: capture_name(&ls.capture),
        })
        .collect();
    let link = |p: &Path| uri(p).map(|u| u.as_str().to_string());
    hover::markdown(&findings, &sites, filter, &link)
}

/// memlsp text edits → an LSP `WorkspaceEdit`. `text_of` gives the current text of an edited
/// file (buffer or disk) so byte columns can be converted; `uri_of` maps the edit's file.
pub fn workspace_edit(
    edits: &[findings::TextEdit],
    text_of: &dyn Fn(&str) -> Option<String>,
    uri_of: &dyn Fn(&str) -> Option<Uri>,
    enc: Encoding,
) -> Option<lsp::WorkspaceEdit> {
    let mut changes: HashMap<Uri, Vec<lsp::TextEdit>> = HashMap::new();
    let mut texts: HashMap<String, Option<String>> = HashMap::new();
    for e in edits {
        let u = uri_of(&e.file)?;
        let text = texts
            .entry(e.file.clone())
            .or_insert_with(|| text_of(&e.file));
        let line0 = e.line.saturating_sub(1);
        let line = text
            .as_deref()
            .and_then(|t| line_of(t, line0))
            .unwrap_or("");
        let range = lsp::Range::new(
            lsp::Position::new(line0, column(line, e.start_col, enc)),
            lsp::Position::new(line0, column(line, e.end_col, enc)),
        );
        changes
            .entry(u)
            .or_default()
            .push(lsp::TextEdit::new(range, e.new_text.clone()));
    }
    Some(lsp::WorkspaceEdit {
        changes: Some(changes),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_columns_become_utf16_columns() {
        let line = "x = 'é𝄞' + loss";
        let b = line.find("loss").unwrap() as u32;
        // é is 2 bytes / 1 unit, 𝄞 is 4 bytes / 2 units.
        assert_eq!(column(line, b, Encoding::Utf16), b - 1 - 2);
        assert_eq!(column(line, b, Encoding::Utf8), b);
        assert_eq!(
            byte_column(line, column(line, b, Encoding::Utf16), Encoding::Utf16),
            b
        );
        assert_eq!(
            column(line, 999, Encoding::Utf16),
            line.encode_utf16().count() as u32
        );
    }

    #[test]
    fn lines_are_split_without_their_endings() {
        assert_eq!(line_of("a\r\nb\n", 0), Some("a"));
        assert_eq!(line_of("a\r\nb\n", 1), Some("b"));
        assert_eq!(line_of("a", 3), None);
    }
}

#[cfg(test)]
mod conversion_tests {
    use super::*;
    use crate::lsp::index::{
        CaptureResult, Index,
        tests::{locator, report},
    };
    use std::sync::Arc;

    fn index() -> Index {
        let caps = vec![Arc::new(CaptureResult {
            path: PathBuf::from("/ws/runs/step_100.pickle"),
            mtime: std::time::SystemTime::UNIX_EPOCH,
            reports: vec![report("/ws/runs/step_100.pickle", Some("rank 0"))],
        })];
        Index::build(&caps, &locator(true))
    }

    #[test]
    fn diagnostic_carries_code_link_capture_and_fix_data() {
        let idx = index();
        let line = idx.line(Path::new("/ws/train.py"), 8).unwrap();
        let d = diagnostic(
            &line.findings[0],
            8,
            Some("        total += loss"),
            Encoding::Utf16,
        );
        assert_eq!(d.range.start, lsp::Position::new(7, 8));
        assert_eq!(d.range.end, lsp::Position::new(7, 21));
        assert_eq!(d.source.as_deref(), Some("memlsp"));
        assert_eq!(d.severity, Some(lsp::DiagnosticSeverity::WARNING));
        assert_eq!(d.code, Some(lsp::NumberOrString::String("PT002".into())));
        assert_eq!(
            d.code_description.unwrap().href.as_str(),
            findings::Code::PT002.docs_url()
        );
        assert!(
            d.message.ends_with("(capture step_100.pickle, rank 0)"),
            "{}",
            d.message
        );
        let rel = d.related_information.unwrap();
        assert_eq!(
            rel[0].location.uri.as_str(),
            "file:///ws/runs/step_100.pickle"
        );
        assert_eq!(rel[1].location.uri.as_str(), "file:///ws/main.py");
        assert_eq!(rel[1].location.range.start.line, 19);
        let data = d.data.unwrap();
        assert_eq!(data["fixes"][0]["fix"]["kind"], "detach_accumulated");
        assert_eq!(data["fixes"][0]["preferred"], true);
    }

    #[test]
    fn hint_and_hover_say_what_the_user_needs() {
        let idx = index();
        let line = idx.line(Path::new("/ws/train.py"), 8).unwrap();
        let site = line.top_site().unwrap();
        let h = inlay_hint(site, 7, "  total += loss  # é", Encoding::Utf16);
        // 21 bytes, 20 UTF-16 units.
        assert_eq!(h.position, lsp::Position::new(7, 20));
        match h.label {
            lsp::InlayHintLabel::String(s) => assert_eq!(s, "38% live memory"),
            other => panic!("label {other:?}"),
        }
        let md = hover_markdown(line, &FrameFilter::default());
        assert!(
            md.contains(
                "**PT002 retained autograd graph** (warning), capture `step_100.pickle`, rank 0"
            ),
            "{md}"
        );
        assert!(
            md.contains("- *measured*: 12 blocks allocated in backward stay live"),
            "{md}"
        );
        assert!(
            md.contains("- *inferred*: accumulated without .detach()"),
            "{md}"
        );
        // Each user frame links to its file and line.
        assert!(
            md.contains("\n- [train.py:8](file:///ws/train.py#L8) `step`\n- [main.py:20](file:///ws/main.py#L20) `main`\n"),
            "{md}"
        );
        assert!(md.contains("… 1 framework frames folded"), "{md}");
        assert!(
            md.contains("1.20 GiB** live in 12 blocks (38.2% of live memory"),
            "{md}"
        );
    }
}
