//! The snapshot a program would have dumped on a smaller device: its requests replayed through
//! the allocator model with a capacity, up to the first one the device cannot serve.
//!
//! The segments and blocks are the model's at that point (after its OOM path released what it
//! could); the trace is the recorded one up to there with the model's addresses and segment
//! events, closed by an `oom` entry whose `device_free` is what the capacity leaves.

use rustc_hash::FxHashMap;

use super::model::{Malloc, Model, SegEvent, SegKind, St};
use super::run::{Capacity, NONE, OpKind, build_model};
use super::{prepare, validate};
use crate::torch::model::{Action, Block, BlockState, Segment, Snapshot, StackId, TraceEntry};

/// Replay `device`'s requests on a device of `capacity` bytes and return the snapshot at the
/// first request that fails, ending in its `oom` entry. `None` when every request fits, when the
/// unchanged replay does not validate on this device (the model is not the recorded allocator
/// there), or when the memory reserved at the first trace entry is already above `capacity`.
pub fn state_at_capacity(snap: &Snapshot, device: i64, capacity: u64) -> Option<Snapshot> {
    let p = prepare(snap, device);
    if !validate(&p).0.validated {
        return None;
    }
    let (mut m, init_addrs, failures) = build_model(p.settings.clone(), &p.init);
    if failures > 0 || m.reserved > capacity {
        return None;
    }
    let trace = p.trace;
    // Requested size and stack of every allocation reference.
    let mut info: Vec<(u64, Option<StackId>)> = vec![(0, None); p.plan.arefs];
    let end_stack: FxHashMap<u64, Option<StackId>> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .flat_map(|s| s.blocks.iter())
        .map(|b| (b.address, b.stack))
        .collect();
    for (i, a) in p.init.allocs.iter().enumerate() {
        // A block live at the start: its stack at the end, or that of the entry that frees it.
        let freed_by = trace
            .iter()
            .find(|e| e.addr == a.addr)
            .filter(|e| matches!(e.action, Action::FreeRequested | Action::FreeCompleted));
        let stack = match freed_by {
            Some(e) => e.stack(),
            None => end_stack.get(&a.addr).copied().flatten(),
        };
        info[i] = (a.requested, stack);
    }
    for (&entry, &aref) in &p.plan.alloc_aref {
        if let (Some(slot), Some(e)) = (info.get_mut(aref as usize), trace.get(entry)) {
            *slot = (e.size, e.stack());
        }
    }
    let mut addr_of = vec![u64::MAX; p.plan.arefs];
    addr_of[..init_addrs.len()].copy_from_slice(&init_addrs);
    // Model address → allocation reference, for the blocks' stacks at the end.
    let mut at: FxHashMap<u64, u32> = init_addrs
        .iter()
        .enumerate()
        .filter(|(_, a)| **a != u64::MAX)
        .map(|(i, &a)| (a, i as u32))
        .collect();
    let mut dev = Capacity(Some(capacity));
    let mut out: Vec<TraceEntry> = Vec::new();
    for op in &p.plan.request_order {
        m.step = op.step;
        let before = m.events.len();
        let Some(e) = trace.get(op.pos) else {
            continue;
        };
        match op.kind {
            OpKind::Malloc { entry, oom, .. } => {
                let Some(e) = trace.get(entry) else {
                    continue;
                };
                let result = if oom {
                    m.malloc_rounded(e.size, e.stream, &mut dev)
                } else {
                    m.malloc(e.size, e.stream, &mut dev)
                };
                segment_entries(&m.events[before..], e, &mut out);
                match result {
                    Malloc::Ok { addr, .. } if !oom && op.aref != NONE => {
                        if let Some(slot) = addr_of.get_mut(op.aref as usize) {
                            *slot = addr;
                        }
                        at.insert(addr, op.aref);
                        let mut n = e.clone();
                        n.addr = addr;
                        out.push(n);
                    }
                    Malloc::Ok { addr, .. } => {
                        // A recorded OOM that fits here: the program would have used the block;
                        // it never appears in the trace, so it is handed back at once.
                        m.free_requested(addr);
                        m.free_completed(addr);
                    }
                    Malloc::Oom => {
                        let size = if oom {
                            e.size
                        } else {
                            m.settings.round_size(e.size)
                        };
                        out.push(
                            TraceEntry::new(Action::Oom, 0, size, e.stream)
                                .with_time_us(e.time_us())
                                .with_stack(e.stack())
                                .with_device_free(Some(capacity.saturating_sub(m.reserved))),
                        );
                        return Some(snapshot(snap, device, &m, &at, &info, out));
                    }
                }
            }
            OpKind::FreeRequested | OpKind::FreeCompleted => {
                let Some(&addr) = addr_of.get(op.aref as usize) else {
                    continue;
                };
                if addr == u64::MAX {
                    continue;
                }
                if op.kind == OpKind::FreeRequested {
                    m.free_requested(addr);
                } else {
                    m.free_completed(addr);
                    addr_of[op.aref as usize] = u64::MAX;
                }
                let mut n = e.clone();
                n.addr = addr;
                out.push(n);
            }
            OpKind::EmptyCache => {
                m.release_cached_blocks();
                segment_entries(&m.events[before..], e, &mut out);
            }
            // Only in the recorded order.
            OpKind::Probe { .. } => {}
        }
    }
    None
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
    m: &Model,
    at: &FxHashMap<u64, u32>,
    info: &[(u64, Option<StackId>)],
    trace: Vec<TraceEntry>,
) -> Snapshot {
    let mut out = snap.clone();
    out.segments.retain(|s| s.device != device);
    // Blocks of each live segment in address order; an expandable segment is one snapshot
    // segment per mapped run.
    let mut current: Option<(u32, Segment)> = None;
    let mut segments: Vec<Segment> = Vec::new();
    for (&addr, b) in &m.blocks {
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
    out.segments.extend(segments);
    if let Some(traces) = out.device_traces.as_mut()
        && let Some(t) = usize::try_from(device).ok().and_then(|d| traces.get_mut(d))
    {
        *t = trace;
    }
    out.dropped_trace_entries = 0;
    out
}
