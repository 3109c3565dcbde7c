//! When memory was freed: one linear pass per device trace.
//!
//! Matches `free_requested` with `free_completed` (pending and delayed frees), counts segment
//! traffic, tracks which allocations made inside the recorded window are never freed (and in how
//! many parts of the window they recur), finds bursts of frees, and reconstructs the live set at
//! an index (OOM, peak) by replaying the trace backwards from the snapshot's block state — exact
//! whatever was dropped from the front of the window.

use rustc_hash::FxHashMap;

use crate::torch::model::{Action, BlockState, Snapshot, StackId, TraceEntry};
use crate::torch::stacks::{Role, SiteKey, StackIndex};

/// The window is cut into this many equal parts to tell "once" from "every step".
pub const WINDOWS: usize = 8;
/// Requested bytes at or below which an allocation looks like a loss / metric scalar.
pub const SCALAR_BYTES: u64 = 64;

/// Frees whose completion waited for other events (streams) or never came.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DelayedFrees {
    /// `free_completed` that came later than right after its `free_requested`.
    pub count: u64,
    pub bytes: u64,
    /// Largest number of entries between request and completion.
    pub max_entries_between: u64,
    /// Largest delay in µs (when the trace has `time_us`).
    pub max_us: Option<i64>,
    /// Stack of the largest delayed free (free stack with `context="all"`).
    pub example: Option<StackId>,
}

/// A `free_requested` with no `free_completed` by the end of the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingFree {
    pub index: u64,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub stack: Option<StackId>,
}

/// What the trace says about the allocations of one site.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SiteTrace {
    pub key: SiteKey,
    pub allocs: u64,
    pub alloc_bytes: u64,
    /// In-window allocations later freed (`free_completed`).
    pub freed: u64,
    /// In-window allocations still live at the end of the trace.
    pub retained: u64,
    pub retained_bytes: u64,
    /// Bit w set when a retained allocation falls in window part w.
    pub retained_windows: u16,
    pub retained_first: u64,
    pub retained_last: u64,
    /// Largest requested size among retained allocations.
    pub retained_max_size: u64,
    /// Largest requested size among all allocations of the site in the window.
    pub alloc_max_size: u64,
    /// Bit w set when any allocation of the site falls in window part w.
    pub alloc_windows: u16,
    /// Index of the site's last allocation.
    pub last_alloc: u64,
    /// Loss-sized allocations (≤ [`SCALAR_BYTES`]) of the site: a loss line also allocates the
    /// loss function's large temporaries, so these are counted apart.
    pub scalar_allocs: u64,
    /// Bit w set when a loss-sized allocation of the site falls in window part w.
    pub scalar_windows: u16,
    /// Largest requested size among them.
    pub scalar_max_size: u64,
    /// Loss-sized allocations still live at the end of the trace, and their bytes.
    pub scalar_retained: u64,
    pub scalar_retained_bytes: u64,
    /// Index of the site's last loss-sized allocation.
    pub last_scalar_alloc: u64,
    pub role: Role,
    pub stack: Option<StackId>,
}

impl SiteTrace {
    pub fn retained_parts(&self) -> u32 {
        self.retained_windows.count_ones()
    }
}

/// The largest run of frees with no allocation in between.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FreeBurst {
    pub start: u64,
    pub end: u64,
    pub frees: u64,
    pub bytes: u64,
    /// Distinct window parts in which the freed blocks had been allocated.
    pub alloc_parts: u32,
    /// A free stack in the run goes through Python's garbage collector.
    pub gc: bool,
    /// Site that allocated most of the freed bytes.
    pub site: SiteKey,
    pub stack: Option<StackId>,
    pub time_us: Option<i64>,
}

/// Live blocks at one trace index, grouped by site.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveSet {
    pub index: u64,
    pub bytes: u64,
    pub blocks: u64,
    /// (site, bytes, blocks, representative stack), bytes descending.
    pub sites: Vec<(SiteKey, u64, u64, Option<StackId>)>,
    pub role_bytes: FxHashMap<Role, u64>,
    /// (stack, bytes, blocks) of the live blocks, bytes descending (for categories).
    pub by_stack: Vec<(Option<StackId>, u64, u64)>,
    /// Segment bytes added (map/alloc) minus removed (unmap/free) after this index.
    pub reserved_added_after: i64,
    /// Whether any block was allocated or freed after this index (the dump is not this state).
    pub changed_after: bool,
}

impl LiveSet {
    pub fn role(&self, r: Role) -> u64 {
        self.role_bytes.get(&r).copied().unwrap_or(0)
    }
}

/// Everything the trace of one device says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceTimeline {
    pub device: i64,
    pub entries: u64,
    pub allocs: u64,
    pub alloc_bytes: u64,
    pub free_requested: u64,
    pub free_completed: u64,
    pub freed_bytes: u64,
    /// `free_completed` of blocks allocated before the window (no `alloc` seen).
    pub frees_of_older_blocks: u64,
    pub delayed: DelayedFrees,
    pub pending: Vec<PendingFree>,
    pub segment_allocs: (u64, u64),
    pub segment_frees: (u64, u64),
    pub segment_maps: (u64, u64),
    pub segment_unmaps: (u64, u64),
    pub has_time: bool,
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    /// Per-site allocation history in the window, retained bytes descending.
    pub sites: Vec<SiteTrace>,
    pub burst: Option<FreeBurst>,
    /// Runs of ≥ 8 frees whose blocks were allocated in ≥ 3 parts of the window (batched frees).
    pub batched_bursts: u64,
    /// Sawtooth cycles of live memory (rise then fall by ≥ 1/8 of the window's range): steps.
    pub cycles: u64,
    /// Separate runs of optimizer allocations (one per `optimizer.step()` that allocates).
    pub optimizer_runs: u64,
    /// Live bytes reconstructed from the snapshot state: before the first entry, at the peak, at the end.
    pub live_start: i64,
    pub live_peak: i64,
    pub live_peak_index: Option<u64>,
    pub live_end: i64,
    /// Lowest live bytes in each window part (the floor of a sawtooth).
    pub floors: Vec<i64>,
    /// Trough before the peak (start of the step that peaks), and µs from it to the peak.
    pub rise_us: Option<i64>,
    pub peak_set: Option<LiveSet>,
    /// Live set just before each `oom` entry (at most 4).
    pub oom_sets: Vec<LiveSet>,
}

/// Timelines of every device that has a trace list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub devices: Vec<DeviceTimeline>,
}

impl Timeline {
    pub fn device(&self, d: i64) -> Option<&DeviceTimeline> {
        // Sorted by device (`compute` walks the trace lists in order).
        let i = self.devices.binary_search_by_key(&d, |t| t.device).ok()?;
        self.devices.get(i)
    }

    /// Each device's peak set and first OOM set indices, as [`all_set_indices`] finds them
    /// before the timeline is walked.
    pub fn set_indices(&self) -> Vec<DeviceSetIndices> {
        self.devices
            .iter()
            .map(|t| {
                let peak = t.peak_set.as_ref().map(|p| p.index);
                (t.device, (peak, t.oom_sets.first().map(|p| p.index)))
            })
            .collect()
    }
}

fn part(i: usize, n: usize) -> usize {
    i.saturating_mul(WINDOWS)
        .checked_div(n)
        .map_or(0, |p| p.min(WINDOWS - 1))
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Analyse every device trace of the snapshot.
pub fn compute(snap: &Snapshot, stacks: &StackIndex) -> Timeline {
    compute_with(snap, stacks, &SetsAhead::default())
}

/// The live sets the timeline takes on each device (at its peak and first OOMs), made ahead of
/// its walk by another thread ([`sets_ahead`]): by device, with the indices they were taken at.
pub type SetsAhead = crate::torch::memo::Claim<SetsMade>;

/// Live sets made ahead: by device, the indices they were taken at and the sets.
pub type SetsMade = Vec<(i64, Vec<usize>, Vec<LiveSet>)>;

/// [`compute`], taking the live sets from `ahead` where another thread made them (waiting while
/// it does); where their indices are not the ones the walk finds, it makes its own.
pub fn compute_with(snap: &Snapshot, stacks: &StackIndex, ahead: &SetsAhead) -> Timeline {
    let mut out = Timeline::default();
    let Some(traces) = &snap.device_traces else {
        return out;
    };
    let mut ahead = Ahead {
        claim: ahead,
        taken: None,
    };
    for (d, list) in traces.iter().enumerate() {
        if list.is_empty() {
            continue;
        }
        out.devices
            .push(device_timeline(snap, stacks, d as i64, list, &mut ahead));
    }
    out
}

/// The live sets made ahead, as the walks ask for them.
struct Ahead<'a> {
    claim: &'a SetsAhead,
    /// Taken from the claim when the first device's walk is done (not before: the other thread
    /// may still be making them).
    taken: Option<SetsMade>,
}

impl Ahead<'_> {
    /// The sets made ahead for `device` at exactly the indices `ks`, moved out.
    fn take(&mut self, device: i64, ks: &[usize]) -> Option<Vec<LiveSet>> {
        let claim = self.claim;
        let made = self.taken.get_or_insert_with(|| claim.take(Vec::new));
        let i = made
            .iter()
            .position(|(d, at, _)| *d == device && at == ks)?;
        Some(made.swap_remove(i).2)
    }
}

/// The indices a device's timeline takes its live sets at: after its peak entry (when its level
/// rises above the start), then its first four OOMs. `peak_k` as [`set_indices`] finds it.
fn set_ks(list: &[TraceEntry], peak_k: Option<usize>) -> Vec<usize> {
    let mut ks: Vec<usize> = peak_k.into_iter().collect();
    ks.extend(
        list.iter()
            .enumerate()
            .filter(|(_, e)| e.action == Action::Oom)
            .map(|(i, _)| i)
            .take(4),
    );
    ks
}

/// A device and its [`set_indices`]: (peak set's index, first OOM set's index).
pub type DeviceSetIndices = (i64, (Option<u64>, Option<u64>));

/// [`set_indices`] of every traced device (the devices [`compute`] has a timeline for).
pub fn all_set_indices(snap: &Snapshot) -> Vec<DeviceSetIndices> {
    snap.device_traces
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, list)| !list.is_empty())
        .map(|(d, list)| (d as i64, set_indices(list)))
        .collect()
}

/// The live sets [`compute`] takes on every device, made without its walk (for [`SetsAhead`]),
/// at the indices `at` ([`all_set_indices`]) names.
pub fn sets_ahead(snap: &Snapshot, stacks: &StackIndex, at: &[DeviceSetIndices]) -> SetsMade {
    at.iter()
        .map(|&(d, (peak, _))| {
            let list = snap.trace(d);
            let ks = set_ks(list, peak.map(|k| k as usize));
            (d, ks.clone(), live_at_many(snap, stacks, d, list, &ks))
        })
        .collect()
}

fn device_timeline(
    snap: &Snapshot,
    stacks: &StackIndex,
    device: i64,
    list: &[TraceEntry],
    ahead: &mut Ahead<'_>,
) -> DeviceTimeline {
    let n = list.len();
    let mut w = Walk::new(DeviceTimeline {
        device,
        entries: n as u64,
        first_time_us: list.first().and_then(|e| e.time_us()),
        last_time_us: list.last().and_then(|e| e.time_us()),
        has_time: list.iter().any(|e| e.time_us().is_some()),
        ..Default::default()
    });
    for (i, e) in list.iter().enumerate() {
        w.step(stacks, list, i, e);
    }
    if w.run.frees > 0 {
        w.close_run();
    }
    let Walk {
        mut t,
        at,
        mut sites,
        best,
        running,
        floors_rel,
        peak_rel,
        trough_before_peak,
        trough,
        ..
    } = w;
    t.burst = best;
    t.cycles = sawtooth_cycles(list, peak_rel.map(|p| p.0).unwrap_or(0), trough.0);
    // What is still live and still pending at the end, as bits over the trace: read back in
    // trace order, the entries are visited in the order they lie in memory.
    let (live, pending) = {
        let mut live = vec![0u64; n.div_ceil(64)];
        let mut pending = vec![0u64; n.div_ceil(64)];
        for slot in at.values() {
            if let Some(i) = slot.alloc() {
                live[i / 64] |= 1 << (i % 64);
            }
            if let Some(i) = slot.requested() {
                pending[i / 64] |= 1 << (i % 64);
            }
        }
        (live, pending)
    };
    drop(at);
    count_retained(&mut sites, &live, list, stacks);
    t.pending = pending_frees(&pending, list);
    let mut sites: Vec<SiteTrace> = sites.into_values().collect();
    sites.sort_by(|a, b| {
        b.retained_bytes
            .cmp(&a.retained_bytes)
            .then(b.allocs.cmp(&a.allocs))
            .then(a.key.cmp(&b.key))
    });
    t.sites = sites;

    // Absolute live bytes: the snapshot's live blocks are the state after the last entry.
    let end_live = live_bytes_at_end(snap, device);
    let offset = end_live.saturating_sub(running);
    t.live_end = end_live;
    t.live_start = offset;
    t.floors = floors_rel
        .iter()
        .filter(|f| **f != i64::MAX)
        .map(|f| f.saturating_add(offset))
        .collect();
    let mut peak_k = None;
    if let Some((b, i)) = peak_rel {
        t.live_peak = b.saturating_add(offset).max(offset);
        t.live_peak_index = Some(i as u64);
        if b > 0 {
            peak_k = Some(i + 1);
            if let (Some(a), Some(z)) = (list[trough_before_peak.1].time_us(), list[i].time_us()) {
                t.rise_us = Some(z.saturating_sub(a));
            }
        } else {
            t.live_peak = offset;
        }
    }
    // The live sets at the peak and at the first OOMs, from one walk (made ahead, if another
    // thread did, at the same indices).
    let ks = set_ks(list, peak_k);
    let made = ahead.take(device, &ks);
    if made.is_some() {
        crate::timings::count("timeline live sets made ahead", 1);
    }
    let mut sets = made
        .unwrap_or_else(|| live_at_many(snap, stacks, device, list, &ks))
        .into_iter();
    if peak_k.is_some() {
        t.peak_set = sets.next();
    }
    t.oom_sets.extend(sets);
    t
}

/// The indices a device's timeline takes its live sets at, from one pass that only sums sizes
/// (no address map): its peak set's (`peak_set.index`, live after entries `0..k`) and its first
/// OOM set's. The same numbers [`compute`] gives, known before it: the analyses that need only
/// these indices (the release walks, the window's live blocks at the peak) can start while
/// another thread walks the timeline.
pub fn set_indices(list: &[TraceEntry]) -> (Option<u64>, Option<u64>) {
    let mut running = 0i64;
    let mut peak: Option<(i64, usize)> = None;
    let mut oom = None;
    for (i, e) in list.iter().enumerate() {
        match e.action {
            Action::Alloc => running = running.saturating_add(signed(e.size)),
            Action::FreeCompleted => running = running.saturating_sub(signed(e.size)),
            Action::Oom if oom.is_none() => oom = Some(i as u64),
            _ => {}
        }
        // As `Walk::track_level`: the first index where the level is highest.
        if peak.is_none_or(|(b, _)| running > b) {
            peak = Some((running, i));
        }
    }
    let peak_k = peak.filter(|&(b, _)| b > 0).map(|(_, i)| i as u64 + 1);
    (peak_k, oom)
}

/// The state of the one forward pass over a device's trace.
struct Walk {
    t: DeviceTimeline,
    /// addr → the entry indices of its live `alloc` and of its pending `free_requested` (one
    /// map for both, holding indices only: on a trace whose blocks are never freed it grows
    /// to every address, and its size is then what the walk costs).
    at: FxHashMap<u64, Slot>,
    sites: FxHashMap<SiteKey, SiteTrace>,
    /// The run of frees in progress, the window parts its blocks were allocated in, and its
    /// bytes per site.
    run: FreeBurst,
    run_parts: u16,
    run_sites: FxHashMap<SiteKey, (u64, Option<StackId>)>,
    best: Option<FreeBurst>,
    /// Live bytes relative to the trace's start.
    running: i64,
    floors_rel: [i64; WINDOWS],
    peak_rel: Option<(i64, usize)>,
    trough_before_peak: (i64, usize),
    trough: (i64, usize),
    prev_alloc_opt: bool,
}

impl Walk {
    fn new(t: DeviceTimeline) -> Self {
        Walk {
            t,
            at: FxHashMap::default(),
            sites: FxHashMap::default(),
            run: FreeBurst::default(),
            run_parts: 0,
            run_sites: FxHashMap::default(),
            best: None,
            running: 0,
            floors_rel: [i64::MAX; WINDOWS],
            peak_rel: None,
            trough_before_peak: (0, 0),
            trough: (i64::MAX, 0),
            prev_alloc_opt: false,
        }
    }

    fn close_run(&mut self) {
        close_run(
            &mut self.run,
            self.run_parts,
            &mut self.run_sites,
            &mut self.best,
            &mut self.t.batched_bursts,
        );
        self.run_parts = 0;
    }

    /// Entry `i` of the trace.
    fn step(&mut self, stacks: &StackIndex, list: &[TraceEntry], i: usize, e: &TraceEntry) {
        let n = list.len();
        let is_free_like = matches!(
            e.action,
            Action::FreeRequested
                | Action::FreeCompleted
                | Action::SegmentFree
                | Action::SegmentUnmap
                | Action::Snapshot
        );
        if !is_free_like && self.run.frees > 0 {
            self.close_run();
        }
        let t = &mut self.t;
        match e.action {
            Action::Alloc => self.alloc(stacks, n, i, e),
            Action::FreeRequested => {
                t.free_requested += 1;
                self.at.entry(e.addr).or_insert(Slot::EMPTY).requested = i as u32;
            }
            Action::FreeCompleted => self.free_completed(stacks, list, i, e),
            Action::SegmentAlloc => add(&mut t.segment_allocs, e.size),
            Action::SegmentFree => add(&mut t.segment_frees, e.size),
            Action::SegmentMap => add(&mut t.segment_maps, e.size),
            Action::SegmentUnmap => add(&mut t.segment_unmaps, e.size),
            _ => {}
        }
        self.track_level(n, i);
    }

    fn alloc(&mut self, stacks: &StackIndex, n: usize, i: usize, e: &TraceEntry) {
        let t = &mut self.t;
        t.allocs += 1;
        t.alloc_bytes = t.alloc_bytes.saturating_add(e.size);
        self.at.entry(e.addr).or_insert(Slot::EMPTY).alloc = i as u32;
        let (key, _) = stacks.site(e.stack());
        let s = self.sites.entry(key).or_insert_with(|| SiteTrace {
            key,
            role: stacks.role(e.stack()),
            stack: e.stack(),
            ..Default::default()
        });
        s.allocs += 1;
        s.alloc_max_size = s.alloc_max_size.max(e.size);
        s.alloc_windows |= 1 << part(i, n);
        s.last_alloc = i as u64;
        if e.size <= SCALAR_BYTES {
            s.scalar_allocs += 1;
            s.scalar_windows |= 1 << part(i, n);
            s.scalar_max_size = s.scalar_max_size.max(e.size);
            s.last_scalar_alloc = i as u64;
        }
        s.alloc_bytes = s.alloc_bytes.saturating_add(e.size);
        self.running = self.running.saturating_add(signed(e.size));
        let opt = s.role == Role::OptimizerState;
        if opt && !self.prev_alloc_opt {
            t.optimizer_runs += 1;
        }
        self.prev_alloc_opt = opt;
    }

    fn free_completed(
        &mut self,
        stacks: &StackIndex,
        list: &[TraceEntry],
        i: usize,
        e: &TraceEntry,
    ) {
        let n = list.len();
        let t = &mut self.t;
        t.free_completed += 1;
        t.freed_bytes = t.freed_bytes.saturating_add(e.size);
        self.running = self.running.saturating_sub(signed(e.size));
        let slot = self.at.remove(&e.addr).unwrap_or(Slot::EMPTY);
        if let Some(ri) = slot.requested()
            && i > ri + 1
        {
            let (size, stack) = (list[ri].size, list[ri].stack());
            let d = &mut t.delayed;
            d.count += 1;
            d.bytes = d.bytes.saturating_add(size);
            let between = (i - ri - 1) as u64;
            if between > d.max_entries_between {
                d.max_entries_between = between;
                d.example = stack.or(e.stack());
            }
            if let (Some(a), Some(b)) = (list[ri].time_us(), e.time_us()) {
                d.max_us = Some(d.max_us.unwrap_or(0).max(b.saturating_sub(a)));
            }
        }
        let run = &mut self.run;
        if run.frees == 0 {
            run.start = i as u64;
            run.time_us = e.time_us();
        }
        run.end = i as u64;
        run.frees += 1;
        run.bytes = run.bytes.saturating_add(e.size);
        run.gc |= stacks.has_gc_frame(e.stack());
        match slot.alloc() {
            Some(ai) => {
                let (size, stack) = (list[ai].size, list[ai].stack());
                let (key, _) = stacks.site(stack);
                if let Some(s) = self.sites.get_mut(&key) {
                    s.freed += 1;
                }
                self.run_parts |= 1 << part(ai, n);
                let rs = self.run_sites.entry(key).or_insert((0, stack));
                rs.0 = rs.0.saturating_add(size);
            }
            None => t.frees_of_older_blocks += 1,
        }
    }

    /// The floor of each window part, the trough so far and the peak (relative live bytes).
    fn track_level(&mut self, n: usize, i: usize) {
        let running = self.running;
        let w = part(i, n);
        self.floors_rel[w] = self.floors_rel[w].min(running);
        if running < self.trough.0 {
            self.trough = (running, i);
        }
        if self.peak_rel.is_none_or(|(b, _)| running > b) {
            self.peak_rel = Some((running, i));
            self.trough_before_peak = if self.trough.0 <= running {
                self.trough
            } else {
                (running, i)
            };
        }
    }
}

/// The blocks still live after the last entry, counted into their sites as retained.
fn count_retained(
    sites: &mut FxHashMap<SiteKey, SiteTrace>,
    live: &[u64],
    list: &[TraceEntry],
    stacks: &StackIndex,
) {
    let n = list.len();
    for ai in ones(live) {
        let (size, stack) = (list[ai].size, list[ai].stack());
        let (key, _) = stacks.site(stack);
        if let Some(s) = sites.get_mut(&key) {
            s.retained += 1;
            s.retained_bytes = s.retained_bytes.saturating_add(size);
            s.retained_windows |= 1 << part(ai, n);
            let ai = ai as u64;
            if s.retained == 1 || ai < s.retained_first {
                s.retained_first = ai;
            }
            s.retained_last = s.retained_last.max(ai);
            s.retained_max_size = s.retained_max_size.max(size);
            if size <= SCALAR_BYTES {
                s.scalar_retained += 1;
                s.scalar_retained_bytes = s.scalar_retained_bytes.saturating_add(size);
            }
        }
    }
}

/// Frees requested and never completed, in trace order.
fn pending_frees(pending: &[u64], list: &[TraceEntry]) -> Vec<PendingFree> {
    ones(pending)
        .map(|i| {
            let e = &list[i];
            PendingFree {
                index: i as u64,
                addr: e.addr,
                size: e.size,
                stream: e.stream,
                stack: e.stack(),
            }
        })
        .collect()
}

/// The indices of the set bits, ascending.
fn ones(bits: &[u64]) -> impl Iterator<Item = usize> + '_ {
    bits.iter().enumerate().flat_map(|(w, &word)| {
        let mut word = word;
        std::iter::from_fn(move || {
            (word != 0).then(|| {
                let b = word.trailing_zeros() as usize;
                word &= word - 1;
                w * 64 + b
            })
        })
    })
}

const NONE: u32 = u32::MAX;

/// An address's live `alloc` and pending `free_requested` entries ([`NONE`]: none). Entry
/// indices fit 32 bits: a trace of 2³² entries would need 160 GiB of model.
#[derive(Clone, Copy)]
struct Slot {
    alloc: u32,
    requested: u32,
}

impl Slot {
    const EMPTY: Slot = Slot {
        alloc: NONE,
        requested: NONE,
    };
    fn alloc(&self) -> Option<usize> {
        (self.alloc != NONE).then_some(self.alloc as usize)
    }
    fn requested(&self) -> Option<usize> {
        (self.requested != NONE).then_some(self.requested as usize)
    }
}

/// Count rise-then-fall cycles of the running live bytes, each at least 1/8 of the range.
fn sawtooth_cycles(list: &[TraceEntry], max: i64, min: i64) -> u64 {
    let min = min.min(0);
    let thr = max.saturating_sub(min) / 8;
    if thr <= 0 {
        return 0;
    }
    let mut run: i64 = 0;
    let mut low: i64 = 0;
    let mut high: i64 = 0;
    let mut up = false;
    let mut cycles = 0;
    for e in list {
        match e.action {
            Action::Alloc => run = run.saturating_add(signed(e.size)),
            Action::FreeCompleted => run = run.saturating_sub(signed(e.size)),
            _ => continue,
        }
        if up {
            high = high.max(run);
            if high.saturating_sub(run) >= thr {
                cycles += 1;
                up = false;
                low = run;
            }
        } else {
            low = low.min(run);
            if run.saturating_sub(low) >= thr {
                up = true;
                high = run;
            }
        }
    }
    cycles
}

fn add(slot: &mut (u64, u64), size: u64) {
    slot.0 += 1;
    slot.1 = slot.1.saturating_add(size);
}

fn close_run(
    run: &mut FreeBurst,
    parts: u16,
    sites: &mut FxHashMap<SiteKey, (u64, Option<StackId>)>,
    best: &mut Option<FreeBurst>,
    batched: &mut u64,
) {
    run.alloc_parts = parts.count_ones();
    if run.frees >= 8 && run.alloc_parts >= 3 {
        *batched += 1;
    }
    if let Some((k, (_, st))) = sites
        .iter()
        .max_by(|a, b| a.1.0.cmp(&b.1.0).then(b.0.cmp(a.0)))
    {
        run.site = *k;
        run.stack = *st;
    }
    let better = match best {
        None => true,
        Some(b) => (run.alloc_parts, run.frees) > (b.alloc_parts, b.frees),
    };
    if better {
        *best = Some(run.clone());
    }
    *run = FreeBurst::default();
    sites.clear();
}

fn live_bytes_at_end(snap: &Snapshot, device: i64) -> i64 {
    let mut total: u64 = 0;
    for seg in snap.segments_of(device) {
        for b in &seg.blocks {
            if matches!(
                b.state,
                BlockState::ActiveAllocated | BlockState::ActivePendingFree
            ) {
                total = total.saturating_add(b.size);
            }
        }
    }
    signed(total)
}

/// Live blocks of `device` just before trace entry `k` (after entries `0..k`).
///
/// Starts from the snapshot's live blocks (exact, unlike a forward replay that misses everything
/// allocated before the window) and undoes entries `k..n` backwards. Blocks brought back take the
/// stack of their `alloc` entry when it is in the window, else the stack of their free entry.
pub fn live_at(
    snap: &Snapshot,
    stacks: &StackIndex,
    device: i64,
    list: &[TraceEntry],
    k: usize,
) -> LiveSet {
    live_at_many(snap, stacks, device, list, &[k])
        .pop()
        .unwrap_or_default()
}

/// Where a block of a backward walk's live set comes from: the snapshot (its stack), or the
/// `free_completed` entry that brought it back (its stack is resolved per index, below).
#[derive(Clone, Copy)]
enum Origin {
    Snapshot(Option<StackId>),
    Freed(usize),
}

/// [`live_at`] at each of `ks`, in that order, from one backward and one forward pass over the
/// trace (instead of two passes per index): the same sets, at the cost of one.
pub fn live_at_many(
    snap: &Snapshot,
    stacks: &StackIndex,
    device: i64,
    list: &[TraceEntry],
    ks: &[usize],
) -> Vec<LiveSet> {
    let ks: Vec<usize> = ks.iter().map(|&k| k.min(list.len())).collect();
    let mut down: Vec<usize> = ks.clone();
    down.sort_unstable_by(|a, b| b.cmp(a));
    down.dedup();
    // The backward walk: live blocks (address → size, origin), stopping at each index.
    let mut set: FxHashMap<u64, (u64, Origin)> = FxHashMap::default();
    for seg in snap.segments_of(device) {
        for b in &seg.blocks {
            if matches!(
                b.state,
                BlockState::ActiveAllocated | BlockState::ActivePendingFree
            ) {
                set.insert(b.address, (b.size, Origin::Snapshot(b.stack)));
            }
        }
    }
    let mut reserved_added_after: i64 = 0;
    let mut changed_after = false;
    let mut at = list.len();
    // Per index (descending): the set there, the reserved bytes added after it, and whether
    // anything changed after it.
    let mut states: Vec<WalkedTo<FxHashMap<u64, (u64, Origin)>>> = Vec::new();
    for &k in &down {
        while at > k {
            at -= 1;
            let e = &list[at];
            match e.action {
                Action::Alloc => {
                    changed_after = true;
                    set.remove(&e.addr);
                }
                Action::FreeCompleted => {
                    changed_after = true;
                    set.insert(e.addr, (e.size, Origin::Freed(at)));
                }
                Action::SegmentAlloc | Action::SegmentMap => {
                    reserved_added_after = reserved_added_after.saturating_add(signed(e.size))
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    reserved_added_after = reserved_added_after.saturating_sub(signed(e.size))
                }
                _ => {}
            }
        }
        states.push(WalkedTo {
            k,
            blocks: set.clone(),
            reserved_added_after,
            changed_after,
        });
    }
    drop(set);
    // The forward walk: a block brought back by a free after `k` takes the stack of the latest
    // `alloc` at its address before `k` (else its free entry's).
    states.reverse();
    let mut last: FxHashMap<u64, Option<Option<StackId>>> = FxHashMap::default();
    for st in &states {
        for (addr, (_, o)) in &st.blocks {
            if matches!(o, Origin::Freed(_)) {
                last.insert(*addr, None);
            }
        }
    }
    let mut resolved: Vec<WalkedTo<Vec<SizedBlock>>> = Vec::new();
    let mut i = 0usize;
    for st in states {
        while i < st.k {
            let e = &list[i];
            if e.action == Action::Alloc
                && let Some(slot) = last.get_mut(&e.addr)
            {
                *slot = Some(e.stack());
            }
            i += 1;
        }
        let blocks = st
            .blocks
            .into_iter()
            .map(|(addr, (size, o))| {
                let stack = match o {
                    Origin::Snapshot(st) => st,
                    Origin::Freed(j) => last
                        .get(&addr)
                        .copied()
                        .flatten()
                        .unwrap_or(list[j].stack()),
                };
                (size, stack)
            })
            .collect();
        resolved.push(WalkedTo {
            k: st.k,
            blocks,
            reserved_added_after: st.reserved_added_after,
            changed_after: st.changed_after,
        });
    }
    ks.iter()
        .map(|&k| {
            let r = resolved
                .iter()
                .find(|r| r.k == k)
                .expect("every index was walked to");
            live_set(
                stacks,
                k,
                &r.blocks,
                r.reserved_added_after,
                r.changed_after,
            )
        })
        .collect()
}

/// A live block's size and stack.
type SizedBlock = (u64, Option<StackId>);

/// What the backward walk saw at one index: the live blocks there, the segment bytes added after
/// it, and whether any block was allocated or freed after it.
struct WalkedTo<B> {
    k: usize,
    blocks: B,
    reserved_added_after: i64,
    changed_after: bool,
}

/// The live set at `k` from its blocks (size, stack), summed by site, by stack and by role.
fn live_set(
    stacks: &StackIndex,
    k: usize,
    blocks: &[(u64, Option<StackId>)],
    reserved_added_after: i64,
    changed_after: bool,
) -> LiveSet {
    let mut out = LiveSet {
        index: k as u64,
        reserved_added_after,
        changed_after,
        ..Default::default()
    };
    let mut by: FxHashMap<SiteKey, (u64, u64, Option<StackId>, u64)> = FxHashMap::default();
    let mut by_stack: FxHashMap<Option<StackId>, (u64, u64)> = FxHashMap::default();
    for (size, stack) in blocks {
        let st = by_stack.entry(*stack).or_default();
        st.0 = st.0.saturating_add(*size);
        st.1 += 1;
        out.bytes = out.bytes.saturating_add(*size);
        out.blocks += 1;
        let r = out.role_bytes.entry(stacks.role(*stack)).or_default();
        *r = r.saturating_add(*size);
        let (key, _) = stacks.site(*stack);
        let s = by.entry(key).or_insert((0, 0, *stack, 0));
        s.0 = s.0.saturating_add(*size);
        s.1 += 1;
        if *size > s.3 {
            s.3 = *size;
            s.2 = *stack;
        }
    }
    let mut sites: Vec<(SiteKey, u64, u64, Option<StackId>)> =
        by.into_iter().map(|(k, v)| (k, v.0, v.1, v.2)).collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)));
    out.sites = sites;
    let mut by_stack: Vec<(Option<StackId>, u64, u64)> =
        by_stack.into_iter().map(|(k, v)| (k, v.0, v.1)).collect();
    by_stack.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out.by_stack = by_stack;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::FrameFilter;
    use crate::torch::stacks::site_string;
    use crate::torch::stacks::tests::intern;
    use crate::torch::totals::tests::{block, entry, segment};

    #[test]
    fn pending_and_delayed_frees_are_told_apart() {
        let snap = Snapshot {
            device_traces: Some(vec![vec![
                entry(Action::Alloc, 100, 512),
                entry(Action::Alloc, 200, 512),
                entry(Action::FreeRequested, 100, 512),
                entry(Action::Alloc, 300, 512),
                entry(Action::FreeCompleted, 100, 512),
                entry(Action::FreeRequested, 200, 512),
                entry(Action::FreeCompleted, 200, 512),
                entry(Action::FreeRequested, 300, 512),
            ]]),
            ..Snapshot::default()
        };
        let idx = StackIndex::new(&snap, &FrameFilter::default());
        let t = compute(&snap, &idx);
        let d = &t.devices[0];
        assert_eq!(d.delayed.count, 1, "only addr 100 waited");
        assert_eq!(d.delayed.max_entries_between, 1);
        assert_eq!(d.pending.len(), 1);
        assert_eq!(d.pending[0].addr, 300);
    }

    #[test]
    fn live_set_before_an_oom_is_replayed_from_snapshot_state() {
        let mut snap = Snapshot::default();
        let a = intern(&mut snap, &[("/u/train.py", 3, "main")]);
        let b = intern(&mut snap, &[("/u/train.py", 9, "main")]);
        let mut keep = block(4096, 4096, BlockState::ActiveAllocated);
        keep.stack = Some(a);
        snap.segments = vec![segment(
            0,
            0x1000,
            vec![keep, block(8192, 0, BlockState::Inactive)],
        )];
        let mut alloc_b = entry(Action::Alloc, 0x2000, 8192);
        alloc_b.set_stack(Some(b));
        snap.device_traces = Some(vec![vec![
            alloc_b.clone(),
            entry(Action::Oom, 0, 1 << 30),
            entry(Action::FreeRequested, 0x2000, 8192),
            entry(Action::FreeCompleted, 0x2000, 8192),
        ]]);
        let idx = StackIndex::new(&snap, &FrameFilter::default());
        let t = compute(&snap, &idx);
        let set = &t.devices[0].oom_sets[0];
        assert_eq!(set.bytes, 4096 + 8192, "freed-after-OOM block was live");
        assert_eq!(site_string(&snap, set.sites[0].0), "/u/train.py:9:main");
        assert_eq!(set.sites[0].1, 8192);
    }

    /// The sets of one walk at several indices are the sets of one walk per index, on a trace
    /// that reuses addresses (the stack a block takes is the latest alloc's before the index).
    #[test]
    fn live_sets_at_many_indices_are_the_sets_at_each() {
        let mut snap = Snapshot::default();
        let st: Vec<StackId> = (0..3)
            .map(|i| intern(&mut snap, &[("/u/train.py", 10 + i, "main")]))
            .collect();
        let mut keep = block(4096, 4096, BlockState::ActiveAllocated);
        keep.stack = Some(st[0]);
        snap.segments = vec![segment(
            0,
            0x1000,
            vec![keep, block(1 << 20, 0, BlockState::Inactive)],
        )];
        let mut list = Vec::new();
        for step in 0..12u64 {
            // Three addresses taken in turn, each allocated with the step's stack.
            let addr = 0x2000 + (step % 3) * 0x1000;
            let mut a = entry(Action::Alloc, addr, 512 * (step + 1));
            a.set_stack(Some(st[(step % 3) as usize]));
            list.push(a);
            if step % 4 != 3 {
                list.push(entry(Action::FreeRequested, addr, 512 * (step + 1)));
                list.push(entry(Action::FreeCompleted, addr, 512 * (step + 1)));
            }
        }
        snap.device_traces = Some(vec![list.clone()]);
        let idx = StackIndex::new(&snap, &FrameFilter::default());
        let ks = [list.len(), 0, 7, 1, 20, 7, 33, list.len() + 5];
        let many = live_at_many(&snap, &idx, 0, &list, &ks);
        for (k, set) in ks.iter().zip(&many) {
            assert_eq!(*set, live_at(&snap, &idx, 0, &list, *k), "at {k}");
        }
        // After the first alloc (at 0x2000, line 10) and before its free: live with its stack.
        let at1 = &many[3];
        assert_eq!(at1.bytes, 4096 + 512);
        assert!(
            at1.sites
                .iter()
                .any(|s| site_string(&snap, s.0) == "/u/train.py:10:main" && s.1 == 4096 + 512)
        );
    }

    /// The pre-pass names the indices the timeline takes its peak and first OOM sets at, on
    /// random traces: frees of blocks never allocated (a level below the start), sizes past
    /// `i64`, OOMs, and traces whose level never rises above the start (no peak set).
    #[test]
    fn set_indices_are_the_timelines_own() {
        let mut rng = crate::test_rng::XorShift::new(0x2545_f491_4f6c_dd1d);
        let mut next = move || rng.next_u64();
        let mut with_peak = 0;
        for case in 0..300 {
            let mut snap = Snapshot::default();
            let st = intern(&mut snap, &[("/u/train.py", 10, "main")]);
            let n = (next() % 60) as usize;
            let mut list = Vec::new();
            for _ in 0..n {
                let r = next();
                let action = match r % 7 {
                    0 | 1 => Action::Alloc,
                    2 => Action::FreeRequested,
                    3 | 4 => Action::FreeCompleted,
                    5 => Action::Oom,
                    _ => Action::SegmentAlloc,
                };
                let size = match (r >> 8) % 9 {
                    0 => u64::MAX - (r >> 20) % 3,
                    1 => 0,
                    _ => 512 * ((r >> 12) % 8 + 1),
                };
                let mut e = entry(action, 0x1000 * ((r >> 16) % 6), size);
                e.set_stack(Some(st));
                list.push(e);
            }
            snap.device_traces = Some(vec![list.clone()]);
            let idx = StackIndex::new(&snap, &FrameFilter::default());
            let t = compute(&snap, &idx);
            let (peak, oom) = match t.devices.first() {
                Some(d) => (
                    d.peak_set.as_ref().map(|p| p.index),
                    d.oom_sets.first().map(|p| p.index),
                ),
                None => (None, None),
            };
            with_peak += usize::from(peak.is_some());
            assert_eq!(set_indices(&list), (peak, oom), "case {case}: {list:?}");
        }
        assert!(with_peak > 100, "most cases rise to a peak ({with_peak})");
    }

    /// The timeline takes live sets made ahead only at the indices it finds itself: sets made
    /// at other indices (a wrong peak) are left, and it makes its own.
    #[test]
    fn sets_made_ahead_at_other_indices_are_not_taken() {
        let mut snap = Snapshot::default();
        let st = intern(&mut snap, &[("/u/train.py", 10, "main")]);
        let mut list = Vec::new();
        for i in 0..6u64 {
            let mut e = entry(Action::Alloc, 0x1000 * (i + 1), 512 * (i + 1));
            e.set_stack(Some(st));
            list.push(e);
        }
        list.push(entry(Action::FreeCompleted, 0x1000, 512));
        snap.device_traces = Some(vec![list.clone()]);
        let idx = StackIndex::new(&snap, &FrameFilter::default());
        let plain = compute(&snap, &idx);
        assert_eq!(plain.devices[0].peak_set.as_ref().map(|s| s.index), Some(6));
        let wrong = SetsAhead::default();
        wrong.help(|| vec![(0, vec![3], live_at_many(&snap, &idx, 0, &list, &[3]))]);
        assert_eq!(compute_with(&snap, &idx, &wrong), plain);
        let right = SetsAhead::default();
        right.help(|| sets_ahead(&snap, &idx, &all_set_indices(&snap)));
        assert_eq!(compute_with(&snap, &idx, &right), plain);
    }

    #[test]
    fn allocations_repeated_across_the_window_without_frees_are_retained() {
        let mut snap = Snapshot::default();
        let leak = intern(&mut snap, &[("/u/train.py", 20, "main")]);
        let tmp = intern(&mut snap, &[("/u/train.py", 15, "main")]);
        let mut list = Vec::new();
        for step in 0..8u64 {
            let mut t = entry(Action::Alloc, 1000 + step, 512);
            t.set_stack(Some(tmp));
            list.push(t);
            list.push(entry(Action::FreeRequested, 1000 + step, 512));
            list.push(entry(Action::FreeCompleted, 1000 + step, 512));
            let mut l = entry(Action::Alloc, 5000 + step, 2048);
            l.set_stack(Some(leak));
            list.push(l);
        }
        snap.device_traces = Some(vec![list]);
        let idx = StackIndex::new(&snap, &FrameFilter::default());
        let t = compute(&snap, &idx);
        let d = &t.devices[0];
        let top = &d.sites[0];
        assert_eq!(site_string(&snap, top.key), "/u/train.py:20:main");
        assert_eq!((top.allocs, top.retained, top.freed), (8, 8, 0));
        assert_eq!(top.retained_parts(), 8);
        let tmp_site = &d.sites[1];
        assert_eq!((tmp_site.retained, tmp_site.freed), (0, 8));
        assert!(d.floors.windows(2).all(|w| w[0] <= w[1]), "floor rises");
    }
}
