//! Allocator totals at snapshot time and trace-relative peaks, per device and overall.
//!
//! Definitions are exactly those of `torch_snapshots/ORACLE.md` §3–4, so the numbers can be
//! compared byte for byte with the oracle. Sums saturate: sizes come from the file.

use std::collections::BTreeMap;

use crate::torch::model::{Action, BlockState, Snapshot};
use crate::torch::stacks::{SiteKind, StackIndex, site_string};

/// Memory state of one device (or of all devices) at snapshot time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Memory {
    pub reserved: u64,
    pub allocated: u64,
    pub pending_free: u64,
    pub inactive: u64,
    pub requested: u64,
    pub segment_count: u64,
    pub block_total: u64,
    /// Blocks per state; the three known states are always present.
    pub block_count: BTreeMap<String, u64>,
    pub largest_inactive: Option<u64>,
    /// `segment_type` → (count, reserved bytes); `<none>` when absent.
    pub segments_by_type: BTreeMap<String, (u64, u64)>,
    pub streams: Vec<u64>,
    pub expandable_segments: u64,
    /// Segments that hold at least one inactive block (fragmentation evidence).
    pub segments_with_inactive: u64,
    /// Segments with no live block: what `torch.cuda.empty_cache()` would return (count, bytes).
    pub releasable: (u64, u64),
}

/// A running-sum peak over one device's trace (ORACLE.md §4). All `None` for an empty list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peak {
    pub bytes: Option<i64>,
    pub index: Option<u64>,
    pub min_running: Option<i64>,
    pub final_running: Option<i64>,
}

/// Counts over one device's trace list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceStats {
    pub entries: u64,
    pub actions: BTreeMap<String, u64>,
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    pub peak_active: Peak,
    pub peak_reserved: Peak,
}

/// One `oom` trace entry.
#[derive(Clone, Debug, PartialEq)]
pub struct OomEvent {
    pub device: i64,
    /// Position in that device's trace list.
    pub index: u64,
    pub size: u64,
    pub device_free: Option<u64>,
    pub stream: u64,
    pub time_us: Option<i64>,
    pub stack: Option<crate::torch::model::StackId>,
    /// `<filename>:<line>:<name>` of the first user frame, or `<no stack>`.
    pub site: String,
    pub site_key: crate::torch::stacks::SiteKey,
    pub site_kind: SiteKind,
}

/// Totals of one device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceTotals {
    pub device: i64,
    pub memory: Memory,
    /// `None` when the file has no trace list for this device.
    pub trace: Option<TraceStats>,
    pub ooms: Vec<OomEvent>,
}

/// Totals of a whole snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct Totals {
    pub overall: Memory,
    pub devices: Vec<DeviceTotals>,
    /// Whether the file has `device_traces` at all.
    pub trace_present: bool,
    pub dropped_trace_entries: u64,
}

impl Totals {
    pub fn trace_entries(&self) -> u64 {
        self.devices
            .iter()
            .filter_map(|d| d.trace.as_ref())
            .fold(0u64, |a, t| a.saturating_add(t.entries))
    }

    pub fn oom_events(&self) -> impl Iterator<Item = &OomEvent> {
        self.devices.iter().flat_map(|d| d.ooms.iter())
    }

    /// The device whose trace-relative active peak is largest (lowest device on a tie).
    pub fn overall_peak(&self) -> Option<(i64, u64, i64)> {
        let mut best: Option<(i64, u64, i64)> = None;
        for d in &self.devices {
            let Some(t) = &d.trace else { continue };
            if let (Some(b), Some(i)) = (t.peak_active.bytes, t.peak_active.index)
                && best.is_none_or(|(_, _, bb)| b > bb)
            {
                best = Some((d.device, i, b));
            }
        }
        best
    }

    pub fn device(&self, device: i64) -> Option<&DeviceTotals> {
        // Sorted by device (`Snapshot::devices`): a lookup per OOM stays cheap with many devices.
        let i = self
            .devices
            .binary_search_by_key(&device, |d| d.device)
            .ok()?;
        self.devices.get(i)
    }
}

fn memory_of<'a>(segments: impl Iterator<Item = &'a crate::torch::model::Segment>) -> Memory {
    let mut m = Memory::default();
    for state in ["active_allocated", "active_pending_free", "inactive"] {
        m.block_count.insert(state.to_string(), 0);
    }
    let mut streams = Vec::new();
    for seg in segments {
        m.reserved = m.reserved.saturating_add(seg.total_size);
        m.segment_count += 1;
        let ty = seg.segment_type.as_deref().unwrap_or("<none>");
        let e = m.segments_by_type.entry(ty.to_string()).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(seg.total_size);
        streams.push(seg.stream);
        if seg.is_expandable {
            m.expandable_segments += 1;
        }
        let mut has_inactive = false;
        for b in &seg.blocks {
            m.block_total += 1;
            match &b.state {
                BlockState::ActiveAllocated => {
                    m.allocated = m.allocated.saturating_add(b.size);
                    m.requested = m.requested.saturating_add(b.requested_size);
                }
                BlockState::ActivePendingFree => {
                    m.pending_free = m.pending_free.saturating_add(b.size)
                }
                BlockState::Inactive => {
                    has_inactive = true;
                    m.inactive = m.inactive.saturating_add(b.size);
                    m.largest_inactive = Some(m.largest_inactive.unwrap_or(0).max(b.size));
                }
                BlockState::Other(_) => {}
            }
            // Avoid a String per block: known states are already keys.
            match m.block_count.get_mut(b.state.as_str()) {
                Some(c) => *c += 1,
                None => {
                    m.block_count.insert(b.state.as_str().to_string(), 1);
                }
            }
        }
        if has_inactive {
            m.segments_with_inactive += 1;
        }
        if seg.blocks.iter().all(|b| b.state == BlockState::Inactive) {
            m.releasable.0 += 1;
            m.releasable.1 = m.releasable.1.saturating_add(seg.total_size);
        }
    }
    streams.sort_unstable();
    streams.dedup();
    m.streams = streams;
    m
}

/// Running-sum peak (ORACLE.md §4) over `deltas`.
fn peak(deltas: impl Iterator<Item = i64>) -> Peak {
    let mut run: i64 = 0;
    let mut p = Peak::default();
    for (i, d) in deltas.enumerate() {
        run = run.saturating_add(d);
        if p.bytes.is_none_or(|b| run > b) {
            p.bytes = Some(run);
            p.index = Some(i as u64);
        }
        if p.min_running.is_none_or(|m| run < m) {
            p.min_running = Some(run);
        }
        p.final_running = Some(run);
    }
    p
}

fn signed(size: u64) -> i64 {
    i64::try_from(size).unwrap_or(i64::MAX)
}

/// Compute totals for every device of the snapshot (ORACLE.md §2 `devices`).
pub fn compute(snap: &Snapshot, stacks: &StackIndex) -> Totals {
    let overall = memory_of(snap.segments.iter());
    let mut devices = Vec::new();
    let traces = snap.device_traces.as_deref();
    for device in snap.devices() {
        let memory = memory_of(snap.segments_of(device));
        let list = usize::try_from(device)
            .ok()
            .and_then(|d| traces.and_then(|t| t.get(d)));
        let mut ooms = Vec::new();
        let trace = list.map(|list| {
            let mut t = TraceStats {
                entries: list.len() as u64,
                first_time_us: list.first().and_then(|e| e.time_us()),
                last_time_us: list.last().and_then(|e| e.time_us()),
                ..TraceStats::default()
            };
            let mut counts: [u64; 10] = [0; 10];
            for (i, e) in list.iter().enumerate() {
                match action_slot(&e.action) {
                    Some(s) => counts[s] += 1,
                    None => {
                        *t.actions
                            .entry(snap.action_name(e.action).to_string())
                            .or_default() += 1
                    }
                }
                if e.action == Action::Oom {
                    let (key, kind) = stacks.site(e.stack());
                    ooms.push(OomEvent {
                        device,
                        index: i as u64,
                        size: e.size,
                        device_free: e.device_free(),
                        stream: e.stream,
                        time_us: e.time_us(),
                        stack: e.stack(),
                        site: site_string(snap, key),
                        site_key: key,
                        site_kind: kind,
                    });
                }
            }
            for (slot, n) in counts.iter().enumerate() {
                if *n > 0 {
                    t.actions.insert(SLOT_NAMES[slot].to_string(), *n);
                }
            }
            t.peak_active = peak(list.iter().map(|e| match e.action {
                Action::Alloc => signed(e.size),
                Action::FreeCompleted => -signed(e.size),
                _ => 0,
            }));
            t.peak_reserved = peak(list.iter().map(|e| match e.action {
                Action::SegmentAlloc | Action::SegmentMap => signed(e.size),
                Action::SegmentFree | Action::SegmentUnmap => -signed(e.size),
                _ => 0,
            }));
            t
        });
        devices.push(DeviceTotals {
            device,
            memory,
            trace,
            ooms,
        });
    }
    Totals {
        overall,
        devices,
        trace_present: snap.device_traces.is_some(),
        dropped_trace_entries: snap.dropped_trace_entries,
    }
}

const SLOT_NAMES: [&str; 10] = [
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "annotate",
];

fn action_slot(a: &Action) -> Option<usize> {
    Some(match a {
        Action::Alloc => 0,
        Action::FreeRequested => 1,
        Action::FreeCompleted => 2,
        Action::SegmentAlloc => 3,
        Action::SegmentFree => 4,
        Action::SegmentMap => 5,
        Action::SegmentUnmap => 6,
        Action::Snapshot => 7,
        Action::Oom => 8,
        Action::Annotate => 9,
        Action::Other(_) => return None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::frames::FrameFilter;
    use crate::torch::model::{Block, Segment, TraceEntry};

    pub fn block(size: u64, requested: u64, state: BlockState) -> Block {
        Block {
            address: 0,
            size,
            requested_size: requested,
            state,
            stack: None,
            history_len: 0,
        }
    }

    pub fn segment(device: i64, address: u64, blocks: Vec<Block>) -> Segment {
        let mut addr = address;
        let blocks: Vec<Block> = blocks
            .into_iter()
            .map(|mut b| {
                b.address = addr;
                addr += b.size;
                b
            })
            .collect();
        Segment {
            device,
            address,
            total_size: blocks.iter().map(|b| b.size).sum(),
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: Some("large".into()),
            is_expandable: false,
            pool_id: None,
            stack: None,
            blocks,
        }
    }

    pub fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry::new(action, addr, size, 0)
    }

    #[test]
    fn sums_states_per_device_and_overall() {
        let snap = Snapshot {
            segments: vec![
                segment(
                    0,
                    1 << 20,
                    vec![
                        block(4096, 4000, BlockState::ActiveAllocated),
                        block(2048, 1999, BlockState::Inactive),
                        block(1024, 1024, BlockState::ActivePendingFree),
                    ],
                ),
                segment(1, 1 << 30, vec![block(8192, 1, BlockState::Inactive)]),
            ],
            device_traces: Some(vec![vec![], vec![], vec![]]),
            ..Snapshot::default()
        };
        let t = compute(&snap, &StackIndex::new(&snap, &FrameFilter::default()));
        assert_eq!(t.overall.reserved, 4096 + 2048 + 1024 + 8192);
        assert_eq!(t.overall.allocated, 4096);
        assert_eq!(
            t.overall.requested, 4000,
            "stale inactive requested_size ignored"
        );
        assert_eq!(t.overall.pending_free, 1024);
        assert_eq!(t.overall.inactive, 2048 + 8192);
        assert_eq!(t.overall.largest_inactive, Some(8192));
        assert_eq!(
            t.overall.releasable,
            (1, 8192),
            "only the wholly inactive segment goes back on empty_cache()"
        );
        assert_eq!(t.devices.len(), 3, "device 2 exists through its trace list");
        assert_eq!(t.devices[0].memory.largest_inactive, Some(2048));
        assert_eq!(t.devices[2].memory.reserved, 0);
        assert_eq!(t.devices[2].memory.largest_inactive, None);
        assert_eq!(t.overall_peak(), None, "no entries, no peak");
    }

    #[test]
    fn trace_relative_peak_follows_oracle_definition() {
        let snap = Snapshot {
            device_traces: Some(vec![
                vec![
                    entry(Action::FreeCompleted, 8, 100),
                    entry(Action::Alloc, 16, 300),
                    entry(Action::Snapshot, 0, 999),
                    entry(Action::Alloc, 32, 100),
                    entry(Action::FreeRequested, 32, 100),
                    entry(Action::FreeCompleted, 32, 100),
                    entry(Action::Alloc, 48, 100),
                    entry(Action::SegmentAlloc, 0, 2 << 20),
                ],
                vec![entry(Action::FreeCompleted, 8, 5)],
            ]),
            ..Snapshot::default()
        };
        let t = compute(&snap, &StackIndex::new(&snap, &FrameFilter::default()));
        let p = t.devices[0].trace.as_ref().map(|t| t.peak_active);
        assert_eq!(
            p,
            Some(Peak {
                bytes: Some(300),
                index: Some(3),
                min_running: Some(-100),
                final_running: Some(300),
            }),
            "first index reaching the max wins (3, not 6)"
        );
        let d1 = t.devices[1].trace.as_ref().map(|t| t.peak_active.bytes);
        assert_eq!(d1, Some(Some(-5)), "a trace of one free is negative");
        assert_eq!(t.overall_peak(), Some((0, 3, 300)));
        assert_eq!(t.trace_entries(), 9);
        let j = serde_json::to_value(crate::torch::summary::overall(&t, &snap)).unwrap();
        assert_eq!(j["trace_actions"]["alloc"], 3);
        assert_eq!(j["trace_entries"], 9);
    }

    #[test]
    fn oom_entry_is_reported_with_its_stack_site() {
        let mut snap = Snapshot::default();
        let st = crate::torch::stacks::tests::intern(
            &mut snap,
            &[("??", 0, "malloc"), ("/home/u/train.py", 7, "step")],
        );
        let mut oom = entry(Action::Oom, 0, 1 << 30);
        oom.set_device_free(Some(12345));
        oom.set_stack(Some(st));
        snap.device_traces = Some(vec![vec![oom]]);
        let t = compute(&snap, &StackIndex::new(&snap, &FrameFilter::default()));
        let o: Vec<_> = t.oom_events().collect();
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].site, "/home/u/train.py:7:step");
        assert_eq!(o[0].device_free, Some(12345));
        let j = serde_json::to_value(crate::torch::summary::overall(&t, &snap)).unwrap();
        assert_eq!(j["oom_events"][0]["first_user_frame"]["line"], 7);
    }
}
