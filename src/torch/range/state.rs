//! The allocator state of one device after trace entry `B − 1`, rebuilt backwards from the
//! snapshot's own state by undoing entries `B..n` — the same reasoning as `timeline::live_at`,
//! extended to segments and block layout. It costs one pass over the entries after the range
//! (hash-map updates, no allocator model), so a range costs the analyses of its own entries plus
//! this pass, never a replay of everything before it.
//!
//! What is exact: which segments exist (undoing `segment_alloc`/`segment_map` and their frees),
//! which blocks are active at `B` (undoing `alloc`, `free_requested` and `free_completed`), their
//! addresses and requested sizes. What is not recorded: the rounded size of a block freed after
//! `B` (a trace entry holds the requested size); it is rounded as the allocator rounds a request
//! (512 B multiples, docs/RANGE.md), the rest of each segment is one inactive block per gap.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::torch::model::{Action, Block, BlockState, Segment, Snapshot, StackId, TraceEntry};

/// A block live at the rebuilt point.
#[derive(Clone, Copy)]
struct Live {
    size: u64,
    requested: u64,
    pending: bool,
    stack: Option<StackId>,
}

/// Segment facts kept while undoing (address → segment without its blocks).
struct Seg {
    total_size: u64,
    stream: u64,
    segment_type: Option<String>,
    is_expandable: bool,
    pool_id: Option<(i64, i64)>,
    stack: Option<StackId>,
}

/// The allocator's rounding of a request (`round_size`: at least 512 B, 512 B multiples).
fn rounded(requested: u64) -> u64 {
    requested.max(1).div_ceil(512).saturating_mul(512)
}

/// Segments of `device` just after entries `0..b` (`b < n`), in address order.
pub(super) fn segments_at(
    snap: &Snapshot,
    device: i64,
    list: &[TraceEntry],
    b: usize,
) -> Vec<Segment> {
    let mut segs: BTreeMap<u64, Seg> = BTreeMap::new();
    let mut live: FxHashMap<u64, Live> = FxHashMap::default();
    for s in snap.segments_of(device) {
        segs.insert(
            s.address,
            Seg {
                total_size: s.total_size,
                stream: s.stream,
                segment_type: s.segment_type.clone(),
                is_expandable: s.is_expandable,
                pool_id: s.pool_id,
                stack: s.stack,
            },
        );
        for bl in &s.blocks {
            let pending = match bl.state {
                BlockState::ActiveAllocated => false,
                BlockState::ActivePendingFree => true,
                _ => continue,
            };
            live.insert(
                bl.address,
                Live {
                    size: bl.size,
                    requested: bl.requested_size,
                    pending,
                    stack: bl.stack,
                },
            );
        }
    }
    for e in list[b.min(list.len())..].iter().rev() {
        match e.action {
            Action::Alloc => {
                live.remove(&e.addr);
            }
            Action::FreeRequested => {
                if let Some(l) = live.get_mut(&e.addr) {
                    l.pending = false;
                }
            }
            Action::FreeCompleted => {
                live.insert(
                    e.addr,
                    Live {
                        size: rounded(e.size),
                        requested: e.size,
                        pending: true,
                        stack: e.stack(),
                    },
                );
            }
            Action::SegmentAlloc | Action::SegmentMap => unmap(&mut segs, e.addr, e.size),
            Action::SegmentFree | Action::SegmentUnmap => {
                let expandable = e.action == Action::SegmentUnmap;
                segs.insert(
                    e.addr,
                    Seg {
                        total_size: e.size,
                        stream: e.stream,
                        segment_type: Some(
                            if e.size <= 2 << 20 && !expandable {
                                "small"
                            } else {
                                "large"
                            }
                            .into(),
                        ),
                        is_expandable: expandable,
                        pool_id: None,
                        stack: e.stack(),
                    },
                );
            }
            _ => {}
        }
    }
    // A free before `B` completed before it too: a block still `pending` at `B` had its
    // `free_requested` before `B` (its undo left it pending) — unless the request was after `B`,
    // which the undo of `free_requested` already cleared.
    let mut blocks: Vec<(u64, Live)> = live.into_iter().collect();
    blocks.sort_unstable_by_key(|(a, _)| *a);
    let mut out = Vec::with_capacity(segs.len());
    let mut next = 0;
    for (addr, s) in segs {
        let end = addr.saturating_add(s.total_size);
        while next < blocks.len() && blocks[next].0 < addr {
            next += 1;
        }
        let mut seg = Segment {
            device,
            address: addr,
            total_size: s.total_size,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: s.stream,
            segment_type: s.segment_type,
            is_expandable: s.is_expandable,
            pool_id: s.pool_id,
            stack: s.stack,
            blocks: Vec::new(),
        };
        let mut at = addr;
        while next < blocks.len() && blocks[next].0 < end {
            let (a, l) = blocks[next];
            next += 1;
            if a < at {
                continue;
            }
            if a > at {
                seg.blocks.push(inactive(at, a - at));
            }
            let size = l.size.min(end - a);
            seg.active_size = seg.active_size.saturating_add(size);
            seg.requested_size = seg.requested_size.saturating_add(l.requested);
            if !l.pending {
                seg.allocated_size = seg.allocated_size.saturating_add(size);
            }
            seg.blocks.push(Block {
                address: a,
                size,
                requested_size: l.requested,
                state: if l.pending {
                    BlockState::ActivePendingFree
                } else {
                    BlockState::ActiveAllocated
                },
                stack: l.stack,
                history_len: 0,
            });
            at = a + size;
        }
        if at < end {
            seg.blocks.push(inactive(at, end - at));
        }
        out.push(seg);
    }
    out
}

fn inactive(address: u64, size: u64) -> Block {
    Block {
        address,
        size,
        requested_size: 0,
        state: BlockState::Inactive,
        stack: None,
        history_len: 0,
    }
}

/// Undo a mapping of `[addr, addr + size)`: the segment that starts there goes, or the run is cut
/// out of the (expandable) segment holding it.
fn unmap(segs: &mut BTreeMap<u64, Seg>, addr: u64, size: u64) {
    let Some((&start, _)) = segs.range(..=addr).next_back() else {
        return;
    };
    let Some(s) = segs.remove(&start) else {
        return;
    };
    let end = start.saturating_add(s.total_size);
    let cut_end = addr.saturating_add(size);
    if addr >= end {
        segs.insert(start, s);
        return;
    }
    if cut_end < end {
        segs.insert(
            cut_end,
            Seg {
                total_size: end - cut_end,
                stream: s.stream,
                segment_type: s.segment_type.clone(),
                is_expandable: s.is_expandable,
                pool_id: s.pool_id,
                stack: s.stack,
            },
        );
    }
    if addr > start {
        segs.insert(
            start,
            Seg {
                total_size: addr - start,
                ..s
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch::totals::tests::{block, entry, segment};

    #[test]
    fn undoing_the_entries_after_b_gives_the_blocks_and_segments_at_b() {
        // At the dump: one 2 MiB segment with a 1024 B block at 0x1000 (allocated after B).
        // After B: alloc 0x1000, free of 0x1400 (live at B), segment_alloc of 0x400000.
        let seg = segment(
            0,
            0x1000,
            vec![
                block(1024, 1000, BlockState::ActiveAllocated),
                block((2 << 20) - 1024, 0, BlockState::Inactive),
            ],
        );
        let snap = Snapshot {
            segments: vec![seg],
            ..Snapshot::default()
        };
        let list = vec![
            entry(Action::Alloc, 0x9000, 1),
            entry(Action::Alloc, 0x1000, 1000),
            entry(Action::FreeRequested, 0x1400, 700),
            entry(Action::FreeCompleted, 0x1400, 700),
            entry(Action::SegmentAlloc, 0x400000, 2 << 20),
            entry(Action::SegmentFree, 0x400000, 2 << 20),
        ];
        let at = segments_at(&snap, 0, &list, 1);
        assert_eq!(
            at.len(),
            1,
            "the segment mapped and freed after B is gone, as at B"
        );
        let b = &at[0].blocks;
        let active: Vec<_> = b
            .iter()
            .filter(|b| b.state != BlockState::Inactive)
            .map(|b| (b.address, b.size, b.requested_size, b.state.clone()))
            .collect();
        assert_eq!(
            active,
            vec![(0x1400, 1024, 700, BlockState::ActiveAllocated)]
        );
        assert_eq!(b.iter().map(|b| b.size).sum::<u64>(), 2 << 20);
        assert_eq!(at[0].allocated_size, 1024);
    }
}
