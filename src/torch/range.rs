//! `--range A..B`: analyse only part of each device's trace. `A` and `B` are entry indices
//! (`1000..5000`) or seconds from the device's first traced event (`2.5s..4s`); either may be
//! left out (`..5000`, `1000..`). The analyses read the allocator state at the end of their
//! trace, so the state after the last chosen entry is rebuilt from the dump's own state by
//! undoing the entries after the range (`state`: one pass over them, no replay); the state at
//! `A` then follows from it and the chosen entries, as it does for a whole trace. What the
//! analyses cost is in proportion to the range.

mod state;

use crate::options::Range;
use crate::torch::model::Snapshot;

/// What a cut kept of one device's trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Cut {
    pub device: i64,
    pub start_index: u64,
    pub end_index: u64,
    /// Entries of the whole trace.
    pub of_entries: u64,
}

/// The segments of `device` just after entries `0..b` (`b` below the trace's length), rebuilt
/// from the dump by undoing entries `b..` (see `state`): in address order.
pub fn segments_at(snap: &Snapshot, device: i64, b: usize) -> Vec<crate::torch::model::Segment> {
    state::segments_at(snap, device, snap.trace(device), b)
}

/// `snap` with each device's trace cut to the range and its segments rebuilt at the cut's end.
/// Devices without a trace keep their state. An error names the device and what to do.
pub fn cut(mut snap: Snapshot, range: &Range) -> Result<(Snapshot, Vec<Cut>), String> {
    let Some(traces) = snap.device_traces.as_ref() else {
        return Err("the snapshot has no trace to cut (memory history was not recorded)".into());
    };
    let mut cuts = Vec::new();
    for (d, list) in traces.iter().enumerate() {
        if list.is_empty() {
            continue;
        }
        let (a, b) = range
            .indices(list.len(), |i| list.get(i).and_then(|e| e.time_us()))
            .map_err(|e| format!("device {d}: {e}"))?;
        if a >= b {
            return Err(format!(
                "device {d}: the range holds no entry of its {} (give A below B, within the trace)",
                list.len()
            ));
        }
        cuts.push(Cut {
            device: d as i64,
            start_index: a as u64,
            end_index: b as u64,
            of_entries: list.len() as u64,
        });
    }
    // States after each cut's last entry, while the whole trace is still there: the dump's
    // state with the entries after the range undone (one pass over them, `state`).
    let mut states = Vec::new();
    for c in &cuts {
        if c.end_index == c.of_entries {
            continue;
        }
        let segs = crate::timings::time("range: state at B", || {
            segments_at(&snap, c.device, c.end_index as usize)
        });
        states.push((c.device, segs));
    }
    for (device, segs) in states {
        snap.segments.retain(|s| s.device != device);
        snap.segments.extend(segs);
    }
    snap.segments.sort_by_key(|s| (s.device, s.address));
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    if let Some(traces) = snap.device_traces.as_mut() {
        for c in &cuts {
            let t = &mut traces[c.device as usize];
            t.truncate(c.end_index as usize);
            t.drain(..c.start_index as usize);
            t.shrink_to_fit();
            if let (Some(x), Some(y)) = (
                t.first().and_then(|e| e.time_us()),
                t.last().and_then(|e| e.time_us()),
            ) {
                lo = lo.min(x);
                hi = hi.max(y);
            }
        }
    }
    // `compile_context`s of the kept entries, renumbered from the range's start.
    for c in &cuts {
        if let Some(v) = snap.compile_contexts.entries.get_mut(c.device as usize) {
            let (a, b) = (c.start_index as u32, c.end_index as u32);
            v.retain(|&(i, _)| i >= a && i < b);
            v.iter_mut().for_each(|e| e.0 -= a);
        }
    }
    // Annotations outside the kept time are not in the part analysed.
    if lo <= hi {
        snap.annotations
            .retain(|a| a.time_us.is_some_and(|t| t >= lo && t <= hi));
    }
    Ok((snap, cuts))
}
