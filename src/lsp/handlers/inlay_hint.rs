//! `textDocument/inlayHint`: `38% live memory` / `41% of heap peak` at the end of a line.

use std::path::Path;

use tower_lsp_server::ls_types::*;

use crate::lsp::View;
use crate::lsp::to_proto;

/// Hints for the lines of `p.range` of `path`, placed against `text` (the buffer or the file).
pub fn inlay_hints(view: &View, path: &Path, text: &str, p: &InlayHintParams) -> Vec<InlayHint> {
    if !view.inlay_hints {
        return Vec::new();
    }
    let Some(file) = view.index.files.get(path) else {
        return Vec::new();
    };
    let first = p.range.start.line.saturating_add(1);
    let last = p.range.end.line.saturating_add(1).max(first);
    file.lines
        .range(first..=last)
        .filter_map(|(line, entry)| {
            let site = entry.top_site().filter(|s| {
                s.site.percent >= view.inlay_min_percent && s.site.bytes >= view.inlay_min_bytes
            })?;
            let line0 = line - 1;
            let lt = to_proto::line_of(text, line0)?;
            Some(to_proto::inlay_hint(site, line0, lt, view.encoding))
        })
        .collect()
}
