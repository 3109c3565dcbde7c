//! Turning a device trace into the program's requests and replaying them through the model.
//!
//! The program's requests are `alloc` (a malloc), `oom` (a malloc that failed),
//! `free_requested`, `free_completed` and `empty_cache()` — the last one is not recorded, so a run
//! of `segment_free`/`segment_unmap` outside an allocation is read as one. Everything else
//! (segment events) is the allocator's answer, which the model must predict.

use rustc_hash::FxHashMap;

use super::addr_of::AddrOf;
use super::initial::InitialState;
use super::model::{Device, Malloc, Model, SegEvent, SegKind};
use super::settings::Settings;
use crate::torch::model::{Action, TraceEntry};

pub(crate) use super::addr_of::NONE;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// A malloc; `oom`: it failed in the recorded run. `refused`: the recorded run shows the
    /// device refusing memory during it (its releases are `releases` recorded events).
    Malloc {
        entry: usize,
        oom: bool,
        refused: bool,
        releases: u32,
    },
    /// Where the recorded run released segments before a malloc that needed a new one: if the
    /// model has no cached block for the request here, the releases were the malloc's OOM path
    /// and the malloc runs now; otherwise they were an `empty_cache()` call.
    Probe {
        entry: usize,
        releases: u32,
    },
    FreeRequested,
    FreeCompleted,
    EmptyCache,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    /// Trace index the op runs at (before the entry at `pos` is otherwise considered).
    pub pos: usize,
    /// Step its segment events are compared under.
    pub step: usize,
    pub kind: OpKind,
    /// The allocation the op makes or frees (`NONE` for none).
    pub aref: u32,
}

/// An op the trace does not show by itself (a probe, an `empty_cache()` run), as the plan
/// stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SideOp {
    pos: u32,
    step: u32,
    aref: u32,
    /// `Some(releases)`: a probe; `None`: an `empty_cache()` run.
    probe: Option<u32>,
}

/// The requests of one device trace, in two orders: as recorded (malloc of a window that went
/// through the OOM path runs where its first release was recorded) and as requested (every
/// malloc at its own entry, the model decides releases itself).
///
/// Stored in 4 bytes a trace entry (a trace has millions): the allocation reference of each
/// `alloc` and matched free (`NONE` elsewhere), from which, with the entry's action, every
/// malloc and free op follows (at its own entry: its step, and a malloc's entry, are its
/// position; its `refused` is its `oom`, its `releases` 0: all `plan` ever makes), and the few
/// ops that sit on a segment release (probes, `empty_cache()` runs) in a list by position. The
/// request order is the recorded one without its probes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    aref_at: Vec<u32>,
    side: Vec<SideOp>,
    pub recorded: Vec<SegEvent>,
    /// Allocation references: initial allocations first (index = position in
    /// `InitialState::allocs`), then one per `alloc` entry.
    pub arefs: usize,
    /// Frees whose allocation is unknown.
    pub unmatched_frees: u64,
    /// The trace was too long to plan (more than `u32::MAX - 1` entries): no ops.
    pub too_long: bool,
    /// The trace has an `oom` entry (known only where it was planned).
    pub has_oom: bool,
}

impl Plan {
    /// The ops in the recorded order (`as_recorded`) or the request order, for the trace the
    /// plan was made from. In the request order a probe is no op, except those at the positions
    /// of `empty_cache_probes` (sorted): releases the validation read as an `empty_cache()`
    /// call, which the program makes whatever the allocator does.
    pub fn ops<'a>(
        &'a self,
        trace: &'a [TraceEntry],
        as_recorded: bool,
        empty_cache_probes: &'a [u32],
    ) -> impl Iterator<Item = Op> + 'a {
        let mut side = self.side.iter().peekable();
        let mut i = 0usize;
        let n = self.aref_at.len().min(trace.len());
        std::iter::from_fn(
            #[inline(always)]
            move || {
                loop {
                    // Side ops sit on release entries, where the trace makes no op of its own.
                    if let Some(sop) = side.next_if(|o| o.pos as usize <= i) {
                        match sop.probe {
                            Some(_) if !as_recorded => {
                                if empty_cache_probes.binary_search(&sop.pos).is_err() {
                                    continue;
                                }
                                return Some(Op {
                                    pos: sop.pos as usize,
                                    step: sop.step as usize,
                                    kind: OpKind::EmptyCache,
                                    aref: NONE,
                                });
                            }
                            Some(releases) => {
                                return Some(Op {
                                    pos: sop.pos as usize,
                                    step: sop.step as usize,
                                    kind: OpKind::Probe {
                                        entry: sop.step as usize,
                                        releases,
                                    },
                                    aref: sop.aref,
                                });
                            }
                            None => {
                                return Some(Op {
                                    pos: sop.pos as usize,
                                    step: sop.step as usize,
                                    kind: OpKind::EmptyCache,
                                    aref: NONE,
                                });
                            }
                        }
                    }
                    if i >= n {
                        return None;
                    }
                    let at = i;
                    i += 1;
                    let aref = self.aref_at[at];
                    let kind = match trace[at].action {
                        Action::Alloc | Action::Oom => {
                            let oom = trace[at].action == Action::Oom;
                            OpKind::Malloc {
                                entry: at,
                                oom,
                                refused: oom,
                                releases: 0,
                            }
                        }
                        Action::FreeRequested if aref != NONE => OpKind::FreeRequested,
                        Action::FreeCompleted if aref != NONE => OpKind::FreeCompleted,
                        _ => continue,
                    };
                    return Some(Op {
                        pos: at,
                        step: at,
                        kind,
                        aref,
                    });
                }
            },
        )
    }

    /// Probes: releases recorded just before a malloc that needed a new segment. Each is the
    /// malloc's OOM path (the device refused a segment, cached ones were released and the
    /// malloc retried) or an `empty_cache()` call; the validation replay tells them apart.
    pub fn probes(&self) -> usize {
        self.side.iter().filter(|o| o.probe.is_some()).count()
    }

    /// The aref of the `alloc` at trace entry `entry`.
    pub fn alloc_aref(&self, trace: &[TraceEntry], entry: usize) -> Option<u32> {
        let e = trace.get(entry)?;
        let a = *self.aref_at.get(entry)?;
        (e.action == Action::Alloc && a != NONE).then_some(a)
    }

    /// Every `alloc` entry with its aref.
    pub fn alloc_arefs<'a>(
        &'a self,
        trace: &'a [TraceEntry],
    ) -> impl Iterator<Item = (usize, u32)> + 'a {
        self.aref_at
            .iter()
            .zip(trace)
            .enumerate()
            .filter(|(_, (a, e))| e.action == Action::Alloc && **a != NONE)
            .map(|(i, (a, _))| (i, *a))
    }
}

fn seg_kind(a: Action) -> Option<SegKind> {
    Some(match a {
        Action::SegmentAlloc => SegKind::SegmentAlloc,
        Action::SegmentFree => SegKind::SegmentFree,
        Action::SegmentMap => SegKind::SegmentMap,
        Action::SegmentUnmap => SegKind::SegmentUnmap,
        _ => return None,
    })
}

fn is_release(a: Action) -> bool {
    matches!(a, Action::SegmentFree | Action::SegmentUnmap)
}

fn is_growth(a: Action) -> bool {
    matches!(a, Action::SegmentAlloc | Action::SegmentMap)
}

pub(crate) fn plan(trace: &[TraceEntry], init: &InitialState) -> Plan {
    let mut p = Plan::default();
    if trace.len() >= u32::MAX as usize || init.allocs.len() >= (u32::MAX / 2) as usize {
        p.too_long = true;
        return p;
    }
    let mut live: FxHashMap<u64, u32> = FxHashMap::default();
    for (i, a) in init.allocs.iter().enumerate() {
        live.insert(a.addr, i as u32);
    }
    let mut next_aref = init.allocs.len() as u32;
    // The step of each segment event that is not its own entry.
    let mut step_of: FxHashMap<usize, usize> = FxHashMap::default();
    let mut ws = 0usize;

    // Releases in a closed window that no malloc follows: empty_cache() runs.
    fn empty_cache_runs(
        trace: &[TraceEntry],
        from: usize,
        to: usize,
        step_of: &mut FxHashMap<usize, usize>,
        side: &mut Vec<SideOp>,
    ) {
        let mut k = from;
        while k < to {
            if is_release(trace[k].action) {
                let start = k;
                while k < to && is_release(trace[k].action) {
                    step_of.insert(k, start);
                    k += 1;
                }
                side.push(SideOp {
                    pos: start as u32,
                    step: start as u32,
                    aref: NONE,
                    probe: None,
                });
            } else {
                k += 1;
            }
        }
    }

    let mut aref_at: Vec<u32> = vec![NONE; trace.len()];
    let mut side: Vec<SideOp> = Vec::new();
    // The segment events' entries, kept in this pass (their steps are known once their window
    // closes) so that no second pass over the trace looks for them.
    let mut seg_entries: Vec<usize> = Vec::new();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc | Action::Oom => {
                let oom = e.action == Action::Oom;
                p.has_oom |= oom;
                let first_release = (ws..i).find(|&k| is_release(trace[k].action));
                let oom_path = match first_release {
                    Some(f) => oom || (f..i).any(|k| is_growth(trace[k].action)),
                    None => false,
                };
                let aref = if oom {
                    NONE
                } else {
                    let a = next_aref;
                    next_aref = next_aref.saturating_add(1);
                    live.insert(e.addr, a);
                    a
                };
                aref_at[i] = aref;
                if let (true, Some(first)) = (oom_path, first_release) {
                    let releases = (first..i).filter(|&k| is_release(trace[k].action)).count();
                    for (k, t) in trace.iter().enumerate().take(i).skip(ws) {
                        if seg_kind(t.action).is_some() {
                            step_of.insert(k, i);
                        }
                    }
                    side.push(SideOp {
                        pos: first as u32,
                        step: i as u32,
                        aref,
                        probe: Some(releases as u32),
                    });
                } else {
                    empty_cache_runs(trace, ws, i, &mut step_of, &mut side);
                    for (k, t) in trace.iter().enumerate().take(i).skip(ws) {
                        if is_growth(t.action) {
                            step_of.insert(k, i);
                        }
                    }
                }
                ws = i + 1;
            }
            Action::FreeRequested | Action::FreeCompleted => {
                let done = e.action == Action::FreeCompleted;
                let aref = if done {
                    live.remove(&e.addr)
                } else {
                    live.get(&e.addr).copied()
                };
                match aref {
                    Some(a) => aref_at[i] = a,
                    None => p.unmatched_frees += 1,
                }
                // A free call (its free_completed right after, same address) closes a window.
                let closes = !done
                    || (i > 0
                        && trace[i - 1].action == Action::FreeRequested
                        && trace[i - 1].addr == e.addr);
                if closes {
                    empty_cache_runs(trace, ws, i, &mut step_of, &mut side);
                    ws = i + 1;
                }
            }
            Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap => seg_entries.push(i),
            _ => {
                empty_cache_runs(trace, ws, i, &mut step_of, &mut side);
                ws = i + 1;
            }
        }
    }
    empty_cache_runs(trace, ws, trace.len(), &mut step_of, &mut side);
    p.recorded.reserve_exact(seg_entries.len());
    for k in seg_entries {
        let e = &trace[k];
        if let Some(kind) = seg_kind(e.action) {
            p.recorded.push(SegEvent {
                kind,
                addr: e.addr,
                size: e.size,
                step: step_of.get(&k).copied().unwrap_or(k),
            });
        }
    }
    // Side ops were pushed when their window closed; each sits on its own release entry.
    side.sort_by_key(|o| o.pos);
    p.aref_at = aref_at;
    p.side = side;
    p.arefs = next_aref as usize;
    p
}

/// Builds the model at the state of the first trace entry.
pub(crate) fn build_model(settings: Settings, init: &InitialState) -> (Model, Vec<u64>, u64) {
    let mut m = Model::new(settings);
    let mut failures = 0u64;
    for s in &init.segs {
        m.add_segment(s.addr, s.size, s.stream, s.small);
    }
    for e in &init.es {
        let i = m.add_expandable(e.base, e.span, e.stream, e.small);
        for &(a, b) in &e.mapped {
            if !m.init_map(i, a, b.saturating_sub(a)) {
                failures += 1;
            }
        }
    }
    let mut addr_of = Vec::with_capacity(init.allocs.len());
    for a in &init.allocs {
        if m.init_alloc(a.addr, a.size, a.pending) {
            addr_of.push(a.addr);
        } else {
            failures += 1;
            addr_of.push(u64::MAX);
        }
    }
    m.finish_init();
    (m, addr_of, failures)
}

/// The device as the recorded run shows it: memory is refused only in a malloc whose recorded
/// window shows releases (or that ended in `oom`); new segments take the recorded addresses.
struct Recorded<'a> {
    refused: bool,
    oom: bool,
    releases: u32,
    /// Recorded growth events of the current step, and which were used.
    growth: &'a [SegEvent],
    used: Vec<bool>,
}

impl Device for Recorded<'_> {
    fn grant(&mut self, _reserved: u64, _bytes: u64, attempt: u8, released: u64) -> bool {
        if self.oom {
            return false;
        }
        if !self.refused {
            return true;
        }
        match attempt {
            0 => false,
            1 => released >= u64::from(self.releases),
            _ => true,
        }
    }

    fn segment_address(&mut self, size: u64, expandable: bool) -> Option<u64> {
        let want = if expandable {
            SegKind::SegmentMap
        } else {
            SegKind::SegmentAlloc
        };
        let k =
            self.growth.iter().enumerate().position(|(k, g)| {
                !self.used[k] && g.kind == want && (expandable || g.size == size)
            })?;
        self.used[k] = true;
        Some(self.growth[k].addr)
    }
}

/// The device as a capacity whose new segments take the addresses the recorded run gave the
/// same request's segments (where it made one of that size and the range is free; else a fresh
/// one): unchanged, the requests then replay as recorded, address order included (best fit
/// breaks ties between equal blocks by address, so fresh addresses above every segment made
/// a run that releases and makes segments choose other blocks than the recorded one did).
struct CapacityAt<'a> {
    capacity: Capacity,
    recorded: Recorded<'a>,
}

impl Device for CapacityAt<'_> {
    fn grant(&mut self, reserved: u64, bytes: u64, attempt: u8, released: u64) -> bool {
        self.capacity.grant(reserved, bytes, attempt, released)
    }
    fn segment_address(&mut self, size: u64, expandable: bool) -> Option<u64> {
        self.recorded.segment_address(size, expandable)
    }
}

/// The device as a capacity: a new segment fits when reserved + its size ≤ capacity.
pub(crate) struct Capacity(pub Option<u64>);

impl Device for Capacity {
    fn grant(&mut self, reserved: u64, bytes: u64, _attempt: u8, _released: u64) -> bool {
        self.0.is_none_or(|c| reserved.saturating_add(bytes) <= c)
    }
    fn segment_address(&mut self, _size: u64, _expandable: bool) -> Option<u64> {
        None
    }
}

thread_local! {
    /// Block visits of the replays (and checks) run on this thread: see `Model::visits`.
    static VISITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Count `n` visits of a replay that ended on this thread.
pub(crate) fn add_visits(n: u64) {
    VISITS.with(|v| v.set(v.get().saturating_add(n)));
}

/// The visits counted on this thread so far (an operation count for tests).
#[cfg(test)]
pub(crate) fn visits() -> u64 {
    VISITS.with(std::cell::Cell::get)
}

/// What one replay produced.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outcome {
    pub events: Vec<SegEvent>,
    pub reserved_end: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Mallocs that took the OOM path (the device refused their first segment).
    pub retries: u64,
    /// Of those, the ones that ended in an OOM.
    pub retries_failed: u64,
    pub allocations: u64,
    pub addresses_matched: u64,
    pub first_address_mismatch: Option<usize>,
    /// Mallocs the model failed where the recorded run succeeded (trace index of the first).
    pub unexpected_ooms: u64,
    pub first_unexpected_oom: Option<usize>,
    /// Recorded `oom` entries: (trace index, rounded request, reserved at the OOM, fits).
    pub ooms: Vec<(usize, u64, u64, bool)>,
    /// Final allocated blocks (address, size).
    pub live_end: Vec<(u64, u64)>,
    /// Allocations of the rebuilt initial state the model could not place.
    pub init_failures: u64,
    /// The observer stopped the replay before this op's position.
    pub stopped_at: Option<usize>,
    /// Probes (recorded order) that ran their malloc through the OOM path: the device refused
    /// a new segment. Those read as `empty_cache()` calls instead, by position (ascending).
    pub refused_probes: u64,
    pub empty_cache_probes: Vec<u32>,
}

impl Outcome {
    /// The mallocs the OOM path served (a near-OOM: cache released, the retry succeeded).
    pub fn served_retries(&self) -> u64 {
        self.retries.saturating_sub(self.retries_failed)
    }
}

/// How a what-if changes the requests.
#[derive(Clone, Debug, Default)]
pub(crate) struct Edits {
    /// aref → trace position where it is freed instead (frees as recorded are then skipped).
    pub free_at: FxHashMap<u32, usize>,
    /// Rematerialised allocations: (aref, dropped at, made again at, its `alloc` entry). The
    /// block is freed at the first position and allocated again (same size and stream) at the
    /// second; its recorded frees then apply as usual.
    pub remat: Vec<(u32, usize, usize, usize)>,
    /// On a device of a capacity smaller than the memory reserved at the first entry, release
    /// the cached segments first (the OOM path would have released them before the trace).
    pub release_at_start: bool,
    /// Not a change: the probes the validation read as `empty_cache()` calls (positions,
    /// ascending), run as such in the request order (see [`Plan::ops`]).
    pub empty_cache_probes: Vec<u32>,
    /// Not a change: in the request order, new segments take the recorded addresses where
    /// they can ([`CapacityAt`]).
    pub recorded_addresses: bool,
}

/// What one request did, for an [`Observer`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Done {
    /// A malloc ran (a probe's included): its segment events are `m.events[events..]`.
    Malloc {
        entry: usize,
        oom: bool,
        result: Malloc,
        events: usize,
    },
    /// The program freed the block at `addr` (`free_requested` or `free_completed`).
    Free { addr: u64 },
    /// Cached segments were released (an `empty_cache()`, or a probe read as one): its segment
    /// events are `m.events[events..]`.
    EmptyCache { events: usize },
}

/// Watches a replay request by request. `addr_of` has the model's address of the block of each
/// live allocation reference. Returning `false` stops the replay there.
pub(crate) trait Observer {
    /// Before the op runs (every op with a lower position has run).
    fn before(&mut self, _op: &Op, _m: &Model, _addr_of: &AddrOf) -> bool {
        true
    }
    /// After the op did something.
    fn after(&mut self, _op: &Op, _done: Done, _m: &Model, _addr_of: &AddrOf) -> bool {
        true
    }
    /// After the last op, unless the replay was stopped.
    fn end(&mut self, _m: &Model, _addr_of: &AddrOf) {}
}

/// An observer that stops the replay once the flag is raised (the device turned out not to
/// validate while a what-if ran beside its validation).
pub(crate) struct Unless<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Observer for Unless<'_> {
    fn before(&mut self, _op: &Op, _m: &Model, _addr_of: &AddrOf) -> bool {
        !self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Replay the device's requests through the model. `as_recorded`: the recorded order and the
/// recorded device answers (validation); otherwise the request order with `capacity`. `obs`
/// sees every request as it runs and may stop the replay.
#[allow(clippy::too_many_arguments)]
pub(crate) fn replay<O: Observer + ?Sized>(
    trace: &[TraceEntry],
    plan: &Plan,
    init: &InitialState,
    settings: Settings,
    as_recorded: bool,
    capacity: Option<u64>,
    edits: &Edits,
    obs: &mut O,
) -> Outcome {
    let (mut m, init_addrs, init_failures) = build_model(settings, init);
    let mut addr_of = AddrOf::new(plan.arefs);
    for (i, &a) in init_addrs.iter().enumerate() {
        addr_of.set(i as u32, a);
    }
    if edits.release_at_start && capacity.is_some_and(|c| m.reserved > c) {
        m.release_cached_blocks();
    }
    let mut out = Outcome::default();
    let ops = plan.ops(trace, as_recorded, &edits.empty_cache_probes);
    // Recorded growth events by step, for recorded addresses.
    let (growth, mut growth_by_step) = growth_by_step(plan);
    // Early frees (and rematerialisation drops) sorted by position, then the re-allocations.
    let (early, again) = schedule(edits);
    let (mut ei, mut ai) = (0usize, 0usize);
    let moved = Moved::of(edits);
    let mut capacity_dev = Capacity(capacity);
    // Mallocs a probe already ran.
    let mut ran_early: FxHashMap<usize, ()> = FxHashMap::default();

    let mut stopped = false;
    for op in ops {
        let op = &op;
        if !obs.before(op, &m, &addr_of) {
            stopped = true;
            out.stopped_at = Some(op.pos);
            break;
        }
        while ei < early.len() && early[ei].0 <= op.pos {
            let a = early[ei].1;
            if let Some(addr) = addr_of.get(a) {
                m.step = early[ei].0;
                m.free_requested(addr);
                m.free_completed(addr);
                addr_of.clear(a);
            }
            ei += 1;
        }
        while ai < again.len() && again[ai].0 <= op.pos {
            let (_, a, entry) = again[ai];
            if let Some(e) = trace.get(entry)
                && (a as usize) < plan.arefs
                && addr_of.get(a).is_none()
            {
                m.step = again[ai].0;
                let result = m.malloc(e.size, e.stream, &mut capacity_dev);
                settle(&mut out, &mut m, &mut addr_of, a, entry, e, false, result);
            }
            ai += 1;
        }
        m.step = op.step;
        let events = m.events.len();
        let done = match op.kind {
            OpKind::Probe { entry, releases } => {
                let e = &trace[entry];
                let oom = e.action == Action::Oom;
                let size = if oom {
                    e.size
                } else {
                    m.settings.round_size(e.size)
                };
                if m.would_find(size, e.stream) {
                    out.empty_cache_probes.push(op.pos as u32);
                    m.release_cached_blocks();
                    Done::EmptyCache { events }
                } else {
                    out.refused_probes += 1;
                    ran_early.insert(entry, ());
                    let (lo, hi) = growth_by_step.range(op.step);
                    let g: &[SegEvent] = if lo <= hi { &growth[lo..=hi] } else { &[] };
                    let mut dev = Recorded {
                        refused: true,
                        oom,
                        releases,
                        growth: g,
                        used: vec![false; g.len()],
                    };
                    let result = m.malloc_rounded(size, e.stream, &mut dev);
                    settle(
                        &mut out,
                        &mut m,
                        &mut addr_of,
                        op.aref,
                        entry,
                        e,
                        oom,
                        result,
                    );
                    Done::Malloc {
                        entry,
                        oom,
                        result,
                        events,
                    }
                }
            }
            OpKind::Malloc {
                entry,
                oom,
                refused,
                releases,
            } => {
                if !ran_early.is_empty() && ran_early.contains_key(&entry) {
                    continue;
                }
                if !oom
                    && moved.has(op.aref)
                    && edits.free_at.get(&op.aref).is_some_and(|&p| p <= entry)
                {
                    continue; // never allocated
                }
                let e = &trace[entry];
                let result = if as_recorded || edits.recorded_addresses {
                    let (lo, hi) = growth_by_step.range(op.step);
                    let g: &[SegEvent] = if lo <= hi { &growth[lo..=hi] } else { &[] };
                    let recorded = Recorded {
                        refused,
                        oom,
                        releases,
                        growth: g,
                        used: vec![false; g.len()],
                    };
                    if as_recorded {
                        malloc_on(&mut m, e, oom, &mut { recorded })
                    } else {
                        let capacity = Capacity(capacity);
                        malloc_on(&mut m, e, oom, &mut CapacityAt { capacity, recorded })
                    }
                } else {
                    malloc_on(&mut m, e, oom, &mut capacity_dev)
                };
                settle(
                    &mut out,
                    &mut m,
                    &mut addr_of,
                    op.aref,
                    entry,
                    e,
                    oom,
                    result,
                );
                Done::Malloc {
                    entry,
                    oom,
                    result,
                    events,
                }
            }
            OpKind::FreeRequested | OpKind::FreeCompleted => {
                if moved.has(op.aref) {
                    continue;
                }
                let Some((addr, hint)) = addr_of.get_hinted(op.aref) else {
                    continue;
                };
                if op.kind == OpKind::FreeRequested {
                    m.free_requested_at(addr, hint);
                } else {
                    m.free_completed_at(addr, hint);
                    addr_of.clear(op.aref);
                }
                Done::Free { addr }
            }
            OpKind::EmptyCache => {
                m.release_cached_blocks();
                Done::EmptyCache { events }
            }
        };
        if !obs.after(op, done, &m, &addr_of) {
            stopped = true;
            out.stopped_at = Some(op.pos);
            break;
        }
    }
    while !stopped && ei < early.len() {
        let a = early[ei].1;
        if let Some(addr) = addr_of.get(a) {
            m.free_requested(addr);
            m.free_completed(addr);
        }
        ei += 1;
    }
    if !stopped {
        obs.end(&m, &addr_of);
    }
    out.init_failures = init_failures;
    finish(out, m)
}

/// The malloc of trace entry `e` on `dev` (an `oom` entry records the rounded size).
fn malloc_on(m: &mut Model, e: &TraceEntry, oom: bool, dev: &mut dyn Device) -> Malloc {
    if oom {
        m.malloc_rounded(e.size, e.stream, dev)
    } else {
        m.malloc(e.size, e.stream, dev)
    }
}

/// What a finished replay leaves: the model's totals, the live blocks and its segment events.
fn finish(mut out: Outcome, mut m: Model) -> Outcome {
    add_visits(m.visits.get());
    out.reserved_end = m.reserved;
    out.peak_allocated = m.peak_allocated;
    out.peak_reserved = m.peak_reserved;
    out.retries = m.retries;
    out.retries_failed = m.retries_failed;
    out.live_end = m
        .blocks
        .iter()
        .filter(|(_, b)| b.state == super::model::St::Alloc)
        .map(|(a, b)| (a, b.size))
        .collect();
    out.live_end.sort_unstable();
    out.events = std::mem::take(&mut m.events);
    out
}

/// The recorded growth events (`segment_alloc`/`segment_map`) in trace order, and the range of
/// them each step holds.
fn growth_by_step(plan: &Plan) -> (Vec<SegEvent>, GrowthSteps) {
    let growth: Vec<SegEvent> = plan
        .recorded
        .iter()
        .filter(|e| matches!(e.kind, SegKind::SegmentAlloc | SegKind::SegmentMap))
        .copied()
        .collect();
    let mut sorted: Vec<(usize, usize)> = growth
        .iter()
        .enumerate()
        .map(|(k, e)| (e.step, k))
        .collect();
    sorted.sort_unstable();
    // growth is in trace order; steps of growth events are non-decreasing in practice. A step's
    // range runs from its first event to its last.
    let mut ranges: Vec<(usize, usize, usize)> = Vec::new();
    for (step, k) in sorted {
        match ranges.last_mut() {
            Some(r) if r.0 == step => r.2 = k,
            _ => ranges.push((step, k, k)),
        }
    }
    (growth, GrowthSteps { ranges, cur: 0 })
}

/// The range of recorded growth events each step holds, looked up by a cursor: the replay asks
/// for the steps of its mallocs in trace order, so a lookup is a step or two forward in a sorted
/// list instead of a hash probe (a trace has tens of thousands of growth events, a hash table of
/// them does not stay in cache, and every malloc of the validation asked it). A step behind the
/// cursor (a probe runs its malloc early) is found by a binary search.
struct GrowthSteps {
    /// (step, first event, last event), by step.
    ranges: Vec<(usize, usize, usize)>,
    /// No range before it has a step at or above the last step asked for in order.
    cur: usize,
}

impl GrowthSteps {
    /// The (first, last) growth event of `step`; (1, 0) when it has none.
    #[inline]
    fn range(&mut self, step: usize) -> (usize, usize) {
        let r = &self.ranges;
        if self.cur > 0 && r[self.cur - 1].0 >= step {
            return match r[..self.cur].binary_search_by_key(&step, |x| x.0) {
                Ok(k) => (r[k].1, r[k].2),
                Err(_) => (1, 0),
            };
        }
        while self.cur < r.len() && r[self.cur].0 < step {
            self.cur += 1;
        }
        match r.get(self.cur) {
            Some(&(s, lo, hi)) if s == step => (lo, hi),
            _ => (1, 0),
        }
    }
}

/// A what-if's early frees (and rematerialisation drops) by position, and its re-allocations
/// (position, allocation, entry), each sorted.
#[allow(clippy::type_complexity)]
fn schedule(edits: &Edits) -> (Vec<(usize, u32)>, Vec<(usize, u32, usize)>) {
    let mut early: Vec<(usize, u32)> = edits.free_at.iter().map(|(&a, &p)| (p, a)).collect();
    early.extend(edits.remat.iter().map(|&(a, drop, _, _)| (drop, a)));
    early.sort_unstable();
    let mut again: Vec<(usize, u32, usize)> = edits
        .remat
        .iter()
        .map(|&(a, _, at, entry)| (at, a, entry))
        .collect();
    again.sort_unstable();
    (early, again)
}

/// The references a what-if's `free_at` moves, as bits: most requests are not about one, and
/// a bit answers without hashing.
struct Moved(Vec<u64>);

impl Moved {
    fn of(edits: &Edits) -> Moved {
        let top = edits
            .free_at
            .keys()
            .max()
            .map_or(0, |&a| a as usize / 64 + 1);
        let mut bits = vec![0u64; top];
        for &a in edits.free_at.keys() {
            bits[a as usize / 64] |= 1 << (a % 64);
        }
        Moved(bits)
    }

    #[inline(always)]
    fn has(&self, a: u32) -> bool {
        self.0
            .get(a as usize / 64)
            .is_some_and(|w| w & (1 << (a % 64)) != 0)
    }
}

/// Book a malloc's result.
#[allow(clippy::too_many_arguments)]
fn settle(
    out: &mut Outcome,
    m: &mut Model,
    addr_of: &mut AddrOf,
    aref: u32,
    entry: usize,
    e: &TraceEntry,
    oom: bool,
    result: Malloc,
) {
    match (result, oom) {
        (Malloc::Ok { addr, .. }, false) => {
            out.allocations += 1;
            if addr == e.addr {
                out.addresses_matched += 1;
            } else {
                out.first_address_mismatch.get_or_insert(entry);
            }
            addr_of.set_hinted(aref, addr, m.handed);
        }
        (Malloc::Oom, false) => {
            out.unexpected_ooms += 1;
            out.first_unexpected_oom.get_or_insert(entry);
        }
        (Malloc::Ok { addr, .. }, true) => {
            out.ooms.push((entry, e.size, m.reserved, true));
            // The program never got this block: hand it back at once.
            m.free_requested(addr);
            m.free_completed(addr);
        }
        (Malloc::Oom, true) => out.ooms.push((entry, e.size, m.reserved, false)),
    }
}

#[cfg(test)]
mod tests {
    use super::{Plan, SegEvent, SegKind, growth_by_step};
    use rustc_hash::FxHashMap;

    /// The cursor answers as the step's (first, last) event would, for steps asked in order,
    /// steps asked again, and steps behind the cursor (a probe's malloc run early).
    #[test]
    fn growth_steps_answer_every_step_as_a_map_would() {
        let mut rng = crate::test_rng::XorShift::new(0x9e37_79b9_7f4a_7c15);
        let mut next = move || rng.next_u64();
        for _ in 0..50 {
            // Events by step, non-decreasing, several a step at times.
            let mut steps: Vec<usize> = Vec::new();
            let mut s = 0usize;
            for _ in 0..(next() % 60) {
                s += (next() % 4) as usize;
                steps.push(s);
            }
            let mut want: FxHashMap<usize, (usize, usize)> = FxHashMap::default();
            for (k, &st) in steps.iter().enumerate() {
                let r = want.entry(st).or_insert((k, k));
                r.1 = k;
            }
            let plan = Plan {
                recorded: steps
                    .iter()
                    .map(|&step| SegEvent {
                        step,
                        kind: SegKind::SegmentAlloc,
                        addr: 0,
                        size: 0,
                    })
                    .collect(),
                ..Plan::default()
            };
            let (growth, mut g) = growth_by_step(&plan);
            assert_eq!(growth.len(), steps.len());
            let mut at = 0usize;
            for _ in 0..300 {
                let ask = match next() % 6 {
                    // Behind (a probe's step ahead was asked first) or again.
                    0 => at.saturating_sub((next() % 10) as usize),
                    1 => at + (next() % 20) as usize,
                    _ => {
                        at += (next() % 3) as usize;
                        at
                    }
                };
                let got = g.range(ask);
                assert_eq!(got, want.get(&ask).copied().unwrap_or((1, 0)), "step {ask}");
            }
        }
    }
}
