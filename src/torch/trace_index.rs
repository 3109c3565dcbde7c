//! What the page searches (`report --format html`): per traced device the largest allocations
//! of the trace (at most [`PER_DEVICE`], in trace order), each with its index, requested bytes
//! (measured: the entry's size), the site its stack names and the stage it fell in. Only built
//! for the page; a huge trace gives the page its largest allocations, never every entry.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use crate::torch::Analysis;
use crate::torch::model::{Action, Snapshot};
use crate::torch::stacks::site_string;

/// Allocations kept per device.
pub const PER_DEVICE: usize = 2000;

#[derive(Clone, Debug, Serialize)]
pub struct TraceIndex {
    pub device: i64,
    /// `alloc` entries of the device's trace.
    pub allocations: u64,
    /// The kept ones: `[index, bytes, site, stage]` (site and stage index `sites`/`stages`;
    /// stage −1: none).
    pub entries: Vec<(u64, u64, u32, i32)>,
    pub sites: Vec<String>,
    pub stages: Vec<String>,
}

pub fn compute(snap: &Snapshot, a: &Analysis) -> Vec<TraceIndex> {
    let mut out = Vec::new();
    let Some(traces) = snap.device_traces.as_ref() else {
        return out;
    };
    for (d, list) in traces.iter().enumerate() {
        let device = d as i64;
        // The largest PER_DEVICE, kept in a bounded min-heap (no copy of the whole trace).
        let mut heap: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::with_capacity(PER_DEVICE + 1);
        let mut allocations = 0u64;
        for (i, e) in list.iter().enumerate() {
            if e.action != Action::Alloc {
                continue;
            }
            allocations += 1;
            if heap.len() < PER_DEVICE {
                heap.push(Reverse((e.size, i)));
            } else if heap.peek().is_some_and(|Reverse(m)| (e.size, i) > *m) {
                heap.pop();
                heap.push(Reverse((e.size, i)));
            }
        }
        if allocations == 0 {
            continue;
        }
        let mut allocs: Vec<(u64, usize)> = heap.into_iter().map(|Reverse(x)| x).collect();
        allocs.sort_unstable_by_key(|&(_, i)| i);
        // Innermost stage holding each entry (stages of a device are in trace order).
        let stages: Vec<&crate::torch::stages::Stage> = a
            .stages
            .stages
            .iter()
            .filter(|s| s.device == device)
            .collect();
        let mut site_ids: rustc_hash::FxHashMap<String, u32> = Default::default();
        let mut stage_ids: rustc_hash::FxHashMap<String, i32> = Default::default();
        let mut idx = TraceIndex {
            device,
            allocations,
            entries: Vec::with_capacity(allocs.len()),
            sites: Vec::new(),
            stages: Vec::new(),
        };
        for (bytes, i) in allocs {
            let (key, _) = a.stacks.site(list[i].stack());
            let site = site_string(snap, key);
            let n = site_ids.len() as u32;
            let s = *site_ids.entry(site.clone()).or_insert_with(|| {
                idx.sites.push(site);
                n
            });
            let stage = stages
                .iter()
                .filter(|st| (st.start..st.end).contains(&(i as u64)))
                .max_by_key(|st| st.depth)
                .map(|st| format!("{} (step {})", st.name, st.step));
            let g = match stage {
                Some(name) => {
                    let n = stage_ids.len() as i32;
                    *stage_ids.entry(name.clone()).or_insert_with(|| {
                        idx.stages.push(name);
                        n
                    })
                }
                None => -1,
            };
            idx.entries.push((i as u64, bytes, s, g));
        }
        out.push(idx);
    }
    out
}
