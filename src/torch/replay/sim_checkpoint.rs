//! The fixes of PT005 as the user writes them, turned into changes of the recorded trace for
//! the allocator replay (`whatif`).
//!
//! - **Per-layer checkpointing** (`checkpoint(layer, x)` around each call of the repeated layer
//!   function, `torch::layer_calls`): in the forward a call keeps only its inputs — the previous
//!   call's output, the last allocation of a call that is still live at the peak — and the
//!   tensors it saved for backward are dropped when the call returns (the entry after its last
//!   allocation). In the backward, all of a call's tensors that the backward frees are made
//!   again at once, just before the first of them is freed (one layer recomputed at a time),
//!   then freed as recorded. Tensors the trace never shows a backward free for (the graph
//!   dropped at an OOM) are just dropped. The call holding the peak, and everything outside the
//!   calls (embeddings, logits, loss), is kept as recorded. So the replayed peak is weights +
//!   saved layer inputs + one layer's activations + the backward's working set: what the fix
//!   reaches, or above it (a call's temporaries freed inside it are not touched).
//! - **`inference_mode`** for a forward with no backward: a tensor the graph held is freed when
//!   the layer call that made it returns — at the latest; inference_mode frees it at its last
//!   use, so the replayed peak is at or above what the fix reaches.

use rustc_hash::FxHashMap;

use crate::findings::Finding;
use crate::torch::Analysis;
use crate::torch::layer_calls::Layers;
use crate::torch::model::{Action, Snapshot, TraceEntry};
use crate::torch::release::Cause;
use crate::torch::replay::Change;
use crate::torch::stacks::Role;

/// How an estimate of what a PT005 fix saves is worded: a bound (inferred), replaced by the
/// replayed saving when the fix is simulated ([`one_after_number`]).
pub const SAVES_AT_MOST: &str = "saves at most";

/// After a PT005 fix was replayed: the replay is its saving (peak before − after, read with
/// `findings::fix_saving`), so the estimate goes — from the fix (a presenter would show it
/// labelled inferred beside the simulated figure) and, as a bound, from its title and the
/// evidence: one after-number per finding, with its own label.
pub fn one_after_number(f: &mut Finding) {
    for fix in f.fixes.iter_mut().filter(|x| x.simulated.is_some()) {
        fix.saving_bytes = None;
        fix.saving_range = None;
        if let Some((title, _)) = fix.title.split_once(&format!(" — {SAVES_AT_MOST} ")) {
            fix.title = title.to_string();
        }
    }
    if f.fixes.iter().all(|x| x.simulated.is_none()) {
        return;
    }
    // The replay is on the fix (every presenter shows it there); the bound leaves the line.
    for e in &mut f.evidence {
        if let Some((head, _)) = e.text.split_once(&format!(": {SAVES_AT_MOST} ")) {
            e.text = head.to_string();
        }
    }
}

/// Which fix to replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fix {
    Checkpoint,
    InferenceMode,
}

/// Every allocation of the trace (its entry) and its first free (`free_requested`, else
/// `free_completed`), in order.
fn frees(trace: &[TraceEntry]) -> Vec<(usize, Option<usize>)> {
    let mut open: FxHashMap<u64, usize> = FxHashMap::default();
    let mut out: Vec<(usize, Option<usize>)> = Vec::new();
    for (j, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                open.insert(e.addr, out.len());
                out.push((j, None));
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(k) = open.remove(&e.addr) {
                    out[k].1 = Some(j);
                }
            }
            _ => {}
        }
    }
    out
}

/// The changes that replay `fix` on the trace of the forward whose set live before entry
/// `index` is `layers.live`; empty when no layer call is complete before the peak.
pub fn changes(
    snap: &Snapshot,
    a: &Analysis,
    trace: &[TraceEntry],
    index: usize,
    layers: &Layers,
    fix: Fix,
) -> Vec<Change> {
    let all = frees(trace);
    let cause = |j: usize| a.releases.cause(trace[j].stack());
    // Freed by the backward (or, without native frames on the stacks, freed at all).
    let backward = |free: Option<usize>| {
        free.is_some_and(|j| {
            !a.releases.native_frames
                || matches!(cause(j), Cause::GraphInBackward | Cause::Backward)
        })
    };
    // Held by the graph: what checkpointing / inference_mode stop holding. A tensor a user
    // line frees (or nothing frees) was referenced from outside the layer: it stays.
    let by_graph = |free: Option<usize>| {
        free.is_some_and(|j| {
            !a.releases.native_frames
                || matches!(
                    cause(j),
                    Cause::GraphInBackward | Cause::Backward | Cause::GraphDropped
                )
        })
    };
    let mut remat = Vec::new();
    let mut early: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
    for call in crate::torch::layer_calls::every_call(snap, a, layers.device, layers) {
        // The call holding the peak runs on: nothing of it is dropped.
        if call.first < index && call.end > index {
            continue;
        }
        // The activations it made that outlive it.
        let lo = all.partition_point(|x| x.0 < call.first);
        let hi = all.partition_point(|x| x.0 < call.end);
        let made: Vec<(usize, Option<usize>)> = all[lo..hi]
            .iter()
            .copied()
            .filter(|&(i, free)| {
                a.stacks.role(trace[i].stack()) == Role::Activation
                    && free.is_none_or(|j| j >= call.end)
            })
            .collect();
        // Its output (the next call's input) stays: the last tensor it made that outlives it.
        let Some((_, kept)) = made.split_last() else {
            continue;
        };
        let again_at = kept
            .iter()
            .filter(|x| fix == Fix::Checkpoint && backward(x.1))
            .filter_map(|x| x.1)
            .min();
        for &(i, free) in kept.iter().filter(|x| by_graph(x.1)) {
            match again_at {
                Some(at) if fix == Fix::Checkpoint && backward(free) && call.end < at => {
                    remat.push((i, call.end, at))
                }
                _ => early.entry(call.end).or_default().push(i),
            }
        }
    }
    let mut out: Vec<Change> = early
        .into_iter()
        .map(|(at, allocs)| Change::FreeEarly { allocs, at })
        .collect();
    out.sort_by_key(|c| match c {
        Change::FreeEarly { at, .. } => *at,
        _ => 0,
    });
    if !remat.is_empty() {
        out.push(Change::Rematerialize { allocs: remat });
    }
    out
}
