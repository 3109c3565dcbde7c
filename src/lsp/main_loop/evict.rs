//! The owner's side of `lsp::cache`: dropping cached reports past `scan.maxReportBytes`, and
//! analysing a dropped one again when it is opened.

use std::path::Path;

use tower_lsp_server::ls_types as lsp;

use super::{Owner, Status};
use crate::lsp::cache::{self, Cached};

impl Owner {
    /// Drop the least recently analysed reports until the cache fits its budget; `fresh` (just
    /// analysed) and captures open in the editor stay. The first time says so in a window
    /// message, later times in the log.
    pub(super) async fn keep_cache_in_budget(&mut self, fresh: &Path) {
        let max = self.settings.max_report_bytes;
        let open: Vec<std::path::PathBuf> = match self.shared.docs.read() {
            Ok(docs) => docs.keys().cloned().collect(),
            Err(_) => Vec::new(),
        };
        let cached: Vec<Cached> = self
            .captures
            .iter()
            .filter(|(_, e)| e.result.is_some())
            .map(|(p, e)| Cached {
                path: p.clone(),
                bytes: e.bytes,
                used: e.used,
                keep: p == fresh || open.contains(p),
            })
            .collect();
        let dropped = cache::evictions(&cached, max);
        if dropped.is_empty() {
            return;
        }
        for c in &dropped {
            if let Some(e) = self.captures.get_mut(&c.path) {
                e.result = None;
                e.bytes = 0;
                e.status = Status::Evicted;
            }
        }
        let msg = cache::evicted_message(&dropped, max);
        if !self.evicted_shown {
            self.evicted_shown = true;
            self.client
                .show_message(lsp::MessageType::WARNING, format!("memlsp: {msg}"))
                .await;
        }
        self.log(lsp::MessageType::INFO, msg).await;
    }

    /// A capture opened in the editor whose report was dropped: analyse it again. Returns
    /// whether an analysis started.
    pub(super) fn reopen(&mut self, path: &Path) -> bool {
        let Some(e) = self.captures.get_mut(path) else {
            return false;
        };
        if !matches!(e.status, Status::Evicted) || e.running {
            return false;
        }
        e.status = Status::New;
        self.consider(path);
        true
    }
}
