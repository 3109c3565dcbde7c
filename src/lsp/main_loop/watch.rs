//! Which captures there are: the workspace scans, the watcher and the client's watched-file
//! registration, and the paths they report.

use std::path::PathBuf;

use tower_lsp_server::ls_types as lsp;

use super::{DEBOUNCE, Event, Owner};

impl Owner {
    /// Paths that may have been created, changed or deleted: captures are considered, the
    /// baseline file read again, edited Python files republished, the resolver rebuilt when
    /// Python files came or went.
    pub(super) async fn on_paths(&mut self, paths: Vec<PathBuf>) {
        let mut changed = false;
        let mut py_changed = false;
        let mut edited = Vec::new();
        for p in paths {
            if self.baseline_path.as_ref() == Some(&p) {
                changed |= self.load_baseline().await;
                continue;
            }
            if self.matcher.is_capture(&p) {
                changed |= self.consider(&p);
            } else if p.extension().is_some_and(|e| e == "py") {
                let exists = p.is_file();
                if exists != self.py_files.contains(&p) {
                    py_changed = true;
                }
                if self.bases.contains_key(&p) {
                    // Edited outside the editor: its findings follow the new text.
                    edited.push(p);
                }
            } else if p.is_dir() && self.matcher.is_scanned_dir(&p) {
                // A folder moved or copied in: the watcher may report only the folder.
                self.scan_dir(p);
            } else if !p.exists() {
                // A removed or renamed directory takes its captures with it (the watcher
                // may report only the directory).
                let inside: Vec<PathBuf> = self
                    .captures
                    .keys()
                    .filter(|k| k.starts_with(&p))
                    .cloned()
                    .collect();
                for c in inside {
                    changed |= self.consider(&c);
                }
            }
        }
        if py_changed {
            self.rebuild_resolver();
        }
        if changed {
            self.republish().await;
        } else {
            for p in edited {
                self.republish_file(&p).await;
            }
        }
    }

    /// Find every capture under the roots (off the async executor).
    pub(super) fn rescan(&self) {
        let matcher = self.matcher.clone();
        let tx = self.tx.clone();
        let budget = self.settings.scan;
        tokio::spawn(async move {
            let scan = tokio::task::spawn_blocking(move || matcher.scan_budgeted(&budget)).await;
            if let Ok(scan) = scan {
                if let Some(m) = scan.skipped_message(&budget) {
                    let _ = tx.send(Event::WatchError(m));
                }
                let _ = tx.send(Event::Paths(scan.chosen));
            }
        });
    }

    /// Look for captures under one directory of the workspace (off the async executor).
    pub(super) fn scan_dir(&self, dir: PathBuf) {
        let matcher = self.matcher.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let found = tokio::task::spawn_blocking(move || {
                crate::source::workspace::walk(&dir)
                    .flatten()
                    .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
                    .map(|e| e.into_path())
                    .filter(|p| matcher.is_capture(p))
                    .collect::<Vec<_>>()
            })
            .await;
            if let Ok(found) = found {
                if !found.is_empty() {
                    let _ = tx.send(Event::Paths(found));
                }
            }
        });
    }

    pub(super) async fn start_watching(&mut self) {
        if self.watcher.is_none() && !self.roots.is_empty() {
            let tx = self.tx.clone();
            let tx_err = self.tx.clone();
            match crate::lsp::workspace::watch(
                &self.roots,
                DEBOUNCE,
                move |paths| {
                    let _ = tx.send(Event::Paths(paths));
                },
                move |e| {
                    let _ = tx_err.send(Event::WatchError(e));
                },
            ) {
                Ok(w) => {
                    // Said once: what the watcher left out; the rest is watched.
                    if let Some(m) = w.skipped_message() {
                        self.log(lsp::MessageType::WARNING, m).await;
                    }
                    self.watcher = Some(w)
                }
                Err(e) => {
                    self.log(
                        lsp::MessageType::WARNING,
                        format!("cannot watch the workspace ({e}); captures update on memlsp.reanalyze or client file events"),
                    )
                    .await
                }
            }
        }
        if !self.registered && self.caps().watched_files_dynamic {
            self.registered = true;
            self.register_watchers(false);
        }
    }

    /// Ask the client to watch `captureGlobs` (again, when they changed: the old registration
    /// is withdrawn first).
    pub(super) fn register_watchers(&self, replace: bool) {
        const ID: &str = "memlsp-captures";
        const METHOD: &str = "workspace/didChangeWatchedFiles";
        let watchers = self
            .settings
            .capture_globs
            .iter()
            .map(|g| lsp::FileSystemWatcher {
                glob_pattern: lsp::GlobPattern::String(g.clone()),
                kind: None,
            })
            .collect();
        let opts = lsp::DidChangeWatchedFilesRegistrationOptions { watchers };
        let client = self.client.clone();
        if let Ok(options) = serde_json::to_value(opts) {
            tokio::spawn(async move {
                if replace {
                    let old = lsp::Unregistration {
                        id: ID.into(),
                        method: METHOD.into(),
                    };
                    let _ = client.unregister_capability(vec![old]).await;
                }
                let reg = lsp::Registration {
                    id: ID.into(),
                    method: METHOD.into(),
                    register_options: Some(options),
                };
                let _ = client.register_capability(vec![reg]).await;
            });
        }
    }
}
