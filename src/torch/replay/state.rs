//! Allocator states out of a replay: the state after any trace entry of the recorded run (the
//! validation replay, watched), and the snapshot a program would have dumped on a smaller device
//! (its requests replayed through the model with a capacity, up to the first one the device
//! cannot serve).
//!
//! Both are the model's segments and blocks at one point of a replay, turned into the
//! snapshot's own types (requested sizes and stacks from the trace) by one function.

use rustc_hash::FxHashMap;

use super::addr_of::AddrOf;
use super::model::{Malloc, Model, SegEvent, SegKind, St};
use super::run::{Done, NONE, Observer, Op, OpKind};
use super::{Prepared, Replays};
use crate::torch::model::{Action, Block, BlockState, Segment, Snapshot, StackId, TraceEntry};

/// A point of the recorded run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// Just after trace entry N (entries `0..=N` replayed).
    After(usize),
    /// Just before the request recorded at trace entry N (an `alloc` or `oom`) began: before
    /// the segment releases its OOM path recorded ahead of it, if any. For an entry that is not
    /// such a request: just before the entry.
    BeforeRequest(usize),
}

/// The allocator state of `device` at each point of `at`, as the recorded allocator had it:
/// the validation replay (recorded order, recorded device answers, no change) watched at those
/// points, so OOM paths and cache releases are the recorded ones. Each state is the device's
/// segments with their blocks (state, size, requested size, stack), in address order; an
/// expandable segment is one segment per mapped run, as a snapshot has it. `None` when the
/// unchanged replay does not validate on this device: then the model is not the recorded
/// allocator, and there is no state to show.
pub fn recorded_states(snap: &Snapshot, device: i64, at: &[At]) -> Option<Vec<Vec<Segment>>> {
    Replays::new().recorded_states(snap, device, at)
}

/// [`recorded_states`] on a prepared device whose unchanged replay validates (the caller checks).
pub(super) fn recorded_states_prepared(
    snap: &Snapshot,
    p: &Prepared,
    at: &[At],
) -> Option<Vec<Vec<Segment>>> {
    let device = p.device;
    // Positions k: the state after entries 0..k, before the ops at k and later.
    let positions: Vec<usize> = at
        .iter()
        .map(|a| match *a {
            At::After(n) => n.saturating_add(1),
            At::BeforeRequest(n) => request_start(snap.trace(device), p, n),
        })
        .collect();
    let mut order: Vec<usize> = (0..positions.len()).collect();
    order.sort_by_key(|&i| positions[i]);
    let mut cap = Capture {
        device,
        info: alloc_info(snap, p),
        positions: &positions,
        order,
        next: 0,
        states: vec![Vec::new(); positions.len()],
    };
    // The caller knows the unchanged replay validates; this one is the same replay, watched,
    // and stops once it has every state (the peak is often mid-trace).
    super::run::replay(
        snap.trace(device),
        &p.plan,
        &p.init,
        p.settings.clone(),
        true,
        None,
        &super::run::Edits::default(),
        &mut cap,
    );
    (cap.next == cap.order.len()).then_some(cap.states)
}

/// The allocator state of `device` just after trace entry `entry` of the recorded run (see
/// [`recorded_states`]); after the last entry it is the snapshot's own segments.
pub fn state_after(snap: &Snapshot, device: i64, entry: usize) -> Option<Vec<Segment>> {
    recorded_states(snap, device, &[At::After(entry)])?.pop()
}

/// Where the request recorded at `entry` begins in the recorded order: its probe (the first
/// release of its OOM path) or its own entry.
fn request_start(trace: &[TraceEntry], p: &Prepared, entry: usize) -> usize {
    p.plan
        .ops(trace, true, &[])
        .filter(|op| match op.kind {
            OpKind::Malloc { entry: e, .. } | OpKind::Probe { entry: e, .. } => e == entry,
            _ => false,
        })
        .map(|op| op.pos)
        .min()
        .unwrap_or(entry)
}

/// Takes the model's state at given positions of a replay.
struct Capture<'a> {
    device: i64,
    info: Vec<(u64, Option<StackId>)>,
    positions: &'a [usize],
    /// Indices of `positions`, by position.
    order: Vec<usize>,
    next: usize,
    states: Vec<Vec<Segment>>,
}

impl Capture<'_> {
    fn take_until(&mut self, pos: usize, m: &Model, addr_of: &AddrOf) {
        while let Some(&i) = self.order.get(self.next)
            && self.positions[i] <= pos
        {
            self.states[i] = model_segments(self.device, m, addr_of, &self.info);
            self.next += 1;
        }
    }
}

impl Observer for Capture<'_> {
    fn before(&mut self, op: &Op, m: &Model, addr_of: &AddrOf) -> bool {
        self.take_until(op.pos, m, addr_of);
        self.next < self.order.len()
    }
    fn end(&mut self, m: &Model, addr_of: &AddrOf) {
        self.take_until(usize::MAX, m, addr_of);
    }
}

/// Replay `device`'s requests on a device of `capacity` bytes and return the snapshot at the
/// first request that fails, ending in its `oom` entry. `None` when every request fits, when the
/// unchanged replay does not validate on this device (the model is not the recorded allocator
/// there), or when the memory reserved at the first trace entry is already above `capacity`.
pub fn state_at_capacity(snap: &Snapshot, device: i64, capacity: u64) -> Option<Snapshot> {
    Replays::new().state_at_capacity(snap, device, capacity)
}

/// [`state_at_capacity`] on a prepared device whose unchanged replay validates.
pub(super) fn state_at_capacity_prepared(
    snap: &Snapshot,
    p: &Prepared,
    capacity: u64,
    empty_cache_probes: &[u32],
) -> Option<Snapshot> {
    let device = p.device;
    let trace = snap.trace(device);
    let mut run = CapacityRun {
        trace,
        capacity,
        info: alloc_info(snap, p),
        device,
        out: Vec::new(),
        failed: None,
        started: false,
        over: false,
    };
    let outcome = requests_at(trace, p, capacity, empty_cache_probes, &mut run);
    if outcome.init_failures > 0 || run.over {
        return None;
    }
    let segments = run.failed?;
    Some(snapshot(snap, device, segments, run.out))
}

/// The program's requests replayed unchanged on a device of `capacity`, with its `empty_cache()`
/// calls (the probes the validation read as such) and the recorded addresses: until the
/// capacity refuses, the recorded run.
pub(super) fn requests_at<O: super::run::Observer>(
    trace: &[TraceEntry],
    p: &Prepared,
    capacity: u64,
    empty_cache_probes: &[u32],
    obs: &mut O,
) -> super::run::Outcome {
    super::run::replay(
        trace,
        &p.plan,
        &p.init,
        p.settings.clone(),
        false,
        Some(capacity),
        &super::run::Edits {
            empty_cache_probes: empty_cache_probes.to_vec(),
            recorded_addresses: true,
            ..super::run::Edits::default()
        },
        obs,
    )
}

/// Follows a capacity replay, writing the trace the model's run would have recorded, and stops
/// it at the first request the device cannot serve.
struct CapacityRun<'t> {
    trace: &'t [TraceEntry],
    capacity: u64,
    info: Vec<(u64, Option<StackId>)>,
    device: i64,
    out: Vec<TraceEntry>,
    /// The segments at the failed request.
    failed: Option<Vec<Segment>>,
    started: bool,
    /// More than `capacity` was reserved before the first request.
    over: bool,
}

impl Observer for CapacityRun<'_> {
    fn before(&mut self, _op: &Op, m: &Model, _addr_of: &AddrOf) -> bool {
        if !self.started && m.reserved > self.capacity {
            self.over = true;
            return false;
        }
        self.started = true;
        true
    }

    fn after(&mut self, op: &Op, done: Done, m: &Model, addr_of: &AddrOf) -> bool {
        let Some(at) = self.trace.get(op.pos) else {
            return true;
        };
        match done {
            Done::Malloc {
                entry,
                oom,
                result,
                events,
            } => {
                let Some(e) = self.trace.get(entry) else {
                    return true;
                };
                segment_entries(&m.events[events..], e, &mut self.out);
                match result {
                    Malloc::Ok { addr, .. } if !oom && op.aref != NONE => {
                        let mut n = e.clone();
                        n.addr = addr;
                        self.out.push(n);
                    }
                    // A recorded OOM that fits here: the program would have used the block; it
                    // never appears in the trace (the replay handed it back at once).
                    Malloc::Ok { .. } => {}
                    Malloc::Oom => {
                        let size = if oom {
                            e.size
                        } else {
                            m.settings.round_size(e.size)
                        };
                        self.out.push(
                            TraceEntry::new(Action::Oom, 0, size, e.stream)
                                .with_time_us(e.time_us())
                                .with_stack(e.stack())
                                .with_device_free(Some(self.capacity.saturating_sub(m.reserved))),
                        );
                        self.failed = Some(model_segments(self.device, m, addr_of, &self.info));
                        return false;
                    }
                }
            }
            Done::Free { addr, .. } => {
                let mut n = at.clone();
                n.addr = addr;
                self.out.push(n);
            }
            Done::EmptyCache { events } => segment_entries(&m.events[events..], at, &mut self.out),
        }
        true
    }
}

/// Requested size and stack of every allocation reference: an `alloc` of the trace has its
/// own; a block live at the first entry has its stack at the end, or that of the entry that
/// frees it.
pub(super) fn alloc_info(snap: &Snapshot, p: &Prepared) -> Vec<(u64, Option<StackId>)> {
    let trace = snap.trace(p.device);
    let mut info: Vec<(u64, Option<StackId>)> = vec![(0, None); p.plan.arefs];
    let end_stack: FxHashMap<u64, Option<StackId>> = snap
        .segments_of(p.device)
        .flat_map(|s| s.blocks.iter())
        .map(|b| (b.address, b.stack))
        .collect();
    // The first entry at each initial allocation's address, in one pass.
    let mut first: FxHashMap<u64, Option<usize>> =
        p.init.allocs.iter().map(|a| (a.addr, None)).collect();
    for (i, e) in trace.iter().enumerate() {
        if let Some(slot) = first.get_mut(&e.addr) {
            slot.get_or_insert(i);
        }
    }
    for (i, a) in p.init.allocs.iter().enumerate() {
        let freed_by = first
            .get(&a.addr)
            .copied()
            .flatten()
            .and_then(|k| trace.get(k))
            .filter(|e| matches!(e.action, Action::FreeRequested | Action::FreeCompleted));
        let stack = match freed_by {
            Some(e) => e.stack(),
            None => end_stack.get(&a.addr).copied().flatten(),
        };
        info[i] = (a.requested, stack);
    }
    for (entry, aref) in p.plan.alloc_arefs(trace) {
        if let (Some(slot), Some(e)) = (info.get_mut(aref as usize), trace.get(entry)) {
            *slot = (e.size, e.stack());
        }
    }
    info
}

/// The model's segment events of one request, as trace entries.
fn segment_entries(events: &[SegEvent], at: &TraceEntry, out: &mut Vec<TraceEntry>) {
    for ev in events {
        let action = match ev.kind {
            SegKind::SegmentAlloc => Action::SegmentAlloc,
            SegKind::SegmentFree => Action::SegmentFree,
            SegKind::SegmentMap => Action::SegmentMap,
            SegKind::SegmentUnmap => Action::SegmentUnmap,
        };
        out.push(
            TraceEntry::new(action, ev.addr, ev.size, at.stream)
                .with_time_us(at.time_us())
                .with_stack(at.stack()),
        );
    }
}

/// `snap` with `device`'s segments and trace replaced by the model's.
fn snapshot(
    snap: &Snapshot,
    device: i64,
    segments: Vec<Segment>,
    trace: Vec<TraceEntry>,
) -> Snapshot {
    let mut out = snap.clone();
    out.segments.retain(|s| s.device != device);
    out.segments.extend(segments);
    if let Some(traces) = out.device_traces.as_mut()
        && let Some(t) = usize::try_from(device).ok().and_then(|d| traces.get_mut(d))
    {
        *t = trace;
    }
    out.dropped_trace_entries = 0;
    out
}

/// The model's segments of `device` as a snapshot has them: blocks of each live segment in
/// address order (an expandable segment is one segment per mapped run), requested sizes and
/// stacks from `info` by the allocation reference that holds each block (`addr_of`).
fn model_segments(
    device: i64,
    m: &Model,
    addr_of: &AddrOf,
    info: &[(u64, Option<StackId>)],
) -> Vec<Segment> {
    // Model address → allocation reference, for the live blocks.
    // By reference, so a later one holding the same address wins, as it always has.
    let at: FxHashMap<u64, u32> = addr_of.sorted().into_iter().map(|(r, a)| (a, r)).collect();
    let mut current: Option<(u32, Segment)> = None;
    let mut segments: Vec<Segment> = Vec::new();
    for (addr, b) in m.blocks.sorted() {
        let Some(seg) = m.segs.get(b.seg as usize) else {
            continue;
        };
        if !seg.alive {
            continue;
        }
        let contiguous = current
            .as_ref()
            .is_some_and(|(i, s)| *i == b.seg && s.address.saturating_add(s.total_size) == addr);
        if b.state == St::Unmapped || !contiguous {
            segments.extend(current.take().map(|(_, s)| s));
        }
        let (requested, stack) = at
            .get(&addr)
            .and_then(|&r| info.get(r as usize))
            .copied()
            .unwrap_or((0, None));
        let (state, requested, stack) = match b.state {
            St::Unmapped => continue,
            St::Free => (BlockState::Inactive, 0, None),
            St::Alloc => (BlockState::ActiveAllocated, requested, stack),
            St::Pending => (BlockState::ActivePendingFree, requested, stack),
        };
        let s = &mut current
            .get_or_insert_with(|| {
                (
                    b.seg,
                    Segment {
                        device,
                        address: addr,
                        total_size: 0,
                        allocated_size: 0,
                        active_size: 0,
                        requested_size: 0,
                        stream: seg.stream,
                        segment_type: Some(if seg.small { "small" } else { "large" }.into()),
                        is_expandable: seg.expandable,
                        pool_id: None,
                        stack: None,
                        blocks: Vec::new(),
                    },
                )
            })
            .1;
        s.total_size = s.total_size.saturating_add(b.size);
        if state != BlockState::Inactive {
            s.active_size = s.active_size.saturating_add(b.size);
            s.requested_size = s.requested_size.saturating_add(requested);
        }
        if state == BlockState::ActiveAllocated {
            s.allocated_size = s.allocated_size.saturating_add(b.size);
        }
        s.blocks.push(Block {
            address: addr,
            size: b.size,
            requested_size: requested,
            state,
            stack,
            history_len: 0,
        });
    }
    segments.extend(current.map(|(_, s)| s));
    segments
}
