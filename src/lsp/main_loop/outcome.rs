//! What an analysis's end does to its capture's entry: a good result is stored, a cancelled
//! or rewritten read looks again, a failure on a fresh file is looked at again after `SETTLE`
//! before it is reported.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::mpsc;
use tower_lsp_server::ls_types as lsp;

use super::{Event, FileKey, Outcome, Owner, SETTLE, Status};
use crate::error::ErrorKind;
use crate::lsp::cache;
use crate::lsp::index::CaptureResult;
use crate::report::CaptureReport;

impl Owner {
    pub(super) async fn finish(
        &mut self,
        path: PathBuf,
        key: FileKey,
        after: Option<FileKey>,
        outcome: Outcome,
    ) {
        let Some(entry) = self.captures.get_mut(&path) else {
            return; // deleted or no longer matching while it ran
        };
        entry.running = false;
        let stable = after == Some(key);
        let mut changed = false;
        let mut report_failure: Option<String> = None;
        match outcome {
            Outcome::Reports(reports) if stable => {
                entry.status = Status::Good;
                self.stored += 1;
                entry.used = self.stored;
                entry.bytes = reports.iter().map(cache::report_bytes).sum();
                entry.result = Some(Arc::new(CaptureResult {
                    path: path.clone(),
                    mtime: key.mtime,
                    reports,
                }));
                changed = true;
            }
            Outcome::Error(e) if e.kind == ErrorKind::Cancelled => {
                // Stopped because the file changed again (`consider` marked it dirty).
                entry.status = Status::New;
                entry.dirty = true;
                self.client
                    .log_message(
                        lsp::MessageType::LOG,
                        format!(
                            "analysis of {} cancelled: the capture changed while it was read",
                            path.display()
                        ),
                    )
                    .await;
            }
            Outcome::Rewritten => {
                entry.status = Status::Incomplete;
                entry.dirty = true;
                eprintln!(
                    "memlsp: {} was rewritten while being read; reading it again",
                    path.display()
                );
                self.client
                    .log_message(
                        lsp::MessageType::INFO,
                        format!(
                            "{} was rewritten while being read; reading it again",
                            path.display()
                        ),
                    )
                    .await;
            }
            Outcome::Reports(_) | Outcome::Unstable => {
                // Changed while being read: look again now (the new content has a new key).
                entry.status = Status::Incomplete;
                entry.dirty = true;
            }
            Outcome::Error(e) if e.is_incomplete() || !stable => {
                entry.status = Status::Incomplete;
                eprintln!(
                    "memlsp: {} is still being written; retrying on its next change",
                    path.display()
                );
                schedule_recheck(&self.tx, &path);
            }
            Outcome::Error(e) => {
                let fresh = SystemTime::now()
                    .duration_since(key.mtime)
                    .is_ok_and(|age| age < SETTLE);
                if fresh && !matches!(entry.status, Status::Provisional(_)) {
                    entry.status = Status::Provisional(e.to_string());
                    schedule_recheck(&self.tx, &path);
                } else {
                    entry.status = Status::Failed;
                    changed = entry.result.take().is_some();
                    report_failure = Some(e.to_string());
                }
            }
            Outcome::Panic(msg) => {
                entry.status = Status::Failed;
                changed = entry.result.take().is_some();
                report_failure = Some(format!(
                    "{}: the analysis panicked ({msg}); please report this with the file",
                    path.display()
                ));
            }
        }
        let again = std::mem::take(&mut entry.dirty);
        if let Some(msg) = report_failure {
            self.report_failure(msg).await;
        }
        if again {
            changed |= self.consider(&path);
        }
        if changed {
            self.keep_cache_in_budget(&path).await;
            self.republish().await;
        }
    }

    /// The first publish of a capture whose analysis still runs its simulations: what the
    /// capture records, shown (diagnostics, hover, inlay) until the analysis's end refines it.
    pub(super) async fn recorded(&mut self, path: PathBuf, key: FileKey, report: CaptureReport) {
        let Some(entry) = self.captures.get_mut(&path) else {
            return;
        };
        if !entry.running || entry.dirty || entry.key != Some(key) {
            return; // changed since: the next analysis publishes
        }
        self.stored += 1;
        entry.used = self.stored;
        entry.bytes = cache::report_bytes(&report);
        entry.result = Some(Arc::new(CaptureResult {
            path: path.clone(),
            mtime: key.mtime,
            reports: vec![report],
        }));
        self.keep_cache_in_budget(&path).await;
        self.republish().await;
    }

    /// A second look at a file whose last analysis was inconclusive.
    pub(super) async fn recheck(&mut self, path: &Path) {
        let Some(entry) = self.captures.get_mut(path) else {
            return;
        };
        if entry.running {
            return;
        }
        let now = FileKey::of(path);
        if now != entry.key {
            let changed = self.consider(path);
            if changed {
                self.republish().await;
            }
            return;
        }
        // Unchanged for `SETTLE`: a provisional failure is real now. An incomplete file stays
        // quiet until it changes (a dump that stopped half-way is not the user's error yet).
        if let Status::Provisional(msg) = &entry.status {
            let msg = msg.clone();
            entry.status = Status::Failed;
            let changed = entry.result.take().is_some();
            self.report_failure(msg).await;
            if changed {
                self.republish().await;
            }
        }
    }

    pub(super) async fn report_failure(&self, msg: String) {
        self.log(
            lsp::MessageType::ERROR,
            format!("cannot read capture: {msg}"),
        )
        .await;
        self.client
            .show_message(lsp::MessageType::WARNING, format!("memlsp: {msg}"))
            .await;
    }
}

pub(super) fn schedule_recheck(tx: &mpsc::UnboundedSender<Event>, path: &Path) {
    let tx = tx.clone();
    let p = path.to_path_buf();
    tokio::spawn(async move {
        tokio::time::sleep(SETTLE).await;
        let _ = tx.send(Event::Recheck(p));
    });
}
