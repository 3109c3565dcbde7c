//! Named memory patterns (PT001–PT010), each fired only on evidence found in the snapshot.
//!
//! Every finding carries the evidence that supports it, each line labelled measured (counted from
//! blocks or trace entries), read (a field of the file) or inferred (a role guess, a cause, an
//! estimated saving). Expected retention is said to be expected.

use crate::findings::{Code, Evidence, Finding, Fix, FixKind, Label, Severity, fmt_bytes};
use crate::site::SiteRole;
use crate::torch::Analysis;
use crate::torch::fragmentation::Verdict;
use crate::torch::model::{BlockState, Snapshot, StackId};
use crate::torch::release::{Cause, GraphSeen};
use crate::torch::sites::percent;
use crate::torch::stacks::{Role, SiteKey, culprit, site_string};
use crate::torch::timeline::{DeviceTimeline, SCALAR_BYTES, SiteTrace, WINDOWS};

/// Allocations needed in a device trace before "repeats every step" can be judged.
const MIN_ALLOCS_FOR_STEPS: u64 = 24;

fn pct_text(p: Option<f64>) -> String {
    p.map(|p| format!("{p:.1}%")).unwrap_or_else(|| "–".into())
}

fn where_(snap: &Snapshot, key: SiteKey) -> String {
    match key.and_then(|k| snap.frames.get(k as usize)) {
        Some(f) => format!("{}:{} ({})", f.filename, f.line, f.name),
        None => "an allocation without a Python stack".into(),
    }
}

/// Run every detector.
pub fn detect(snap: &Snapshot, a: &Analysis) -> Vec<Finding> {
    let mut out = Vec::new();
    oom_findings(snap, a, &mut out);
    for t in &a.timeline.devices {
        retained_per_step(snap, a, t, &mut out);
        batched_frees(snap, a, t, &mut out);
    }
    pending_frees(snap, a, &mut out);
    // The optimizer's traces, read by PT004 and PT020 (one walk of the trace each device).
    let optim = crate::torch::optim_state::compute_all(snap, a);
    crate::torch::optim_state::detect(snap, a, &optim, &mut out);
    activation_pressure(snap, a, &mut out);
    crate::torch::no_backward::detect(snap, a, &mut out);
    ddp_replication(snap, a, &mut out);
    top_site(snap, a, &mut out);
    crate::torch::near_oom::detect(snap, a, &mut out);
    crate::torch::device_skew::detect(snap, a, &mut out);
    crate::torch::autocast_cache::detect(snap, a, &mut out);
    crate::torch::capture_limits::detect(snap, a, &mut out);
    crate::torch::attention::detect(snap, a, &mut out);
    crate::torch::logits::detect(snap, a, &mut out);
    crate::torch::model_states::detect(snap, a, &optim, &mut out);
    out
}

fn any_oom(a: &Analysis) -> bool {
    a.totals.oom_events().next().is_some()
}

mod activations;
mod ddp;
#[cfg(test)]
mod detector_tests;
mod frees;
mod oom;
mod retained;
mod top_site;

use activations::activation_pressure;
use ddp::ddp_replication;
use frees::{batched_frees, pending_frees};
use oom::oom_findings;
use retained::retained_per_step;
use top_site::top_site;
