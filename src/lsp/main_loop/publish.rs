//! Publishing: the index rebuilt from every capture's last good result, diagnostics sent where
//! they changed, the published `View` the request handlers read, and the line maps that move
//! findings with the user's edits.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use tower_lsp_server::ls_types as lsp;

use super::{Base, Owner};
use crate::lsp::View;
use crate::lsp::index::{CaptureResult, FileEntry, Index};
use crate::lsp::to_proto;
use crate::source::anchor::LineMap;
use crate::source::locate::Locator;

impl Owner {
    pub(super) fn store_view(&self, index: Option<Index>) {
        let caps = self.caps();
        if let Ok(mut view) = self.shared.view.write() {
            let index = match index {
                Some(i) => Arc::new(i),
                None => view.index.clone(),
            };
            *view = Arc::new(View {
                index,
                diagnostics: self.published.clone(),
                inlay_hints: self.settings.inlay_hints,
                inlay_min_percent: self.settings.inlay_min_percent,
                inlay_min_bytes: self.settings.inlay_min_bytes,
                frames: self.settings.options().analysis.frames,
                encoding: caps.encoding,
                moved: self.moved.clone(),
                resolver: self.resolver.clone(),
                options: self.options(),
                code_lens: self.settings.code_lens,
                captures: self.newest_first(),
            });
        }
    }

    /// Rebuild the index from every capture's last good result and publish what changed.
    pub(super) async fn republish(&mut self) {
        let Some(resolver) = self.resolver.clone() else {
            return; // published once the workspace index is ready
        };
        let results: Vec<Arc<CaptureResult>> = self
            .captures
            .values()
            .filter_map(|e| e.result.clone())
            .collect();
        let locator = Locator::with_resolver(resolver, self.settings.options().analysis.frames);
        let index = Index::build_with(&results, &locator, self.baseline.as_deref());

        if index.unresolved != self.logged_unresolved && !index.unresolved.is_empty() {
            let list: Vec<String> = index
                .unresolved
                .iter()
                .map(|(f, n)| format!("{f} ({n})"))
                .collect();
            self.log(
                lsp::MessageType::INFO,
                format!(
                    "{} recorded file(s) not found in the workspace (set memlsp.pathMappings): {}",
                    index.unresolved.len(),
                    list.join(", ")
                ),
            )
            .await;
        }
        self.logged_unresolved = index.unresolved.clone();
        self.rebase(&index);

        let mut next: HashMap<PathBuf, Vec<lsp::Diagnostic>> = HashMap::new();
        for (file, fe) in &index.files {
            let diags = self.file_diagnostics(file, fe, self.text_of(file).as_deref());
            if !diags.is_empty() {
                next.insert(file.clone(), diags);
            }
        }
        let mut to_send = Vec::new();
        for (file, diags) in &next {
            if self.published.get(file) != Some(diags) {
                to_send.push((file.clone(), diags.clone()));
            }
        }
        for file in self.published.keys() {
            if !next.contains_key(file) {
                to_send.push((file.clone(), Vec::new()));
            }
        }
        self.published = next;
        self.store_view(Some(index));
        for (file, diags) in to_send {
            if let Some(uri) = to_proto::uri(&file) {
                self.client.publish_diagnostics(uri, diags, None).await;
            }
        }
        self.refresh_client();
    }

    /// Ask the client to request inlay hints and code lenses again (they moved or changed).
    pub(super) fn refresh_client(&self) {
        let caps = self.caps();
        let client = self.client.clone();
        tokio::spawn(async move {
            if caps.inlay_refresh {
                let _ = client.inlay_hint_refresh().await;
            }
            if caps.code_lens_refresh {
                let _ = client.code_lens_refresh().await;
            }
        });
    }

    /// After a new index: keep each file's base while the captures placing findings in it are
    /// the same ones, take the file from disk otherwise; then where every line is now.
    pub(super) fn rebase(&mut self, index: &Index) {
        let mtimes: HashMap<&Path, SystemTime> = self
            .captures
            .iter()
            .filter_map(|(p, e)| Some((p.as_path(), e.result.as_ref()?.mtime)))
            .collect();
        let mut bases = HashMap::new();
        for (file, fe) in &index.files {
            let mut sources: Vec<(PathBuf, SystemTime)> = fe
                .captures()
                .map(|c| {
                    let t = mtimes.get(c.as_path()).copied();
                    (c.clone(), t.unwrap_or(SystemTime::UNIX_EPOCH))
                })
                .collect();
            sources.sort();
            sources.dedup();
            let base = match self.bases.remove(file) {
                Some(b) if b.sources == sources => b,
                _ => {
                    let text = std::fs::read_to_string(file)
                        .ok()
                        .or_else(|| self.text_of(file))
                        .unwrap_or_default();
                    Base {
                        sources,
                        text: text.into(),
                    }
                }
            };
            bases.insert(file.clone(), base);
        }
        self.bases = bases;
        self.moved.clear();
        let files: Vec<PathBuf> = self.bases.keys().cloned().collect();
        for f in files {
            let now = self.text_of(&f).unwrap_or_default();
            self.remap(&f, &now);
        }
    }

    /// Where the indexed lines of `file` are in its current text `now` (buffer or disk).
    pub(super) fn remap(&mut self, file: &Path, now: &str) {
        let Some(base) = self.bases.get(file) else {
            self.moved.remove(file);
            return;
        };
        let map = LineMap::between(&base.text, now);
        if map.is_identity() {
            self.moved.remove(file);
        } else {
            self.moved.insert(file.to_path_buf(), Arc::new(map));
        }
    }

    /// The diagnostics of one workspace file against its current text (buffer or disk). A
    /// finding whose fix is already in the text (the user applied the quick fix) is left out:
    /// the capture predates the edit.
    pub(super) fn file_diagnostics(
        &self,
        file: &Path,
        fe: &FileEntry,
        text: Option<&str>,
    ) -> Vec<lsp::Diagnostic> {
        let enc = self.caps().encoding;
        // One scan of the text for every finding's "is the fix already there" check (a scanner
        // panic costs the check, not the server).
        let src = text
            .and_then(|t| std::panic::catch_unwind(|| crate::source::python::Source::new(t)).ok());
        let file_str = file.to_string_lossy();
        let moved = self.moved.get(file);
        let mut diags = Vec::new();
        for (line, le) in &fe.lines {
            // Where the line's text is now; gone (edited or deleted): withdrawn.
            let Some(now) = moved.map_or(Some(*line), |m| m.new_line(*line)) else {
                continue;
            };
            let lt = text.and_then(|t| to_proto::line_of(t, now.saturating_sub(1)));
            for lf in &le.findings {
                let fixed = src
                    .as_ref()
                    .is_some_and(|s| fix_applied(&lf.finding, &file_str, s, now));
                if !fixed {
                    diags.push(to_proto::diagnostic(lf, now, lt, enc));
                }
            }
        }
        diags.sort_by_key(|d| d.range.start.line);
        diags
    }

    /// After an edit (or open/close, or a change on disk) of `file`: its findings follow the
    /// text; publish its diagnostics again if they changed.
    pub(super) async fn republish_file(&mut self, file: &Path) {
        let view = self.shared.view();
        let Some(fe) = view.index.files.get(file) else {
            return;
        };
        let before = self.moved.get(file).cloned();
        let text = self.text_of(file);
        self.remap(file, text.as_deref().unwrap_or_default());
        let lines_moved = before != self.moved.get(file).cloned();
        let diags = self.file_diagnostics(file, fe, text.as_deref());
        let old = self.published.get(file).cloned().unwrap_or_default();
        if diags == old && !lines_moved {
            return;
        }
        if diags.is_empty() {
            self.published.remove(file);
        } else {
            self.published.insert(file.to_path_buf(), diags.clone());
        }
        self.store_view(None);
        if diags != old {
            if let Some(uri) = to_proto::uri(file) {
                self.client.publish_diagnostics(uri, diags, None).await;
            }
        }
        if lines_moved {
            self.refresh_client();
        }
    }

    pub(super) fn text_of(&self, path: &Path) -> Option<String> {
        if let Ok(docs) = self.shared.docs.read() {
            if let Some(d) = docs.get(path) {
                return Some(d.text.clone());
            }
        }
        std::fs::read_to_string(path).ok()
    }

    /// Captures with a good result, newest first.
    pub(super) fn newest_first(&self) -> Vec<PathBuf> {
        let mut good: Vec<(SystemTime, &PathBuf)> = self
            .captures
            .iter()
            .filter_map(|(p, e)| Some((e.result.as_ref()?.mtime, p)))
            .collect();
        good.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        good.into_iter().map(|(_, p)| p.clone()).collect()
    }
}

/// True when one of the finding's edit fixes reports that the line already has it (`loss` is
/// already `loss.detach()`, `jax.jit` already donates, …).
pub(super) fn fix_applied(
    f: &crate::findings::Finding,
    file: &str,
    src: &crate::source::python::Source,
    line: u32,
) -> bool {
    f.fixes.iter().any(|fix| {
        !matches!(fix.kind, crate::findings::FixKind::Advice)
            && std::panic::catch_unwind(AssertUnwindSafe(|| {
                crate::source::edits::edits_in(&fix.kind, file, src, line)
            }))
            .is_ok_and(|r| r.is_err_and(|why| why.already_applied()))
    })
}
