//! `textDocument/diagnostic` (pull): exactly what was last pushed for the file.

use std::path::Path;

use tower_lsp_server::ls_types::*;

use crate::lsp::View;

pub fn diagnostic(view: &View, path: Option<&Path>) -> DocumentDiagnosticReportResult {
    let items = path
        .and_then(|path| view.diagnostics.get(path).cloned())
        .unwrap_or_default();
    DocumentDiagnosticReportResult::Report(DocumentDiagnosticReport::Full(
        RelatedFullDocumentDiagnosticReport {
            related_documents: None,
            full_document_diagnostic_report: FullDocumentDiagnosticReport {
                result_id: None,
                items,
            },
        },
    ))
}
