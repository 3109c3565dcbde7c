//! Work-done progress bars over jobs on workers (an analysis, the timeline page).

use std::time::Duration;

use tower_lsp_server::Client;
use tower_lsp_server::ls_types as lsp;

/// Jobs shorter than this show no progress.
const PROGRESS_AFTER: Duration = Duration::from_millis(200);
/// How often a running analysis's progress bar is updated.
const PROGRESS_REDRAW: Duration = Duration::from_millis(250);

/// The percentage and message of a capture's progress bar: the share of its bytes read, then
/// "analysing" at 100 once all are ([`crate::options::percent_read`]); "simulating" (at 100)
/// follows once what the capture records is published.
fn read_share(read: u64, total: u64) -> (u32, &'static str) {
    match crate::options::percent_read(read, total) {
        Some(p) => (p as u32, "reading"),
        None => (100, "analysing"),
    }
}

/// A work-done progress bar over a job on a worker, shown once the job has run for
/// [`PROGRESS_AFTER`] where the client takes them: with the share of the file read (`read`,
/// from [`crate::analyze::reading_progress`]), else without a percentage.
pub(crate) struct Bar<'c> {
    pub client: &'c Client,
    /// The client takes work-done progress.
    pub shown: bool,
    pub token: lsp::ProgressToken,
    pub title: String,
    pub read: Option<(crate::options::Progress, u64)>,
    /// Raised once what the capture records was published and the simulations run: the bar
    /// then says "simulating" (at 100 %).
    pub simulating: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Bar<'_> {
    /// Wait for `job`, with the bar.
    pub(crate) async fn wait<T>(
        self,
        mut job: tokio::task::JoinHandle<T>,
    ) -> Result<T, tokio::task::JoinError> {
        tokio::select! {
            r = &mut job => return r,
            _ = tokio::time::sleep(PROGRESS_AFTER) => {}
        }
        if !self.shown
            || self
                .client
                .create_work_done_progress(self.token.clone())
                .await
                .is_err()
        {
            return job.await;
        }
        let Some((read, total)) = self.read else {
            let bar = self.client.progress(self.token, self.title).begin().await;
            let r = job.await;
            bar.finish().await;
            return r;
        };
        let bar = self
            .client
            .progress(self.token, self.title)
            .with_percentage(0)
            .with_message("reading")
            .begin()
            .await;
        // The share of the file read, then the analysis at 100 %.
        let mut last = (0, "reading");
        let now = || {
            if self.simulating.load(std::sync::atomic::Ordering::Relaxed) {
                (100, "simulating")
            } else {
                read_share(read.read(), total)
            }
        };
        #[cfg(feature = "test-hooks")]
        let redraw = super::test_hooks::progress_redraw().unwrap_or(PROGRESS_REDRAW);
        #[cfg(not(feature = "test-hooks"))]
        let redraw = PROGRESS_REDRAW;
        let mut tick = tokio::time::interval(redraw);
        let r = loop {
            tokio::select! {
                r = &mut job => break r,
                _ = tick.tick() => {
                    let now = now();
                    if now != last {
                        bar.report_with_message(now.1, now.0).await;
                        last = now;
                    }
                }
            }
        };
        // A job that ends between two redraws: its last state still shows before the bar ends
        // (else a bar could end at "reading 95 %" though the whole file was read).
        let end = now();
        if end != last {
            bar.report_with_message(end.1, end.0).await;
        }
        bar.finish().await;
        r
    }
}
