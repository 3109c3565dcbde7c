//! Real snapshots changed the way a bug would change them, built in memory at test time (the
//! stacks are third parties': nothing derived from `../shared` is ever written to disk).
//!
//! [`repeat`] turns a real one-step trace into the trace of `steps` steps of the same loop: every
//! step replays the recorded entries with fresh addresses and shifted times. A block that the
//! recorded step frees although it was allocated before the trace began (the previous step's
//! gradients, output or graph) is, from the second step on, the block of the same size that the
//! previous step left live. `keep` names allocations (trace indices of `alloc` entries) that the
//! bug keeps: they are never freed, in any step. The end state is rebuilt to match: the recorded
//! segments stay (the recorded step's end-live blocks become inactive there, since the repeat
//! moved them), and each block live at the end of the new trace gets a segment of its own.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

use memlsp::frames::FrameFilter;
use memlsp::torch::model::{Action, Block, BlockState, Segment, Snapshot, TraceEntry};
use memlsp::torch::stacks::{Role, StackIndex, site_string};

/// Where a recorded free's block came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// An `alloc` of the trace (its index).
    Window(usize),
    /// A block allocated before the trace began (index into [`Step::pre_frees`]).
    Before(usize),
}

/// What one recorded step is made of.
pub struct Step<'a> {
    pub trace: &'a [TraceEntry],
    /// For each free entry, where its block came from.
    source: HashMap<usize, Source>,
    /// `free_completed` entries of blocks allocated before the trace.
    pub pre_frees: Vec<usize>,
    /// `alloc` entries never freed in the trace, in trace order.
    pub end_live: Vec<usize>,
    /// `alloc` index → the `free_completed` index that frees it.
    pub freed_at: HashMap<usize, usize>,
    /// Pre-window free (index into `pre_frees`) → the end-live alloc of equal size that plays
    /// its part one step later.
    partner: Vec<Option<usize>>,
}

impl Step<'_> {
    /// The step is a steady state: every block it frees from before the trace is matched, size
    /// for size, by one it leaves live (and the other way round).
    pub fn steady(&self) -> bool {
        self.partner.iter().all(Option::is_some) && self.pre_frees.len() == self.end_live.len()
    }
}

/// The trace of `device` as one step.
pub fn step(snap: &Snapshot, device: usize) -> Step<'_> {
    let trace: &[TraceEntry] = &snap.device_traces.as_ref().expect("a trace")[device];
    let mut live: HashMap<u64, usize> = HashMap::new();
    // free_requested entries of pre-window blocks waiting for their free_completed.
    let mut requested: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut source = HashMap::new();
    let mut pre_frees = Vec::new();
    let mut freed_at = HashMap::new();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, i);
            }
            Action::FreeRequested => match live.get(&e.addr) {
                Some(&j) => {
                    source.insert(i, Source::Window(j));
                }
                None => requested.entry(e.addr).or_default().push(i),
            },
            Action::FreeCompleted => match live.remove(&e.addr) {
                Some(j) => {
                    freed_at.insert(j, i);
                    source.insert(i, Source::Window(j));
                }
                None => {
                    let k = pre_frees.len();
                    pre_frees.push(i);
                    source.insert(i, Source::Before(k));
                    for r in requested.remove(&e.addr).unwrap_or_default() {
                        source.insert(r, Source::Before(k));
                    }
                }
            },
            _ => {}
        }
    }
    let mut end_live: Vec<usize> = live.into_values().collect();
    end_live.sort_unstable();
    // Pair by size, in order: the k-th pre-window free of a size with the k-th end-live
    // allocation of that size.
    let mut by_size: HashMap<u64, Vec<usize>> = HashMap::new();
    for &j in end_live.iter().rev() {
        by_size.entry(trace[j].size).or_default().push(j);
    }
    let partner = pre_frees
        .iter()
        .map(|&i| by_size.get_mut(&trace[i].size).and_then(Vec::pop))
        .collect();
    Step {
        trace,
        source,
        pre_frees,
        end_live,
        freed_at,
        partner,
    }
}

/// A block of the new trace: size, stack, stream.
type Fresh = (u64, Option<u32>, u64);

fn round_block(size: u64) -> u64 {
    size.max(1).div_ceil(512) * 512
}

/// `steps` repetitions of `device`'s recorded step, the allocations in `keep` never freed.
pub fn repeat(snap: &Snapshot, device: usize, steps: usize, keep: &HashSet<usize>) -> Snapshot {
    let st = step(snap, device);
    let trace = st.trace;
    let dev = device as i64;
    // Fresh addresses start above everything recorded.
    let top = snap
        .segments
        .iter()
        .map(|s| s.address.saturating_add(s.total_size))
        .chain(trace.iter().map(|e| e.addr.saturating_add(e.size)))
        .max()
        .unwrap_or(0);
    let mut next = (top >> 30).saturating_add(1) << 30;
    let times: Vec<i64> = trace.iter().filter_map(TraceEntry::time_us).collect();
    let span = match (times.iter().min(), times.iter().max()) {
        (Some(a), Some(b)) => b - a + 1000,
        _ => 0,
    };
    let mut out: Vec<TraceEntry> = Vec::with_capacity(trace.len() * steps);
    // Fresh address of each alloc in the previous and the current step.
    let mut prev: HashMap<usize, u64> = HashMap::new();
    // Fresh blocks live now: address → (block size, stack, stream).
    let mut live: HashMap<u64, Fresh> = HashMap::new();
    for k in 0..steps {
        let mut cur: HashMap<usize, u64> = HashMap::new();
        let shift = |e: &TraceEntry| e.time_us().map(|t| t + span * k as i64);
        for (i, e) in trace.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    let addr = next;
                    let size = round_block(e.size);
                    next += size;
                    cur.insert(i, addr);
                    live.insert(addr, (size, e.stack(), e.stream));
                    let mut n = e.clone();
                    n.addr = addr;
                    n.set_time_us(shift(e));
                    out.push(n);
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    let addr = match st.source.get(&i) {
                        Some(Source::Window(j)) if keep.contains(j) => None,
                        Some(Source::Window(j)) => cur.get(j).copied(),
                        Some(Source::Before(_)) if k == 0 => Some(e.addr),
                        Some(Source::Before(p)) => match st.partner[*p] {
                            Some(j) if !keep.contains(&j) => prev.get(&j).copied(),
                            _ => None,
                        },
                        None => None,
                    };
                    let Some(addr) = addr else { continue };
                    if e.action == Action::FreeCompleted {
                        live.remove(&addr);
                    }
                    let mut n = e.clone();
                    n.addr = addr;
                    n.set_time_us(shift(e));
                    out.push(n);
                }
                // Segment events name recorded addresses the repeat does not use; an OOM or
                // a marker belongs to the recorded run, not to the loop.
                _ => {}
            }
        }
        prev = cur;
    }
    let mut snap2 = snap.clone();
    // The recorded step's end-live blocks moved to fresh addresses.
    let moved: HashSet<u64> = st.end_live.iter().map(|&j| trace[j].addr).collect();
    for seg in snap2.segments.iter_mut().filter(|s| s.device == dev) {
        for b in &mut seg.blocks {
            if b.state == BlockState::ActiveAllocated && moved.contains(&b.address) {
                b.state = BlockState::Inactive;
                b.stack = None;
                seg.allocated_size = seg.allocated_size.saturating_sub(b.size);
                seg.active_size = seg.active_size.saturating_sub(b.size);
                seg.requested_size = seg.requested_size.saturating_sub(b.requested_size);
            }
        }
    }
    let mut fresh: Vec<(u64, Fresh)> = live.into_iter().collect();
    fresh.sort_unstable_by_key(|(a, _)| *a);
    for (addr, (size, stack, stream)) in fresh {
        snap2.segments.push(Segment {
            device: dev,
            address: addr,
            total_size: size,
            allocated_size: size,
            active_size: size,
            requested_size: size,
            stream,
            segment_type: Some(if size <= 1 << 20 { "small" } else { "large" }.into()),
            is_expandable: false,
            pool_id: None,
            stack,
            blocks: vec![Block {
                address: addr,
                size,
                requested_size: size,
                state: BlockState::ActiveAllocated,
                stack,
                history_len: 0,
            }],
        });
    }
    snap2.device_traces.as_mut().expect("a trace")[device] = out;
    snap2
}

/// Stack facts the tests choose allocations by.
pub struct Stacks<'a> {
    snap: &'a Snapshot,
    index: StackIndex,
}

impl<'a> Stacks<'a> {
    pub fn new(snap: &'a Snapshot) -> Stacks<'a> {
        Stacks {
            snap,
            index: StackIndex::new(snap, &FrameFilter::default()),
        }
    }
    pub fn role(&self, e: &TraceEntry) -> Role {
        self.index.role(e.stack())
    }
    /// `file:line:function` of the frame the entry is attributed to.
    pub fn site(&self, e: &TraceEntry) -> String {
        site_string(self.snap, self.index.site(e.stack()).0)
    }
}

/// Every live block of the snapshot lies inside its segment, and no two overlap.
pub fn assert_consistent(snap: &Snapshot) {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for s in &snap.segments {
        let mut at = s.address;
        for b in &s.blocks {
            assert_eq!(b.address, at, "blocks tile their segment");
            at += b.size;
        }
        assert_eq!(at, s.address + s.total_size, "blocks fill their segment");
        ranges.push((s.address, s.address + s.total_size));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "segments overlap: {w:?}");
    }
    // Replaying each trace forward from its start, every free finds its block and the blocks
    // live at the end are the segments' allocated blocks.
    let Some(traces) = &snap.device_traces else {
        return;
    };
    for (d, trace) in traces.iter().enumerate() {
        let mut live: HashSet<u64> = snap
            .segments
            .iter()
            .filter(|s| s.device == d as i64)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.address)
            .collect();
        // Undo the trace backwards: the state before the first entry.
        for e in trace.iter().rev() {
            match e.action {
                Action::Alloc => assert!(live.remove(&e.addr), "alloc {:#x} not live", e.addr),
                Action::FreeCompleted => {
                    assert!(live.insert(e.addr), "free {:#x} of a live block", e.addr)
                }
                _ => {}
            }
        }
        // And forward again.
        for e in trace {
            match e.action {
                Action::Alloc => assert!(live.insert(e.addr), "alloc {:#x} overlaps", e.addr),
                Action::FreeCompleted => assert!(live.remove(&e.addr), "free of {:#x}", e.addr),
                _ => {}
            }
        }
    }
}
