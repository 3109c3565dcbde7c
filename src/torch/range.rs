//! `--range A..B`: analyse only part of each device's trace. `A` and `B` are entry indices
//! (`1000..5000`) or seconds from the device's first traced event (`2.5s..4s`); either may be
//! left out (`..5000`, `1000..`). The analyses read the allocator state at the end of their
//! trace, so the state after the last chosen entry is rebuilt by the allocator replay (only
//! where the replay reproduces every recorded segment event); the state at `A` then follows
//! from it and the chosen entries, as it does for a whole trace.

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
    // States after each cut's last entry, while the whole trace is still there.
    let mut states = Vec::new();
    for c in &cuts {
        if c.end_index == c.of_entries {
            continue;
        }
        let segs = crate::torch::replay::state_after(&snap, c.device, c.end_index as usize - 1)
            .ok_or_else(|| {
                format!(
                    "device {}: the allocator replay does not reproduce this trace, so its state at entry {} \
                     cannot be rebuilt; cut only the start (--range {}..)",
                    c.device, c.end_index, c.start_index
                )
            })?;
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
    // Annotations outside the kept time are not in the part analysed.
    if lo <= hi {
        snap.annotations
            .retain(|a| a.time_us.is_some_and(|t| t >= lo && t <= hi));
    }
    Ok((snap, cuts))
}
