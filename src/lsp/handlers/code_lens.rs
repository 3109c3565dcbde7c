//! `textDocument/codeLens`: "Show memory timeline" above every line that shows a finding. The
//! lens runs the client-side command `memlsp.showTimeline` (the editor integrations register
//! it), which asks the server for the page with `memlsp.timeline` and shows it.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::json;
use tower_lsp_server::ls_types::*;

use crate::lsp::View;
use crate::lsp::commands;
use crate::lsp::index::capture_name;
use crate::lsp::to_proto;

pub fn code_lenses(view: &View, path: &Path) -> Vec<CodeLens> {
    if !view.code_lens {
        return Vec::new();
    }
    let uri = to_proto::uri(path).map(|u| u.as_str().to_string());
    let mut out = Vec::new();
    for (line, _, entry) in view.lines_in(path, 1, u32::MAX) {
        let line0 = line - 1;
        // One lens per capture whose finding the editor shows on this line.
        let mut captures = BTreeSet::new();
        for lf in &entry.findings {
            if view.published(path, line0, lf.finding.code).is_some() {
                captures.insert(lf.capture.clone());
            }
        }
        let many = captures.len() > 1;
        for capture in captures {
            let title = if many {
                format!("Show memory timeline ({})", capture_name(&capture))
            } else {
                "Show memory timeline".to_string()
            };
            out.push(CodeLens {
                range: Range::new(Position::new(line0, 0), Position::new(line0, 0)),
                command: Some(Command {
                    title,
                    command: commands::SHOW_TIMELINE.into(),
                    arguments: Some(vec![json!({
                        "capture": capture.to_string_lossy(),
                        "file": uri,
                        "line": line,
                    })]),
                }),
                data: None,
            });
        }
    }
    out
}
