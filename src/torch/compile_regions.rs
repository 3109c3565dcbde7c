//! Bytes at each device's peak per `torch.compile` region: the `compile_context` (torch 2.8+)
//! of the `alloc` entry of every block live at the peak. Measured: the blocks live after the
//! peak's entry, found by a pass over the trace up to it, and their requested bytes (the trace's
//! sizes). Blocks allocated before the trace window have no recorded entry, hence no context.

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::torch::model::{Action, Snapshot};
use crate::torch::timeline::Timeline;

/// `captures[].torch.compile_contexts`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompileRegions {
    /// Whether the trace entries carry `compile_context` at all (torch 2.8+).
    pub recorded: bool,
    pub label: &'static str,
    pub devices: Vec<DeviceRegions>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceRegions {
    pub device: i64,
    /// Trace entry after which the peak is reached.
    pub peak_index: u64,
    /// Requested bytes live at the peak whose `alloc` is in the trace.
    pub traced_bytes: u64,
    /// Per `compile_context`, bytes descending.
    pub regions: Vec<Region>,
    /// Live at the peak, allocated outside any region (`"N/A"`).
    pub outside_bytes: u64,
    pub outside_blocks: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Region {
    pub compile_context: String,
    pub bytes: u64,
    pub blocks: u64,
}

/// The breakdown at each traced device's peak (devices without a peak are left out).
pub fn compute(snap: &Snapshot, timeline: &Timeline) -> CompileRegions {
    compute_at(snap, |d| {
        timeline
            .device(d)
            .and_then(|t| t.peak_set.as_ref())
            .map(|s| s.index)
    })
}

/// [`compute`] at the peak indices `peak_of` gives per device (its timeline's `peak_set`
/// index: `timeline::set_indices` knows it before the timeline is walked).
pub fn compute_at(snap: &Snapshot, peak_of: impl Fn(i64) -> Option<u64>) -> CompileRegions {
    let cc = &snap.compile_contexts;
    let mut out = CompileRegions {
        recorded: cc.recorded,
        label: "measured",
        devices: Vec::new(),
    };
    if !cc.recorded {
        return out;
    }
    let Some(traces) = snap.device_traces.as_ref() else {
        return out;
    };
    for (d, list) in traces.iter().enumerate() {
        let Some(index) = peak_of(d as i64) else {
            continue;
        };
        let k = (index as usize).min(list.len());
        // Live after entries 0..k: addr → (requested bytes, alloc index).
        let mut live: FxHashMap<u64, (u64, usize)> = FxHashMap::default();
        for (i, e) in list[..k].iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, (e.size, i));
                }
                Action::FreeCompleted => {
                    live.remove(&e.addr);
                }
                _ => {}
            }
        }
        let ctx = cc.entries.get(d).map_or(&[][..], Vec::as_slice);
        let mut by: FxHashMap<u32, (u64, u64)> = FxHashMap::default();
        let (mut traced, mut outside, mut outside_blocks) = (0u64, 0u64, 0u64);
        for &(bytes, i) in live.values() {
            traced = traced.saturating_add(bytes);
            match ctx.binary_search_by_key(&(i as u32), |&(at, _)| at) {
                Ok(p) => {
                    let r = by.entry(ctx[p].1).or_default();
                    r.0 = r.0.saturating_add(bytes);
                    r.1 += 1;
                }
                Err(_) => {
                    outside = outside.saturating_add(bytes);
                    outside_blocks += 1;
                }
            }
        }
        let mut regions: Vec<Region> = by
            .into_iter()
            .map(|(id, (bytes, blocks))| Region {
                compile_context: cc.names.get(id as usize).cloned().unwrap_or_default(),
                bytes,
                blocks,
            })
            .collect();
        regions.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then_with(|| a.compile_context.cmp(&b.compile_context))
        });
        out.devices.push(DeviceRegions {
            device: d as i64,
            peak_index: index.saturating_sub(1),
            traced_bytes: traced,
            regions,
            outside_bytes: outside,
            outside_blocks,
        });
    }
    out
}
