//! Will it fit: the smallest device capacity on which a device's requests run without an OOM,
//! and what happens on a given capacity.
//!
//! Every answer is a replay of the program's requests (in the request order, as a what-if runs
//! them) on a device of a capacity: a new segment (or page map) is granted while reserved + its
//! size ≤ capacity, and a refused one goes through the allocator's own OOM path (free the cached
//! blocks that can serve it, then every cached segment, retry). The smallest capacity is found by
//! bisection on a 2 MiB grid between the peak of allocated bytes (below it nothing fits) and the
//! peak reserved without a limit (there the run is the unlimited one). Bisection assumes more
//! memory never hurts; [`needs`] checks that on capacities above the answer and, where one
//! fails, moves the answer above it. A capacity between the peak reserved of a replay that fit
//! and that replay's capacity is answered from it, without a replay. See docs/FITS.md.
//!
//! Plain data in, plain data out: no IO, no rendering.

use serde::Serialize;

use super::addr_of::AddrOf;
use super::initial::InitialState;
use super::model::{Malloc, Model};
use super::run::{self, Done, Edits, Observer, Op, Plan};
use super::settings::Settings;
use crate::torch::model::{StackId, TraceEntry};

/// The grid `needs` is exact to.
pub const FIT_GRANULARITY: u64 = 2 << 20;

/// The `max_split_size_mb` values tried for the best `needs` under that setting.
pub const FIT_MAX_SPLIT_TRIALS_MB: [u64; 6] = [20, 32, 64, 128, 256, 512];

/// The requests of one device, ready to replay: a trace, its plan and the state at its start.
pub(crate) struct Requests<'a> {
    pub trace: &'a [TraceEntry],
    pub plan: &'a Plan,
    pub init: &'a InitialState,
    pub settings: Settings,
    /// The probes the validation read as `empty_cache()` calls, which the program makes on
    /// any device, and whether new segments take the recorded addresses (see `Edits`): a
    /// recorded trace's requests then replay, unchanged and with room, as the recorded run.
    pub empty_cache_probes: &'a [u32],
    pub recorded_addresses: bool,
}

/// Live bytes at a failure, grouped by the stack that allocated them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveByStack {
    #[serde(skip)]
    pub stack: Option<StackId>,
    pub bytes: u64,
    pub blocks: u64,
}

/// The first request a capacity cannot serve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// Trace index of the request; `None`: the blocks live at the first trace entry (and the
    /// segments that hold them) do not fit by themselves.
    pub entry: Option<u64>,
    /// The request, rounded as the allocator rounds it.
    pub request_bytes: u64,
    /// Its stack (the trace entry's).
    #[serde(skip)]
    pub stack: Option<StackId>,
    pub capacity_bytes: u64,
    /// Reserved and allocated bytes when it failed (after the OOM path).
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// What was live then, by allocating stack, largest first.
    pub live: Vec<LiveByStack>,
}

/// One replay at one capacity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub fits: bool,
    pub failure: Option<Failure>,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub reserved_end: u64,
}

/// The smallest capacity that serves every request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Needs {
    pub needs_bytes: u64,
    /// Peaks of the run without a limit (the bounds of the search).
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Every capacity checked above `needs_bytes` fit.
    pub monotonic: bool,
    /// Capacities checked above the answer (besides the bisection's own).
    pub capacities_checked: u32,
    /// The largest capacity that failed although a smaller one fit (when not monotonic).
    pub failed_above_a_fit: Option<u64>,
    /// Replays run for this answer.
    pub replays: u32,
}

/// Watches a capacity replay and stops it at the first request the device cannot serve.
struct FirstFailure<'a> {
    capacity: u64,
    started: bool,
    /// Stack of each allocation reference (empty: do not group what was live).
    stacks: &'a [Option<StackId>],
    trace: &'a [TraceEntry],
    failure: Option<Failure>,
}

impl FirstFailure<'_> {
    fn fail(&mut self, entry: Option<usize>, size: u64, m: &Model, addr_of: &AddrOf) {
        let mut live: Vec<LiveByStack> = Vec::new();
        if !self.stacks.is_empty() {
            let mut by: rustc_hash::FxHashMap<Option<StackId>, (u64, u64)> =
                rustc_hash::FxHashMap::default();
            for (r, addr) in addr_of.sorted() {
                let Some(b) = m.blocks.get(addr) else {
                    continue;
                };
                if b.state != super::model::St::Alloc {
                    continue;
                }
                let s = self.stacks.get(r as usize).copied().flatten();
                let g = by.entry(s).or_default();
                g.0 = g.0.saturating_add(b.size);
                g.1 += 1;
            }
            live = by
                .into_iter()
                .map(|(stack, (bytes, blocks))| LiveByStack {
                    stack,
                    bytes,
                    blocks,
                })
                .collect();
            live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.stack.cmp(&b.stack)));
        }
        self.failure = Some(Failure {
            entry: entry.map(|e| e as u64),
            request_bytes: size,
            stack: entry
                .and_then(|e| self.trace.get(e))
                .and_then(|e| e.stack()),
            capacity_bytes: self.capacity,
            reserved_bytes: m.reserved,
            allocated_bytes: m.allocated,
            live,
        });
    }
}

impl Observer for FirstFailure<'_> {
    fn before(&mut self, _op: &Op, m: &Model, addr_of: &AddrOf) -> bool {
        if !self.started {
            self.started = true;
            if m.reserved > self.capacity {
                self.fail(None, 0, m, addr_of);
                return false;
            }
        }
        true
    }

    fn after(&mut self, _op: &Op, done: Done, m: &Model, addr_of: &AddrOf) -> bool {
        if let Done::Malloc {
            entry,
            oom,
            result: Malloc::Oom,
            ..
        } = done
        {
            let e = &self.trace[entry];
            let size = if oom {
                e.size
            } else {
                m.settings.round_size(e.size)
            };
            self.fail(Some(entry), size, m, addr_of);
            return false;
        }
        true
    }

    fn end(&mut self, m: &Model, addr_of: &AddrOf) {
        // A trace without requests: only the state at its start decides.
        if !self.started && m.reserved > self.capacity {
            self.fail(None, 0, m, addr_of);
        }
    }
}

/// Replay `req` on a device of `capacity` bytes (`None`: unlimited). Cached segments of the
/// state at the first entry are released first when they do not fit (the OOM path would have
/// released them earlier). `stacks`: each allocation reference's stack, to group what was live
/// at a failure (empty: not grouped).
pub(crate) fn attempt(
    req: &Requests,
    capacity: Option<u64>,
    stacks: &[Option<StackId>],
) -> Attempt {
    let edits = Edits {
        release_at_start: true,
        empty_cache_probes: req.empty_cache_probes.to_vec(),
        recorded_addresses: req.recorded_addresses,
        ..Edits::default()
    };
    let mut obs = FirstFailure {
        capacity: capacity.unwrap_or(u64::MAX),
        started: false,
        stacks,
        trace: req.trace,
        failure: None,
    };
    let out = run::replay(
        req.trace,
        req.plan,
        req.init,
        req.settings.clone(),
        false,
        capacity,
        &edits,
        &mut obs,
    );
    Attempt {
        fits: obs.failure.is_none(),
        failure: obs.failure,
        peak_allocated: out.peak_allocated,
        peak_reserved: out.peak_reserved,
        reserved_end: out.reserved_end,
    }
}

fn down(x: u64) -> u64 {
    x / FIT_GRANULARITY * FIT_GRANULARITY
}

fn up(x: u64) -> u64 {
    x.div_ceil(FIT_GRANULARITY).saturating_mul(FIT_GRANULARITY)
}

/// The smallest capacity (a multiple of 2 MiB) on which every request of `req` is served, with
/// `samples` capacities between it and the unlimited run's peak reserved checked to fit too.
pub(crate) fn needs(req: &Requests, samples: u32) -> Needs {
    let mut replays = 0u32;
    let free = attempt(req, None, &[]);
    // Replays that fit, as (their peak reserved, their capacity). Such a replay is the replay at
    // every capacity between the two: each segment it was granted (reserved + size ≤ its peak)
    // is granted there too, each it was refused is refused there too, so the same requests are
    // served the same way and it fits; those capacities need no replay of their own. The
    // unlimited run is one when it fits (its capacity: any).
    let mut fitted: Vec<(u64, u64)> = Vec::new();
    if free.fits {
        fitted.push((free.peak_reserved, u64::MAX));
    }
    let mut fits = |c: u64| {
        if fitted.iter().any(|&(peak, cap)| peak <= c && c <= cap) {
            return true;
        }
        replays += 1;
        let a = attempt(req, Some(c), &[]);
        if a.fits {
            fitted.push((a.peak_reserved, c));
        }
        a.fits
    };
    let mut top = up(free.peak_reserved).max(FIT_GRANULARITY);
    // The unlimited run never asks for more than its peak; should the model disagree, grow.
    let mut guard = 0;
    while !fits(top) && guard < 8 {
        top = top.saturating_mul(2);
        guard += 1;
    }
    // Below the peak of allocated bytes nothing fits: allocated ≤ reserved ≤ capacity.
    let floor = down(free.peak_allocated.saturating_sub(1));
    let bisect = |mut lo: u64, mut hi: u64, fits: &mut dyn FnMut(u64) -> bool| {
        // lo fails (or is the floor), hi fits.
        while hi.saturating_sub(lo) > FIT_GRANULARITY {
            let mid = lo + (hi - lo) / FIT_GRANULARITY / 2 * FIT_GRANULARITY;
            if fits(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    };
    let mut answer = if floor == 0 && fits(0) {
        0
    } else {
        bisect(floor, top, &mut fits)
    };
    let mut checked = 0u32;
    let mut failed_above = None;
    // Check capacities above the answer: evenly spaced up to the top, and the next step.
    'check: for _ in 0..4 {
        let span = top.saturating_sub(answer) / FIT_GRANULARITY;
        let n = u64::from(samples).min(span);
        let mut points: Vec<u64> = (1..=n)
            .map(|k| answer + (span * k / n.max(1)) * FIT_GRANULARITY)
            .collect();
        if span > 0 {
            points.push(answer + FIT_GRANULARITY);
        }
        points.sort_unstable();
        points.dedup();
        for &c in points.iter().rev() {
            checked += 1;
            if !fits(c) {
                failed_above = Some(failed_above.map_or(c, |f: u64| f.max(c)));
                answer = bisect(c, top, &mut fits);
                continue 'check;
            }
        }
        break;
    }
    Needs {
        needs_bytes: answer,
        peak_allocated_bytes: free.peak_allocated,
        peak_reserved_bytes: free.peak_reserved,
        monotonic: failed_above.is_none(),
        capacities_checked: checked,
        failed_above_a_fit: failed_above,
        replays,
    }
}

/// What to ask of [`fit_device`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitOptions {
    /// Also replay on a device of this many bytes.
    pub capacity: Option<u64>,
    /// Also find `needs` under `expandable_segments:True` and each of
    /// [`FIT_MAX_SPLIT_TRIALS_MB`].
    pub settings_trials: bool,
    /// Capacities above the answer checked to fit too (the monotonicity check).
    pub samples: u32,
}

impl Default for FitOptions {
    fn default() -> FitOptions {
        FitOptions {
            capacity: None,
            settings_trials: true,
            samples: 16,
        }
    }
}

/// `needs` under one allocator setting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SettingNeeds {
    /// As written in `PYTORCH_CUDA_ALLOC_CONF`.
    pub setting: String,
    pub needs_bytes: u64,
}

/// The replay on one capacity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AtCapacity {
    pub capacity_bytes: u64,
    pub fits: bool,
    /// capacity − needs, when it fits.
    pub spare_bytes: Option<u64>,
    pub peak_reserved_bytes: u64,
    pub first_failure: Option<Failure>,
    /// Settings under which the same capacity serves every request.
    pub fits_with: Vec<String>,
}

/// Will it fit, for one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceFit {
    pub device: i64,
    /// The unchanged replay validates: the numbers below are simulated; otherwise there are
    /// none (see `note`).
    pub validated: bool,
    pub settings: Settings,
    pub needs: Option<Needs>,
    pub needs_bytes_expandable: Option<u64>,
    /// `needs` under each `max_split_size_mb` tried.
    pub max_split: Vec<SettingNeeds>,
    /// The `max_split_size_mb` with the smallest `needs` (the smallest value on a tie).
    pub best_max_split_size_mb: Option<u64>,
    pub needs_bytes_max_split: Option<u64>,
    /// Device memory of the recorded run: the smallest reserved + free over its `oom` entries.
    pub recorded_capacity_bytes: Option<u64>,
    /// Where no OOM is recorded but the device refused memory: the range its capacity lies in
    /// by those refusals (see `DeviceReplay::capacity_read`).
    pub recorded_capacity_range_bytes: Option<(u64, u64)>,
    pub on: Option<AtCapacity>,
    pub note: Option<String>,
}

/// Will the requests of `device` fit (see [`super::Replays::fit`]).
pub fn fit_device(
    snap: &crate::torch::model::Snapshot,
    device: i64,
    opts: &FitOptions,
) -> DeviceFit {
    super::Replays::new().fit(snap, device, opts)
}

/// `needs`, `needs` under other settings, and the replay at a capacity, for any requests.
pub(crate) fn fit_requests(
    req: &Requests,
    stacks: &[Option<StackId>],
    opts: &FitOptions,
) -> (Needs, Option<u64>, Vec<SettingNeeds>, Option<AtCapacity>) {
    let base = needs(req, opts.samples);
    let with = |key: &str, value: &str| {
        let mut s = req.settings.clone();
        s.apply(key, value).then_some(Requests {
            trace: req.trace,
            plan: req.plan,
            init: req.init,
            settings: s,
            empty_cache_probes: req.empty_cache_probes,
            recorded_addresses: req.recorded_addresses,
        })
    };
    let mut expandable = None;
    let mut splits = Vec::new();
    if opts.settings_trials {
        if let Some(r) = with("expandable_segments", "True") {
            expandable = Some(needs(&r, opts.samples).needs_bytes);
        }
        for mb in FIT_MAX_SPLIT_TRIALS_MB {
            if let Some(r) = with("max_split_size_mb", &mb.to_string()) {
                splits.push(SettingNeeds {
                    setting: format!("max_split_size_mb:{mb}"),
                    needs_bytes: needs(&r, opts.samples).needs_bytes,
                });
            }
        }
    }
    let on = opts.capacity.map(|c| {
        let a = attempt(req, Some(c), stacks);
        let mut fits_with = Vec::new();
        if !a.fits {
            let mut tries = vec![("expandable_segments", "True".to_string())];
            tries.extend(
                FIT_MAX_SPLIT_TRIALS_MB
                    .iter()
                    .map(|mb| ("max_split_size_mb", mb.to_string())),
            );
            for (k, v) in tries {
                if let Some(r) = with(k, &v)
                    && attempt(&r, Some(c), &[]).fits
                {
                    fits_with.push(format!("{k}:{v}"));
                }
            }
        }
        AtCapacity {
            capacity_bytes: c,
            fits: a.fits,
            spare_bytes: a.fits.then(|| c.saturating_sub(base.needs_bytes)),
            peak_reserved_bytes: a.peak_reserved,
            first_failure: a.failure,
            fits_with,
        }
    });
    (base, expandable, splits, on)
}

impl super::Replays {
    /// Will the recorded requests of `device` fit: the smallest capacity (exact to 2 MiB) on
    /// which they run without an OOM under the recorded settings, with
    /// `expandable_segments:True` and with the best `max_split_size_mb` tried, and the replay on
    /// `opts.capacity`. Only on a device whose unchanged replay validates.
    pub fn fit(
        &self,
        snap: &crate::torch::model::Snapshot,
        device: i64,
        opts: &FitOptions,
    ) -> DeviceFit {
        let p = self.prepared(snap, device);
        let v = self.validation(snap, device);
        let mut f = DeviceFit {
            device,
            validated: v.replay.validated,
            settings: p.settings.clone(),
            needs: None,
            needs_bytes_expandable: None,
            max_split: Vec::new(),
            best_max_split_size_mb: None,
            needs_bytes_max_split: None,
            recorded_capacity_bytes: super::capacity_of(snap.trace(device), &v.out),
            recorded_capacity_range_bytes: v.replay.capacity_read,
            on: None,
            note: None,
        };
        if !v.replay.validated {
            f.note = Some(format!(
                "not simulated: the replay does not validate on this device ({})",
                v.replay.note.clone().unwrap_or_default()
            ));
            return f;
        }
        let trace = snap.trace(device);
        let stacks: Vec<Option<StackId>> = super::state::alloc_info(snap, &p)
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        let req = Requests {
            trace,
            plan: &p.plan,
            init: &p.init,
            settings: p.settings.clone(),
            empty_cache_probes: &v.out.empty_cache_probes,
            recorded_addresses: true,
        };
        let (base, exp, splits, on) = fit_requests(&req, &stacks, opts);
        let best = splits
            .iter()
            .zip(FIT_MAX_SPLIT_TRIALS_MB)
            .min_by_key(|(s, mb)| (s.needs_bytes, *mb));
        f.best_max_split_size_mb = best.map(|(_, mb)| mb);
        f.needs_bytes_max_split = best.map(|(s, _)| s.needs_bytes);
        if !base.monotonic {
            f.note = Some(format!(
                "more memory does not always help here: {} B failed although less fit; needs is \
                 the smallest capacity above which every capacity checked fits",
                base.failed_above_a_fit.unwrap_or(0)
            ));
        }
        f.needs = Some(base);
        f.needs_bytes_expandable = exp;
        f.max_split = splits;
        f.on = on;
        f
    }
}
