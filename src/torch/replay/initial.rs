//! The allocator state at a device's first trace entry, rebuilt by walking its trace backwards
//! from the snapshot's segments (as PyTorch's MemoryViz does): undo each `alloc`,
//! `free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `segment_map` and
//! `segment_unmap`.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use super::model::ES_DEFAULT_SPAN;
use super::settings::{LARGE_BUFFER, SMALL_BUFFER, SMALL_SIZE, Settings};
use crate::torch::model::{Action, BlockState, Segment, TraceEntry};

/// A cudaMalloc'd segment at the start.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct InitSeg {
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub small: bool,
}

/// One expandable segment: its address range and the parts mapped at the start.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct InitEs {
    pub base: u64,
    pub span: u64,
    pub stream: u64,
    pub small: bool,
    /// Mapped ranges `(start, end)`.
    pub mapped: Vec<(u64, u64)>,
}

/// A block in use (or awaiting its `free_completed`) at the start.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct InitAlloc {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub pending: bool,
    /// The size was inferred from the request (the block was freed during the trace).
    pub inferred: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct InitialState {
    pub segs: Vec<InitSeg>,
    pub es: Vec<InitEs>,
    pub allocs: Vec<InitAlloc>,
    /// Trace entries that contradict the state (count, first description).
    pub problems: u64,
    pub first_problem: Option<String>,
    /// The backward walk stopped at this trace entry, the first (from the end) that
    /// contradicts the state the snapshot ends in: the trace does not fit its segments, the
    /// state above is not built and nothing is replayed.
    pub contradicted_at: Option<usize>,
}

impl InitialState {
    fn problem(&mut self, what: impl FnOnce() -> String) {
        self.problems += 1;
        if self.first_problem.is_none() {
            self.first_problem = Some(what());
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Live {
    size: Option<u64>,
    requested: u64,
    pending: bool,
}

/// The blocks live at the current point of the backward walk, by address: a hash map (the walk
/// asks once per trace entry), with a count per 2 MiB of address space for the rare question
/// "is a block live in `[a, b)`" (at segment events). Segments are 2 MiB multiples at 2 MiB
/// boundaries, so whole buckets answer it; a range that cuts a bucket holding blocks (a corrupt
/// or unusual trace) is answered from an ordered index of the addresses instead, built then
/// and kept from there on. Either way the answer is the ordered map's.
#[derive(Default)]
struct LiveSet {
    map: FxHashMap<u64, Live>,
    buckets: FxHashMap<u64, u32>,
    ordered: Option<BTreeSet<u64>>,
}

const BUCKET_SHIFT: u32 = 21;

impl LiveSet {
    fn insert(&mut self, addr: u64, l: Live) {
        if self.map.insert(addr, l).is_none() {
            *self.buckets.entry(addr >> BUCKET_SHIFT).or_default() += 1;
            if let Some(o) = self.ordered.as_mut() {
                o.insert(addr);
            }
        }
    }

    fn remove(&mut self, addr: u64) -> Option<Live> {
        let l = self.map.remove(&addr)?;
        if let Some(c) = self.buckets.get_mut(&(addr >> BUCKET_SHIFT)) {
            *c = c.saturating_sub(1);
        }
        if let Some(o) = self.ordered.as_mut() {
            o.remove(&addr);
        }
        Some(l)
    }

    fn get_mut(&mut self, addr: u64) -> Option<&mut Live> {
        self.map.get_mut(&addr)
    }

    fn contains(&self, addr: u64) -> bool {
        self.map.contains_key(&addr)
    }

    /// Is a block live at an address in `[a, e)`?
    fn any_in(&mut self, a: u64, e: u64) -> bool {
        if a >= e {
            return false;
        }
        if let Some(o) = &self.ordered {
            return o.range(a..e).next().is_some();
        }
        let (b0, b1) = (a >> BUCKET_SHIFT, (e - 1) >> BUCKET_SHIFT);
        let inside = |b: u64| {
            let lo = u128::from(b) << BUCKET_SHIFT;
            lo >= u128::from(a) && lo + (1u128 << BUCKET_SHIFT) <= u128::from(e)
        };
        // The occupied buckets the range meets: by number, or through the map when fewer.
        let met: Vec<u64> = if b1 - b0 < self.buckets.len() as u64 {
            (b0..=b1)
                .filter(|b| self.buckets.get(b).is_some_and(|&c| c > 0))
                .collect()
        } else {
            self.buckets
                .iter()
                .filter(|&(&b, &c)| c > 0 && b0 <= b && b <= b1)
                .map(|(&b, _)| b)
                .collect()
        };
        if met.iter().any(|&b| inside(b)) {
            return true;
        }
        if met.is_empty() {
            return false;
        }
        // The range cuts an occupied bucket: answer from the addresses in order.
        let o: BTreeSet<u64> = self.map.keys().copied().collect();
        let hit = o.range(a..e).next().is_some();
        self.ordered = Some(o);
        hit
    }

    /// Every live block, by address.
    fn into_ordered(self) -> BTreeMap<u64, Live> {
        let mut v: Vec<(u64, Live)> = self.map.into_iter().collect();
        v.sort_unstable_by_key(|x| x.0);
        v.into_iter().collect()
    }
}

/// Sorted disjoint ranges `[start, end)`.
#[derive(Clone, Debug, Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    fn add(&mut self, a: u64, b: u64) {
        let (mut a, mut b) = (a, b);
        if let Some((&s, &e)) = self.0.range(..=a).next_back()
            && e >= a
        {
            a = s;
            b = b.max(e);
            self.0.remove(&s);
        }
        let inside: Vec<(u64, u64)> = self.0.range(a..=b).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in inside {
            b = b.max(e);
            self.0.remove(&s);
        }
        self.0.insert(a, b);
    }

    /// Remove `[a, b)`; `false` when it was not wholly inside one range.
    fn remove(&mut self, a: u64, b: u64) -> bool {
        let Some((&s, &e)) = self.0.range(..=a).next_back() else {
            return false;
        };
        if e < b {
            return false;
        }
        self.0.remove(&s);
        if s < a {
            self.0.insert(s, a);
        }
        if b < e {
            self.0.insert(b, e);
        }
        true
    }
}

/// Which expandable segment an address belongs to.
#[derive(Clone, Debug)]
struct EsInfo {
    stream: u64,
    small: bool,
    lo: u64,
    hi: u64,
    ranges: Ranges,
}

/// Rebuild the state before `trace[0]` from the device's `segments`.
pub(crate) fn rebuild(
    segments: &[&Segment],
    trace: &[TraceEntry],
    settings: &Settings,
) -> InitialState {
    rebuild_with(segments, trace, settings, true)
}

/// Non-expandable segments by address: (size, stream, small).
type Segs = BTreeMap<u64, (u64, u64, bool)>;
/// The regions blocks live in, by start: (end, small, expandable).
type Regions = BTreeMap<u64, (u64, bool, bool)>;

/// [`rebuild`]; `stop`: stop at the first contradiction (else walk on, counting them: the
/// state the model is then given is whatever the trace leaves, as tests of its cost want).
pub(crate) fn rebuild_with(
    segments: &[&Segment],
    trace: &[TraceEntry],
    settings: &Settings,
    stop: bool,
) -> InitialState {
    let mut st = InitialState::default();
    let mut segs = Segs::new();
    let mut es: Vec<EsInfo> = Vec::new();
    let mut live = LiveSet::default();
    end_state(segments, &mut st, &mut segs, &mut es, &mut live);
    map_extents(trace, settings, &mut es);
    if walk_back(trace, stop, &mut st, &mut segs, &mut es, &mut live) {
        return st;
    }
    let live = live.into_ordered();
    let regions = layout(&segs, &es, &mut st);
    let ends = block_ends(trace, &live, &regions);
    size_blocks(&live, &regions, &ends, settings, &mut st);
    st
}

/// The expandable segment of `stream` and pool, added when there is none yet.
fn find_es(es: &mut Vec<EsInfo>, stream: u64, small: bool) -> usize {
    match es
        .iter()
        .position(|e| e.stream == stream && e.small == small)
    {
        Some(i) => i,
        None => {
            es.push(EsInfo {
                stream,
                small,
                lo: u64::MAX,
                hi: 0,
                ranges: Ranges::default(),
            });
            es.len() - 1
        }
    }
}

/// The state the snapshot ends in: its segments, expandable ranges and live blocks.
fn end_state(
    segments: &[&Segment],
    st: &mut InitialState,
    segs: &mut Segs,
    es: &mut Vec<EsInfo>,
    live: &mut LiveSet,
) {
    for s in segments {
        let small = s.segment_type.as_deref() == Some("small");
        let end = s.address.saturating_add(s.total_size);
        if s.is_expandable {
            let i = find_es(es, s.stream, small);
            es[i].ranges.add(s.address, end);
            es[i].lo = es[i].lo.min(s.address);
            es[i].hi = es[i].hi.max(end);
        } else {
            segs.insert(s.address, (s.total_size, s.stream, small));
        }
        for b in &s.blocks {
            let pending = match b.state {
                BlockState::ActiveAllocated => false,
                BlockState::ActivePendingFree => true,
                BlockState::Inactive => continue,
                BlockState::Other(_) => {
                    st.problem(|| {
                        format!("block state {:?} at {:#x}", b.state.as_str(), b.address)
                    });
                    continue;
                }
            };
            live.insert(
                b.address,
                Live {
                    size: Some(b.size),
                    requested: b.requested_size,
                    pending,
                },
            );
        }
    }
}

/// Expandable ranges that the trace maps or unmaps widen (or add) their segment's extent.
fn map_extents(trace: &[TraceEntry], settings: &Settings, es: &mut Vec<EsInfo>) {
    // Expandable ranges that the trace maps: the pool is the one of the request that follows
    // (on the same stream), found for every map in one backward pass (a forward search from
    // each map made a trace of maps without requests quadratic).
    let mut next_small: FxHashMap<usize, bool> = FxHashMap::default();
    // The entries that map or unmap, found in one pass (most traces have none).
    let maps: Vec<usize> = trace
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap))
        .map(|(i, _)| i)
        .collect();
    if maps.iter().any(|&i| trace[i].action == Action::SegmentMap) {
        let mut latest: FxHashMap<u64, bool> = FxHashMap::default();
        for (i, n) in trace.iter().enumerate().rev() {
            match n.action {
                Action::Alloc | Action::Oom => {
                    let size = if n.action == Action::Alloc {
                        settings.round_size(n.size)
                    } else {
                        n.size
                    };
                    latest.insert(n.stream, size <= SMALL_SIZE);
                }
                Action::SegmentMap => {
                    if let Some(&small) = latest.get(&n.stream) {
                        next_small.insert(i, small);
                    }
                }
                _ => {}
            }
        }
    }
    for i in maps {
        let e = &trace[i];
        let end = e.addr.saturating_add(e.size);
        let known = es.iter().position(|x| {
            x.stream == e.stream && x.lo <= e.addr && e.addr < x.hi.max(x.lo.saturating_add(1))
        });
        let idx = match known {
            Some(k) => k,
            None if e.action == Action::SegmentMap => {
                let small = next_small
                    .get(&i)
                    .copied()
                    .unwrap_or(e.size % LARGE_BUFFER != 0);
                find_es(es, e.stream, small)
            }
            None => {
                // Nearest known expandable segment of that stream below the address.
                let below = es
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.stream == e.stream && x.lo <= e.addr)
                    .max_by_key(|(_, x)| x.lo)
                    .map(|(k, _)| k);
                match below {
                    Some(k) => k,
                    None => find_es(es, e.stream, e.size % LARGE_BUFFER != 0),
                }
            }
        };
        es[idx].lo = es[idx].lo.min(e.addr);
        es[idx].hi = es[idx].hi.max(end);
    }
}

/// Walk the trace backwards from the end state, undoing each entry. With `stop`, stops at the
/// first entry that contradicts the state (`st.contradicted_at`) and returns `true`.
fn walk_back(
    trace: &[TraceEntry],
    stop: bool,
    st: &mut InitialState,
    segs: &mut Segs,
    es: &mut [EsInfo],
    live: &mut LiveSet,
) -> bool {
    // Walk backwards, up to the first entry that contradicts the state.
    for (k, e) in trace.iter().enumerate().rev() {
        if stop && st.problems > 0 {
            st.contradicted_at = Some(k + 1);
            return true;
        }
        match e.action {
            Action::Alloc => {
                let was_live = live.remove(e.addr).is_some();
                if !was_live {
                    st.problem(|| format!("alloc at {:#x} is not live afterwards", e.addr));
                }
            }
            Action::FreeRequested => match live.get_mut(e.addr) {
                Some(l) if l.pending => l.pending = false,
                Some(_) => st.problem(|| format!("free_requested of {:#x} twice", e.addr)),
                None => {
                    st.problem(|| format!("free_requested of {:#x} never completes", e.addr));
                    live.insert(
                        e.addr,
                        Live {
                            size: None,
                            requested: e.size,
                            pending: false,
                        },
                    );
                }
            },
            Action::FreeCompleted => {
                if live.contains(e.addr) {
                    st.problem(|| format!("free_completed of {:#x}, live afterwards", e.addr));
                }
                live.insert(
                    e.addr,
                    Live {
                        size: None,
                        requested: e.size,
                        pending: true,
                    },
                );
            }
            Action::SegmentAlloc => {
                match segs.remove(&e.addr) {
                    Some((size, _, _)) if size == e.size => {}
                    _ => {
                        st.problem(|| format!("segment_alloc {:#x} not in the later state", e.addr))
                    }
                }
                let end = e.addr.saturating_add(e.size);
                if live.any_in(e.addr, end) {
                    st.problem(|| format!("segment_alloc {:#x} holds blocks already", e.addr));
                }
            }
            Action::SegmentFree => {
                if segs.contains_key(&e.addr) {
                    st.problem(|| format!("segment_free {:#x} still present afterwards", e.addr));
                }
                segs.insert(e.addr, (e.size, e.stream, e.size == SMALL_BUFFER));
            }
            Action::SegmentMap | Action::SegmentUnmap => {
                let end = e.addr.saturating_add(e.size);
                let owner = es
                    .iter()
                    .position(|x| x.stream == e.stream && x.lo <= e.addr && e.addr < x.hi);
                let Some(k) = owner else {
                    st.problem(|| {
                        format!("{} {:#x}: no expandable segment", e.action.as_str(), e.addr)
                    });
                    continue;
                };
                if e.action == Action::SegmentMap {
                    if !es[k].ranges.remove(e.addr, end) {
                        st.problem(|| format!("segment_map {:#x} not mapped afterwards", e.addr));
                    }
                    if live.any_in(e.addr, end) {
                        st.problem(|| format!("segment_map {:#x} holds blocks already", e.addr));
                    }
                } else {
                    es[k].ranges.add(e.addr, end);
                }
            }
            _ => {}
        }
    }

    if stop && st.problems > 0 {
        st.contradicted_at = Some(0);
        return true;
    }
    false
}

/// The segments and expandable ranges at the start (into `st`), and the regions blocks live in.
fn layout(segs: &Segs, es: &[EsInfo], st: &mut InitialState) -> Regions {
    // The regions blocks live in, in address order: (start, end, small, expandable).
    let mut regions: BTreeMap<u64, (u64, bool, bool)> = BTreeMap::new();
    for (&a, &(size, stream, small)) in segs {
        regions.insert(a, (a.saturating_add(size), small, false));
        st.segs.push(InitSeg {
            addr: a,
            size,
            stream,
            small,
        });
    }
    for x in es {
        for (&s, &e) in &x.ranges.0 {
            regions.insert(s, (e, x.small, true));
        }
    }

    // Expandable address ranges: from the lowest address seen up to the next thing above.
    let mut starts: Vec<u64> = segs.keys().copied().collect();
    starts.extend(es.iter().filter(|x| x.lo != u64::MAX).map(|x| x.lo));
    starts.sort_unstable();
    for x in es.iter().filter(|x| x.lo != u64::MAX) {
        let page = if x.small { SMALL_BUFFER } else { LARGE_BUFFER };
        let next = starts
            .iter()
            .find(|&&s| s > x.lo)
            .copied()
            .unwrap_or(u64::MAX);
        let cap = x.lo.saturating_add(ES_DEFAULT_SPAN);
        let limit = next.min(cap).max(x.hi);
        let span = (limit - x.lo) / page * page;
        st.es.push(InitEs {
            base: x.lo,
            span: span.max(x.hi - x.lo),
            stream: x.stream,
            small: x.small,
            mapped: x.ranges.0.iter().map(|(&s, &e)| (s, e)).collect(),
        });
    }
    regions
}

/// The ends of the blocks of unknown size that the trace's later allocations reveal.
fn block_ends(
    trace: &[TraceEntry],
    live: &BTreeMap<u64, Live>,
    regions: &Regions,
) -> BTreeMap<u64, u64> {
    // A block freed during the trace has no recorded size. An allocation always takes the start
    // of a free block, so the live block just below it ends where it begins: when that is one of
    // these blocks, its size is known.
    let mut ends: BTreeMap<u64, u64> = BTreeMap::new();
    // Only the blocks of unknown size need the walk, and only until each has its end or is
    // freed (a block inserted by the walk is always known): most traces have none, or free
    // them early.
    let mut open = live.values().filter(|l| l.size.is_none()).count();
    if open > 0 {
        let mut cur: BTreeMap<u64, bool> =
            live.iter().map(|(&a, l)| (a, l.size.is_none())).collect();
        for e in trace {
            if open == 0 {
                break;
            }
            match e.action {
                Action::Alloc => {
                    if let Some((&p, &unknown)) = cur.range(..e.addr).next_back()
                        && unknown
                        && !ends.contains_key(&p)
                        && regions
                            .range(..=p)
                            .next_back()
                            .is_some_and(|(_, &(rend, _, _))| e.addr < rend)
                    {
                        ends.insert(p, e.addr);
                        open -= 1;
                    }
                    if cur.insert(e.addr, false) == Some(true) && !ends.contains_key(&e.addr) {
                        // An unknown block's address allocated again without a free: the
                        // block is no longer the one that may get an end.
                        open -= 1;
                    }
                }
                Action::FreeCompleted => {
                    let was_unknown = cur.remove(&e.addr) == Some(true);
                    if was_unknown && !ends.contains_key(&e.addr) {
                        open -= 1;
                    }
                }
                _ => {}
            }
        }
    }
    ends
}

/// Every block live at the start, with its size (recorded, revealed or inferred), into `st`.
fn size_blocks(
    live: &BTreeMap<u64, Live>,
    regions: &Regions,
    ends: &BTreeMap<u64, u64>,
    settings: &Settings,
    st: &mut InitialState,
) {
    // Other blocks freed during the trace get the size their request rounds to, plus the
    // remainder the allocator would not have split off.
    let addrs: Vec<u64> = live.keys().copied().collect();
    for (i, &a) in addrs.iter().enumerate() {
        let Some(l) = live.get(&a).copied() else {
            continue;
        };
        let Some((_, &(rend, small, expandable))) = regions.range(..=a).next_back() else {
            st.problem(|| format!("block {a:#x} lies in no segment at the start"));
            continue;
        };
        if rend <= a {
            st.problem(|| format!("block {a:#x} lies in no segment at the start"));
            continue;
        }
        let next = addrs.get(i + 1).copied().unwrap_or(u64::MAX);
        let limit = rend.min(next);
        let room = limit - a;
        let (size, inferred) = match l.size {
            Some(s) => (s, false),
            None if ends
                .get(&a)
                .is_some_and(|&end| end - a >= settings.round_size(l.requested)) =>
            {
                (ends.get(&a).map_or(0, |&end| end - a), true)
            }
            None => {
                let base = settings.round_size(l.requested);
                let gap = room.saturating_sub(base);
                let absorb = if small || settings.expandable_segments {
                    false
                } else if base >= settings.max_split_size {
                    gap < settings.max_non_split_rounding
                } else {
                    // A large-pool free block is always > 1 MiB: a smaller gap was part of it.
                    let _ = expandable;
                    gap <= SMALL_SIZE
                };
                (if absorb { room } else { base }, true)
            }
        };
        if size > room {
            st.problem(|| format!("block {a:#x} overlaps the next block or its segment end"));
        }
        st.allocs.push(InitAlloc {
            addr: a,
            size: size.min(room),
            requested: l.requested,
            pending: l.pending,
            inferred,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The live set answers "a block in [a, e)?" as an ordered map of the same blocks does,
    /// whether the range follows 2 MiB boundaries (buckets) or cuts them (ordered index).
    #[test]
    fn live_set_ranges_answer_as_an_ordered_map() {
        let mut rng = crate::test_rng::XorShift::new(0x2545_f491_4f6c_dd1d);
        let mut rnd = move |n: u64| rng.below(n);
        const MB2: u64 = 2 << 20;
        for aligned in [true, false] {
            let mut set = LiveSet::default();
            let mut map: BTreeMap<u64, ()> = BTreeMap::new();
            let l = Live {
                size: None,
                requested: 0,
                pending: false,
            };
            for step in 0..20_000 {
                let base = 0x7f00_0000_0000 + rnd(64) * MB2;
                let addr = base + rnd(4096) * 512;
                match rnd(3) {
                    0 => {
                        set.insert(addr, l);
                        map.insert(addr, ());
                    }
                    1 => {
                        assert_eq!(set.remove(addr).is_some(), map.remove(&addr).is_some());
                    }
                    _ => {
                        let (a, e) = if aligned || rnd(50) != 0 {
                            (base, base + (1 + rnd(3)) * MB2)
                        } else {
                            (addr, addr + rnd(3 * MB2))
                        };
                        assert_eq!(
                            set.any_in(a, e),
                            map.range(a..e).next().is_some(),
                            "step {step}: [{a:#x}, {e:#x})"
                        );
                    }
                }
            }
            assert_eq!(
                set.ordered.is_some(),
                !aligned,
                "cut ranges switch to the index"
            );
            assert_eq!(
                set.into_ordered().keys().copied().collect::<Vec<_>>(),
                map.keys().copied().collect::<Vec<_>>()
            );
        }
    }
}
