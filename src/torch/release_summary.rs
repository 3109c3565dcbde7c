//! The release classification as the summary shows it (`torch.releases` in the JSON): per
//! device, releases by cause, the allocator's OOM-retry episodes, and what later released the
//! blocks live at the peak (and at the first OOM). Every number is counted from trace entries.

use serde::Serialize;

use crate::torch::Analysis;
use crate::torch::model::Snapshot;
use crate::torch::release::{ByCause, GraphSeen, HeldAt, Releases};
use crate::torch::stacks::{Role, StackIndex};
use crate::torch::timeline::{DeviceSetIndices, Timeline};

/// Releases of one cause.
#[derive(Clone, Debug, Serialize)]
pub struct CauseRow {
    pub cause: &'static str,
    pub count: u64,
    pub bytes: u64,
}

/// Blocks live at one trace index, by what released them later.
#[derive(Clone, Debug, Serialize)]
pub struct HeldRow {
    /// The trace index (blocks live just before it).
    pub index: u64,
    pub released: Vec<CauseRow>,
    /// Allocated in the trace before the index and still live at its end (blocks older than
    /// the trace are not counted here).
    pub kept_blocks: u64,
    pub kept_bytes: u64,
    /// The same for blocks whose allocation stack looks like a forward activation.
    pub activations_released: Vec<CauseRow>,
    /// Bytes released by each later drop of a graph (its output dropped), in trace order: two
    /// or more mean two graphs were alive at this index.
    pub graph_drops: Vec<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct OomRetryRow {
    pub index: u64,
    pub segments: u64,
    pub bytes: u64,
    /// Size of the allocation that followed (the request that triggered the retry).
    pub request_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceReleaseSummary {
    pub device: i64,
    pub blocks: Vec<CauseRow>,
    pub segments: Vec<CauseRow>,
    pub oom_retries: Vec<OomRetryRow>,
    pub at_peak: Option<HeldRow>,
    pub at_first_oom: Option<HeldRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReleaseSummary {
    /// Release stacks carry the tensor's C++ destructor chain: graph releases would show.
    pub native_frames: bool,
    /// `backward`, `dropped_without_backward`, `none` or `unknown`.
    pub graph: &'static str,
    /// Grad mode from the allocation stacks: bytes allocated in the trace under a grad-mode
    /// decorator (`decorate_context`: `@torch.no_grad()` / `@torch.inference_mode()` /
    /// `@torch.enable_grad()` on a function), and all bytes allocated in the trace. A `with
    /// torch.no_grad():` block leaves no frame; `graph` is the evidence then.
    pub decorated_alloc_bytes: u64,
    pub alloc_bytes: u64,
    pub devices: Vec<DeviceReleaseSummary>,
}

fn rows(b: &ByCause) -> Vec<CauseRow> {
    b.nonzero()
        .into_iter()
        .map(|(c, t)| CauseRow {
            cause: c.as_str(),
            count: t.count,
            bytes: t.bytes,
        })
        .collect()
}

fn held(snap: &Snapshot, a: &Analysis, device: i64, index: u64) -> HeldRow {
    let [all, act]: [HeldAt; 2] = a
        .releases
        .held_at_roles(
            snap,
            &a.stacks,
            device,
            index,
            &[None, Some(Role::Activation)],
        )
        .try_into()
        .unwrap_or_default();
    HeldRow {
        index,
        released: rows(&all.released),
        kept_blocks: all.kept.count,
        kept_bytes: all.kept.bytes,
        activations_released: rows(&act.released),
        graph_drops: crate::torch::release::graph_drops_held_at(
            snap,
            &a.releases,
            &a.stacks,
            device,
            index,
        ),
    }
}

/// Make the walks [`summarize`] reads (what later released the blocks live at each device's
/// peak and first OOM) ahead of it, on a thread that has nothing else to do: they are kept by
/// `releases`, and the summary then finds them made.
pub fn warm(snap: &Snapshot, releases: &Releases, stacks: &StackIndex, timeline: &Timeline) {
    warm_at(snap, releases, stacks, &timeline.set_indices());
}

/// [`warm`] at the indices `at` (the timeline's, or `timeline::all_set_indices` before it is
/// known).
pub fn warm_at(snap: &Snapshot, releases: &Releases, stacks: &StackIndex, at: &[DeviceSetIndices]) {
    for d in &releases.devices {
        // A device without a timeline (an empty trace) has no walks either.
        let Some(&(_, (peak, oom))) = at.iter().find(|p| p.0 == d.device) else {
            continue;
        };
        for index in peak.into_iter().chain(oom) {
            releases.held_at_roles(snap, stacks, d.device, index, &[]);
        }
    }
}

/// The summary of `a.releases`; `None` for a capture with no trace.
pub fn summarize(snap: &Snapshot, a: &Analysis) -> Option<ReleaseSummary> {
    if a.releases.devices.is_empty() {
        return None;
    }
    let devices = a
        .releases
        .devices
        .iter()
        .map(|d| {
            let t = a.timeline.device(d.device);
            DeviceReleaseSummary {
                device: d.device,
                blocks: rows(&d.blocks),
                segments: rows(&d.segments),
                oom_retries: d
                    .oom_retries
                    .iter()
                    .map(|r| OomRetryRow {
                        index: r.index,
                        segments: r.segments,
                        bytes: r.bytes,
                        request_bytes: r.request.map(|(_, s, _)| s),
                    })
                    .collect(),
                at_peak: t
                    .and_then(|t| t.peak_set.as_ref())
                    .map(|p| held(snap, a, d.device, p.index)),
                at_first_oom: t
                    .and_then(|t| t.oom_sets.first())
                    .map(|p| held(snap, a, d.device, p.index)),
            }
        })
        .collect();
    Some(ReleaseSummary {
        native_frames: a.releases.native_frames,
        graph: match a.releases.graph() {
            GraphSeen::Backward => "backward",
            GraphSeen::DroppedWithoutBackward => "dropped_without_backward",
            GraphSeen::None => "none",
            GraphSeen::Unknown => "unknown",
        },
        decorated_alloc_bytes: a.releases.decorated_alloc_bytes,
        alloc_bytes: a.releases.alloc_bytes,
        devices,
    })
}
