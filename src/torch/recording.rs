//! What the snapshot says about its own recording, beside the allocator state: whether each
//! device's trace ring buffer overflowed (read where recorded, else inferred from frees of
//! blocks the window never saw allocated), and the pinned host allocator's totals (read, kept
//! apart from every device total).

use serde::Serialize;

use crate::torch::model::{RingBuffer, Snapshot};
use crate::torch::timeline::Timeline;

/// Whether one device's trace starts mid-run (`captures[].torch.trace_start[]`).
#[derive(Clone, Debug, Serialize)]
pub struct TraceStart {
    pub device: i64,
    pub starts_mid_run: bool,
    /// `read` (`trace_alloc_overflowed` recorded) or `inferred` (frees of blocks allocated
    /// before the window).
    pub label: &'static str,
    /// `trace_alloc_max_entries` as recorded.
    pub max_entries: Option<u64>,
    pub overflowed: Option<bool>,
    /// Frees of blocks the window never saw allocated (the inference's evidence).
    pub frees_of_older_blocks: u64,
}

impl TraceStart {
    /// The sentence shown to the user, when the trace starts mid-run.
    pub fn sentence(&self) -> Option<String> {
        if !self.starts_mid_run {
            return None;
        }
        Some(match (self.label, self.max_entries) {
            ("read", Some(n)) => format!(
                "device {}: the ring buffer of {n} entries overflowed: the trace starts mid-run [read]",
                self.device
            ),
            ("read", None) => format!(
                "device {}: the ring buffer overflowed: the trace starts mid-run [read]",
                self.device
            ),
            _ => format!(
                "device {}: the trace starts mid-run ({} frees of blocks allocated earlier) [inferred]",
                self.device, self.frees_of_older_blocks
            ),
        })
    }
}

/// The pinned host allocator (`captures[].torch.host`), all `read`.
#[derive(Clone, Debug, Serialize)]
pub struct HostSummary {
    pub segments: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub trace_entries: u64,
    pub label: &'static str,
}

/// Per traced device (and per device whose ring buffer was recorded).
pub fn trace_start(snap: &Snapshot, timeline: &Timeline) -> Vec<TraceStart> {
    let mut devices: Vec<i64> = timeline.devices.iter().map(|t| t.device).collect();
    devices.extend(snap.ring_buffers.iter().map(|r| r.device));
    devices.sort_unstable();
    devices.dedup();
    // The first ring buffer recorded for each device, found once (not a search per device).
    let mut rings: rustc_hash::FxHashMap<i64, &RingBuffer> = Default::default();
    for r in &snap.ring_buffers {
        rings.entry(r.device).or_insert(r);
    }
    devices
        .into_iter()
        .map(|d| {
            let older = timeline.device(d).map_or(0, |t| t.frees_of_older_blocks);
            let rb = rings.get(&d).copied();
            let overflowed = rb.and_then(|r| r.overflowed);
            TraceStart {
                device: d,
                starts_mid_run: overflowed.unwrap_or(older > 0),
                label: if overflowed.is_some() {
                    "read"
                } else {
                    "inferred"
                },
                max_entries: rb.and_then(|r| r.max_entries),
                overflowed,
                frees_of_older_blocks: older,
            }
        })
        .collect()
}

pub fn host(snap: &Snapshot) -> Option<HostSummary> {
    snap.host.as_ref().map(|h| HostSummary {
        segments: h.segments,
        reserved_bytes: h.reserved_bytes,
        allocated_bytes: h.allocated_bytes,
        trace_entries: h.trace_entries,
        label: "read",
    })
}
