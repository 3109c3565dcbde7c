//! `textDocument/hover`: the findings and sites on a line, with stacks and labelled evidence.

use std::path::Path;

use tower_lsp_server::ls_types::*;

use crate::lsp::View;
use crate::lsp::to_proto;

pub fn hover(view: &View, path: &Path, p: &HoverParams) -> Option<Hover> {
    let pos = &p.text_document_position_params;
    let entry = view.entry_at(path, pos.position.line.saturating_add(1))?;
    if entry.findings.is_empty() && entry.sites.is_empty() {
        return None;
    }
    Some(Hover {
        contents: HoverContents::Markup(MarkupContent {
            kind: MarkupKind::Markdown,
            value: to_proto::hover_markdown(entry, &view.frames),
        }),
        range: None,
    })
}
