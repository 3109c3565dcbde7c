//! PT015: a capture that cannot say where its live memory came from.
//!
//! When most live memory has no stack (allocated before `_record_memory_history` started, or
//! recorded without stacks) and no site with a stack holds even 1 % of it — or the file has no
//! trace history at all — the top-site hint would name a line that does not matter. One
//! information finding says instead what the capture cannot show and how to record one that can.

use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};
use crate::torch::Analysis;
use crate::torch::model::Snapshot;
use crate::torch::sites::percent;

/// A stacked site below this share of live memory is too small to be the answer (per mille).
const TINY_PER_MILLE: u64 = 10;

/// Whether the capture cannot attribute its live memory.
pub fn cannot_attribute(a: &Analysis) -> bool {
    let live = a.totals.overall.allocated;
    let unattributed = no_stack_bytes(a);
    if live == 0 || unattributed.saturating_mul(2) < live {
        return false;
    }
    top_is_tiny(a) || !has_history(a)
}

/// Mostly stackless live memory, and no site with a stack holds 1 % of it: a top-site hint
/// would point at a line that does not matter.
pub fn top_is_tiny(a: &Analysis) -> bool {
    let live = a.totals.overall.allocated;
    if live == 0 || no_stack_bytes(a).saturating_mul(2) < live {
        return false;
    }
    let top = a
        .sites
        .sites
        .iter()
        .find(|s| s.key.is_some())
        .map_or(0, |s| s.bytes);
    top.saturating_mul(1000) < live.saturating_mul(TINY_PER_MILLE)
}

fn no_stack_bytes(a: &Analysis) -> u64 {
    a.sites
        .sites
        .iter()
        .filter(|s| s.key.is_none())
        .map(|s| s.bytes)
        .sum()
}

fn has_history(a: &Analysis) -> bool {
    a.timeline.devices.iter().any(|t| t.entries > 1)
}

/// PT015, where [`cannot_attribute`] holds.
pub fn detect(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    if !cannot_attribute(a) {
        return;
    }
    let live = a.totals.overall.allocated;
    let unattributed = no_stack_bytes(a);
    let history = has_history(a);
    let entries: u64 = a.timeline.devices.iter().map(|t| t.entries).sum();
    let mut f = Finding::new(
        Code::PT015,
        Severity::Information,
        format!(
            "This capture cannot say where its live memory came from: {} of {} ({}) has no stack{}.",
            fmt_bytes(unattributed),
            fmt_bytes(live),
            pct(percent(unattributed, live)),
            if history {
                ""
            } else {
                ", and the file has no allocation history"
            },
        ),
    )
    .bytes(unattributed, percent(unattributed, live), Label::Measured)
    .evidence(Evidence::measured(format!(
        "{} of the live bytes are in blocks with no Python frame (merged as <no stack>)",
        fmt_bytes(unattributed)
    )));
    let top = a.sites.sites.iter().find(|s| s.key.is_some());
    f = f.evidence(Evidence::measured(match top {
        Some(s) => format!(
            "the largest site with a stack holds {} ({} of live memory): {}",
            fmt_bytes(s.bytes),
            pct(percent(s.bytes, live)),
            s.site
        ),
        None => "no live block has a Python stack".to_string(),
    }));
    f = f.evidence(Evidence::read(if history {
        format!("device_traces: {entries} entries (what happened during the window is shown)")
    } else if snap.device_traces.is_none() {
        "no device_traces in the file: no peak, no frees, no OOM can be read".to_string()
    } else {
        format!("device_traces: {entries} entries: no peak, no frees, no OOM can be read")
    }));
    f = f
        .evidence(Evidence::inferred(
            "blocks without a stack were allocated before memory history was recorded (typically \
             the model's weights) or recorded with stacks off",
        ))
        .fix(Fix::advice(
            "Record a capture that can: call `torch.cuda.memory._record_memory_history(\
             max_entries=100000, stacks=\"all\")` before the model is built, run a step or two, \
             then `torch.cuda.memory._dump_snapshot(\"snapshot.pickle\")` (the editor's \"Record a \
             memory capture here\" action on the training loop writes this)",
        ));
    out.push(f);
}

fn pct(p: Option<f64>) -> String {
    p.map(|p| format!("{p:.1}%")).unwrap_or_else(|| "–".into())
}
