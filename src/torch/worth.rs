//! Which findings are worth a warning (issue 25, item 5): acting on a warning saves at least a
//! tenth of the peak or prevents an OOM; a finding whose fix saves less is information.
//!
//! The saving is the fix's replayed one where it was simulated (peak before − after), else its
//! stated estimate; a finding without a stated saving keeps its severity (nothing says it is
//! small), and so does every finding of a capture that ran out of memory (a fix there may be
//! what prevents the next OOM) or a finding whose replayed fix avoids the OOM. Growth that
//! repeats every step (PT002 retained graph, PT003 growing container, PT011 growth between
//! snapshots) and the allocator's OOM-retry path (PT013) are an OOM in the making: their
//! saving within one trace is not what acting prevents, so they keep theirs too.

use crate::findings::{Code, Finding, Severity, fix_saving};
use crate::torch::Analysis;

/// A warning saves at least this share of the peak (percent).
pub const WARNING_MIN_SHARE: u64 = 10;

/// The live bytes at the peak of `device` (every device when `None`): the largest set live in
/// the trace, or the live bytes at the dump.
fn peak(a: &Analysis, device: Option<i64>) -> u64 {
    let traced = a
        .timeline
        .devices
        .iter()
        .filter(|t| device.is_none_or(|d| t.device == d))
        .filter_map(|t| t.peak_set.as_ref().map(|p| p.bytes))
        .max()
        .unwrap_or(0);
    let dumped = a
        .totals
        .devices
        .iter()
        .filter(|t| device.is_none_or(|d| t.device == d))
        .map(|t| t.memory.allocated)
        .max()
        .unwrap_or(0);
    traced.max(dumped)
}

/// Downgrade to information every warning whose fix saves less than a tenth of the peak.
pub fn calibrate(a: &Analysis, findings: &mut [Finding]) {
    if a.totals.oom_events().next().is_some() {
        return;
    }
    let oom_in_the_making = [Code::PT002, Code::PT003, Code::PT011, Code::PT013];
    for f in findings
        .iter_mut()
        .filter(|f| f.severity == Severity::Warning && !oom_in_the_making.contains(&f.code))
    {
        if f.fixes
            .iter()
            .any(|x| x.simulated.as_ref().and_then(|s| s.oom_avoided) == Some(true))
        {
            continue;
        }
        let Some(saving) = f.fixes.iter().filter_map(fix_saving).max() else {
            continue;
        };
        let device = f
            .scope
            .as_deref()
            .and_then(|s| s.strip_prefix("device "))
            .and_then(|d| d.parse().ok());
        let peak = peak(a, device);
        if peak > 0 && saving.saturating_mul(100) < peak.saturating_mul(WARNING_MIN_SHARE) {
            f.severity = Severity::Information;
        }
    }
}
