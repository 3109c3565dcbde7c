//! The memory the server's cached reports may hold (`scan.maxReportBytes`).
//!
//! The start-up scan caps how many captures are analysed, but every capture that changes later
//! is analysed too, and each keeps its last good report (sites, stacks, findings, the torch or
//! XLA summary with its series) for the index. Past the budget the least recently analysed
//! reports are dropped — never the one just analysed, nor a capture open in the editor — and
//! analysed again when their capture changes or is opened.

use std::fmt::Write;
use std::path::PathBuf;

use crate::report::CaptureReport;

/// Default of `scan.maxReportBytes`: 512 MiB of cached reports.
pub const DEFAULT_MAX_REPORT_BYTES: u64 = 512 << 20;

/// Counts the bytes written to it and keeps none.
struct Count(u64);

impl Write for Count {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 = self.0.saturating_add(s.len() as u64);
        Ok(())
    }
}

/// Estimated heap bytes of a cached report: the length of its debug rendering (every site,
/// frame, finding, evidence line and series point once, numbers as their digits), counted
/// without being kept, plus the records' own sizes, and a fifth more. On ten real snapshots
/// (5 KB to 4 MB) this came to 1.0–1.2 × the heap the report holds (measured with a counting
/// allocator): a budget errs towards dropping early.
pub fn report_bytes(r: &CaptureReport) -> u64 {
    let mut c = Count(0);
    let _ = write!(c, "{r:?}");
    let records = std::mem::size_of::<CaptureReport>()
        + r.sites.len() * std::mem::size_of::<crate::report::Site>()
        + r.findings.len() * std::mem::size_of::<crate::findings::Finding>();
    let bytes = c.0.saturating_add(records as u64);
    bytes.saturating_add(bytes / 5)
}

/// One cached report as the budget sees it.
#[derive(Debug)]
pub struct Cached {
    pub path: PathBuf,
    pub bytes: u64,
    /// When it was analysed (a counter: higher is more recent).
    pub used: u64,
    /// Open in the editor or just analysed: never dropped.
    pub keep: bool,
}

/// The reports to drop so the rest fit in `max` bytes: least recently analysed first, kept
/// ones never (they may alone exceed the budget).
pub fn evictions(cached: &[Cached], max: u64) -> Vec<&Cached> {
    let mut total: u64 = cached.iter().map(|c| c.bytes).sum();
    let mut order: Vec<&Cached> = cached.iter().filter(|c| !c.keep).collect();
    order.sort_by(|a, b| a.used.cmp(&b.used).then_with(|| a.path.cmp(&b.path)));
    let mut out = Vec::new();
    for c in order {
        if total <= max {
            break;
        }
        total = total.saturating_sub(c.bytes);
        out.push(c);
    }
    out
}

/// One line saying what was dropped.
pub fn evicted_message(dropped: &[&Cached], max: u64) -> String {
    let bytes: u64 = dropped.iter().map(|c| c.bytes).sum();
    let mut names: Vec<String> = dropped
        .iter()
        .take(5)
        .map(|c| crate::report::capture_name(&c.path))
        .collect();
    if dropped.len() > 5 {
        names.push(format!("and {} more", dropped.len() - 5));
    }
    format!(
        "{} cached report(s) ({}) dropped to stay under {} of cached reports \
         (scan.maxReportBytes): {}; each is analysed again when its capture changes or is opened",
        dropped.len(),
        crate::findings::fmt_bytes(bytes),
        crate::findings::fmt_bytes(max),
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(path: &str, bytes: u64, used: u64, keep: bool) -> Cached {
        Cached {
            path: PathBuf::from(path),
            bytes,
            used,
            keep,
        }
    }

    #[test]
    fn the_least_recently_analysed_unkept_reports_go_first_until_the_rest_fit() {
        let cached = vec![
            c("/ws/old.pickle", 40, 1, false),
            c("/ws/open.pickle", 40, 0, true),
            c("/ws/mid.pickle", 40, 2, false),
            c("/ws/new.pickle", 40, 3, false),
            c("/ws/just.pickle", 40, 4, true),
        ];
        let gone: Vec<_> = evictions(&cached, 120)
            .iter()
            .map(|c| c.path.clone())
            .collect();
        assert_eq!(
            gone,
            vec![
                PathBuf::from("/ws/old.pickle"),
                PathBuf::from("/ws/mid.pickle")
            ]
        );
        assert!(evictions(&cached, 200).is_empty());
        // Kept reports stay even when they alone are over the budget.
        let gone = evictions(&cached, 1);
        assert_eq!(gone.len(), 3);
        assert!(gone.iter().all(|c| !c.keep));
        let msg = evicted_message(&gone, 1);
        assert!(
            msg.starts_with("3 cached report(s) (120 B) dropped"),
            "{msg}"
        );
        assert!(msg.contains("old.pickle, mid.pickle, new.pickle"), "{msg}");
    }

    #[test]
    fn a_report_costs_more_with_more_sites_and_findings() {
        let one = crate::lsp::index::tests::report("/ws/a.pickle", None);
        let mut many = one.clone();
        for _ in 0..100 {
            many.sites.push(one.sites[0].clone());
            many.findings.push(one.findings[0].clone());
        }
        let (a, b) = (report_bytes(&one), report_bytes(&many));
        assert!(a > 1000, "{a}");
        assert!(b > 50 * a, "{a} {b}");
    }
}
