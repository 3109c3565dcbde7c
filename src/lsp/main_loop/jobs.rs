//! Analysis jobs: a capture whose content is new starts one on a blocking worker (after two
//! size polls); new content while one runs cancels it (`options::Cancel`) and looks again when
//! it ends. A panic inside an analysis becomes an `Outcome`.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tower_lsp_server::ls_types as lsp;

use super::{Entry, Event, FileKey, Outcome, Owner, STABLE_POLL, Status};
use crate::analyze;
use crate::error::CaptureError;
use crate::lsp::index::capture_name;
use crate::lsp::progress::Bar;
use crate::options::{Cancel, Options};
use crate::report::CaptureReport;

impl Owner {
    /// Look at one capture path; start an analysis when its content is new. Returns true when a
    /// published result went away (deleted file).
    pub(super) fn consider(&mut self, path: &Path) -> bool {
        let Some(key) = FileKey::of(path) else {
            // Gone (or a directory): stop reading it and withdraw what it said.
            return self.captures.remove(path).is_some_and(|e| {
                e.cancel.cancel();
                e.result.is_some()
            });
        };
        let entry = self.captures.entry(path.to_path_buf()).or_insert(Entry {
            key: None,
            running: false,
            dirty: false,
            status: Status::New,
            result: None,
            cancel: Cancel::default(),
            bytes: 0,
            used: 0,
        });
        if entry.running {
            // New content while the old is being read: stop reading the old one (the answer
            // would be discarded) and look again when the worker gives up.
            if entry.key != Some(key) {
                entry.cancel.cancel();
            }
            entry.dirty = true;
            return false;
        }
        if entry.key == Some(key) && !matches!(entry.status, Status::New) {
            return false; // cached: same path, mtime and size
        }
        entry.key = Some(key);
        entry.running = true;
        entry.cancel = Cancel::new();
        let cancel = entry.cancel.clone();
        self.spawn_analysis(path.to_path_buf(), key, cancel);
        false
    }

    /// The options every analysis of this server runs with.
    pub(super) fn options(&self) -> Options {
        let mut opts: Options = self.settings.options();
        opts.locate.workspace = self.roots.clone();
        opts.locate.path_mappings = self.settings.mappings(&self.roots);
        opts
    }

    pub(super) fn spawn_analysis(&mut self, path: PathBuf, key: FileKey, cancel: Cancel) {
        let mut opts = self.options();
        opts.decode.cancel = cancel;
        let read = analyze::reading_progress(&path);
        if let Some((progress, _)) = &read {
            opts.decode.progress = progress.clone();
        }
        let tx = self.tx.clone();
        let workers = self.workers.clone();
        let client = self.client.clone();
        let progress = self.caps().work_done_progress;
        let simulating = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.progress_seq += 1;
        let token = lsp::ProgressToken::String(format!("memlsp/analyse/{}", self.progress_seq));
        tokio::spawn(async move {
            let _permit = workers.acquire_owned().await;
            // Two polls of the size: a file still growing is not read yet (the engines map files
            // into memory; reading one mid-write only wastes work).
            tokio::time::sleep(STABLE_POLL).await;
            let polled = FileKey::of(&path);
            if polled != Some(key) {
                let _ = tx.send(Event::Done {
                    path,
                    key,
                    after: polled,
                    outcome: Outcome::Unstable,
                });
                return;
            }
            let p = path.clone();
            let (early, sim) = (tx.clone(), simulating.clone());
            let job = tokio::task::spawn_blocking(move || {
                #[cfg(feature = "test-hooks")]
                crate::lsp::test_hooks::hold_on(&p, &opts.decode.cancel);
                let faults = crate::sigbus::rescued();
                // What the capture records is published before the simulations run.
                let mut recorded = |report: CaptureReport| {
                    sim.store(true, std::sync::atomic::Ordering::Relaxed);
                    let _ = early.send(Event::Recorded {
                        path: p.clone(),
                        key,
                        report: Box::new(report),
                    });
                };
                let outcome = contained(|| {
                    #[cfg(feature = "test-hooks")]
                    crate::lsp::test_hooks::panic_on(&p);
                    analyze::analyze_file_staged(&p, &opts, &mut recorded)
                });
                // The mapping lost its file under the reader: whatever was decoded is void.
                let outcome = if crate::sigbus::rescued() != faults {
                    Outcome::Rewritten
                } else {
                    outcome
                };
                (outcome, FileKey::of(&p))
            });
            let title = format!("memlsp: analysing {}", capture_name(&path));
            let bar = Bar {
                client: &client,
                shown: progress,
                token,
                title,
                read,
                simulating,
            };
            let joined = bar.wait(job).await;
            let (outcome, after) = match joined {
                Ok(x) => x,
                Err(e) => (Outcome::Panic(e.to_string()), None),
            };
            let _ = tx.send(Event::Done {
                path,
                key,
                after,
                outcome,
            });
        });
    }
}

/// Run one analysis; a panic inside it becomes an `Outcome` instead of unwinding further.
pub(super) fn contained(analyse: impl FnOnce() -> Result<CaptureReport, CaptureError>) -> Outcome {
    match std::panic::catch_unwind(AssertUnwindSafe(analyse)) {
        Ok(Ok(report)) => Outcome::Reports(vec![report]),
        Ok(Err(e)) => Outcome::Error(e),
        Err(panic) => Outcome::Panic(panic_message(panic.as_ref())),
    }
}

pub(super) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_analysis_becomes_an_outcome_with_its_message() {
        let out = contained(|| panic!("index out of bounds: the len is 3"));
        match out {
            Outcome::Panic(msg) => assert_eq!(msg, "index out of bounds: the len is 3"),
            _ => panic!("the panic escaped as a result"),
        }
        let out = contained(|| {
            let snap = crate::torch::model::Snapshot::default();
            let a = crate::torch::analyse(&snap, &Default::default());
            Ok(crate::report::CaptureReport {
                path: PathBuf::from("x.pickle"),
                engine: crate::report::Engine::Torch(Box::new(crate::torch::summary::summarize(
                    &snap, &a, 10,
                ))),
                sites: Vec::new(),
                findings: Vec::new(),
                shown_path: None,
            })
        });
        assert!(matches!(out, Outcome::Reports(r) if r.len() == 1));
    }
}
