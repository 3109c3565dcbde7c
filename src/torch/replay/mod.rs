//! A replay of PyTorch's CUDA caching allocator, validated against the segment events the
//! allocator recorded, and what-if replays on top of it.
//!
//! For each device: the allocator state at the first trace entry is rebuilt by walking the trace
//! backwards from the snapshot's segments ([`initial`]); the program's requests (`alloc`,
//! `free_requested`, `free_completed`, `oom`, and `empty_cache()` calls inferred from releases
//! outside any allocation) are replayed through a model of `DeviceCachingAllocator`
//! ([`model`]); the model's `segment_alloc`/`segment_free`/`segment_map`/`segment_unmap` are
//! compared with the recorded ones, and its reserved bytes at the end with the snapshot's.
//! A what-if ([`what_if`]) replays the same requests with a change and is only called
//! simulated where the unchanged replay validated. See docs/REPLAY.md.
//!
//! Plain data in, plain data out: no IO, no rendering.

mod addr_of;
mod check;
#[cfg(test)]
mod cost_tests;
pub mod fit;
pub mod fit_sites;
mod free;
mod initial;
mod model;
pub mod predict;
mod refusals;
mod run;
mod settings;
pub mod sim_checkpoint;
mod state;
#[cfg(test)]
mod tests;
pub mod whatif;

use serde::Serialize;

pub use model::SegKind;
pub use settings::Settings;
pub use state::{At, recorded_states, state_after, state_at_capacity};

use crate::torch::model::{Action, Segment, Snapshot, TraceEntry};
use initial::InitialState;
use run::{Edits, Plan};

/// The replay of one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceReplay {
    pub device: i64,
    pub trace_entries: u64,
    /// Every recorded segment event matched in order and size, none extra, reserved bytes at
    /// the end equal.
    pub validated: bool,
    pub segment_events_recorded: u64,
    pub segment_events_matched: u64,
    pub segment_events_replayed: u64,
    pub reserved_end_bytes_recorded: u64,
    pub reserved_end_bytes_replayed: u64,
    /// `alloc` entries the model served, and how many at the recorded address.
    pub allocations: u64,
    pub allocation_addresses_matched: u64,
    /// Trace index of the first `alloc` the model placed elsewhere.
    pub first_address_mismatch: Option<u64>,
    /// Allocated blocks at the end (address and size) equal the snapshot's.
    pub live_blocks_end_matched: bool,
    /// Peaks over the trace (from the rebuilt initial state on).
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub note: Option<String>,
    /// Changes (fixes, settings) are replayed on this device: it validates and its recorded
    /// run can be replayed without the recorded device answers (see the note otherwise).
    #[serde(skip)]
    pub fixes_replayed: bool,
    /// Where no OOM is recorded but the device refused memory: its capacity range read from
    /// the refusals (lowest, highest), at both ends of which the changes are replayed.
    #[serde(skip)]
    pub capacity_read: Option<(u64, u64)>,
    /// With `capacity_read`: each malloc the device refused (its OOM-retry path), as the
    /// validation replayed it (the releases, and the request that followed).
    #[serde(skip)]
    pub refusals: Vec<crate::torch::release::OomRetry>,
}

/// The replay of one capture (every device with a trace).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CaptureReplay {
    pub validated: bool,
    pub segment_events_recorded: u64,
    pub segment_events_matched: u64,
    pub reserved_end_bytes_recorded: u64,
    pub reserved_end_bytes_replayed: u64,
    pub note: Option<String>,
    pub devices: Vec<DeviceReplay>,
    /// Every device replays changes ([`DeviceReplay::fixes_replayed`]).
    #[serde(skip)]
    pub fixes_replayed: bool,
}

impl CaptureReplay {
    /// The replay of a capture whose simulations have not run yet (the language server's
    /// first publish).
    pub fn pending() -> CaptureReplay {
        CaptureReplay {
            validated: false,
            segment_events_recorded: 0,
            segment_events_matched: 0,
            reserved_end_bytes_recorded: 0,
            reserved_end_bytes_replayed: 0,
            note: Some("simulating: the allocator replay has not finished yet".into()),
            devices: Vec::new(),
            fixes_replayed: false,
        }
    }
}

/// One change to replay with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Change {
    /// Free these allocations (their `alloc` entry indices in the device trace) just before
    /// trace entry `at` instead of when recorded; one whose `alloc` is at or after `at` is
    /// never made.
    FreeEarly { allocs: Vec<usize>, at: usize },
    /// Activation checkpointing: each allocation (its `alloc` entry index) is freed just before
    /// trace entry `drop_at` (dropped in the forward) and made again just before `again_at`
    /// (recomputed in the backward), then freed as recorded.
    Rematerialize { allocs: Vec<(usize, usize, usize)> },
    /// `expandable_segments:True|False`.
    ExpandableSegments(bool),
    /// `max_split_size_mb:N` (N ≥ 20, as PyTorch requires).
    MaxSplitSizeMb(u64),
    /// `roundup_power2_divisions:N` or `roundup_power2_divisions:[256:4,>:8]`.
    RoundupPower2Divisions(String),
}

/// One recorded `oom` entry under a what-if.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomOutcome {
    pub trace_index: u64,
    /// The rounded request that failed.
    pub request_bytes: u64,
    /// Reserved + `device_free` at the OOM in the unchanged replay.
    pub capacity_bytes: Option<u64>,
    /// The request would have been served under the change.
    pub fits_after: bool,
}

/// A what-if result for one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WhatIf {
    pub device: i64,
    /// The unchanged replay validated on this device, so the numbers are a simulation of the
    /// allocator; `false`: not offered (see `note`), the numbers are left at 0.
    pub simulated: bool,
    pub settings: Settings,
    pub peak_allocated_before: u64,
    pub peak_allocated_after: u64,
    pub peak_reserved_before: u64,
    pub peak_reserved_after: u64,
    /// Device memory the replay may reserve (smallest reserved + device_free over the recorded
    /// OOMs, or the end of the range read from refusals the numbers are told at); `None`:
    /// unknown, new segments always succeed.
    pub capacity_bytes: Option<u64>,
    pub ooms: Vec<OomOutcome>,
    /// Allocations that succeeded in the recorded run but fail under the change.
    pub new_ooms: u64,
    /// Mallocs that took the OOM path (the device refused their first segment) and were served
    /// by it (the ones that ended in an OOM are told by `ooms`), unchanged and changed (at a
    /// capacity range read from refusals: the most at either end).
    #[serde(skip)]
    pub retries_before: u64,
    #[serde(skip)]
    pub retries_after: u64,
    pub note: Option<String>,
}

/// One setting tried for a fragmentation OOM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SettingTrial {
    /// As written in `PYTORCH_CUDA_ALLOC_CONF`.
    pub setting: String,
    /// Every recorded OOM would have been served, and no new one appears.
    pub avoids_oom: bool,
    pub peak_reserved_after: u64,
}

/// Settings that would have avoided a device's recorded OOMs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomSettingsAdvice {
    pub device: i64,
    pub simulated: bool,
    pub trials: Vec<SettingTrial>,
    /// `expandable_segments:True` avoids the OOMs.
    pub expandable_segments_avoids: Option<bool>,
    /// The smallest `max_split_size_mb` tried that avoids them.
    pub smallest_max_split_size_mb: Option<u64>,
    pub note: Option<String>,
}

/// The `max_split_size_mb` values [`advise_settings_for_oom`] tries.
pub const MAX_SPLIT_TRIALS_MB: [u64; 5] = [32, 64, 128, 256, 512];

/// Everything a device's replays share (the trace itself is the snapshot's: `Snapshot::trace`).
struct Prepared {
    device: i64,
    settings: Settings,
    init: InitialState,
    plan: Plan,
    /// Why this device cannot validate whatever the model does.
    blocker: Option<String>,
    /// Facts worth stating even when it validates.
    remarks: Vec<String>,
    reserved_recorded: u64,
    live_recorded: Vec<(u64, u64)>,
    /// The trace records an `oom` (what-ifs then run on the capacity the OOMs show).
    has_oom: bool,
}

/// The trace of `device` (empty when it has none).
fn prepare(snap: &Snapshot, device: i64) -> Prepared {
    let trace = snap.trace(device);
    let segments: Vec<_> = snap.segments_of(device).collect();
    let mut remarks = Vec::new();
    let mut blocker = None;
    let settings = match &snap.allocator_settings {
        Some(s) => {
            if s.garbage_collection_threshold.is_some_and(|g| g > 0.0) {
                blocker = Some(
                    "garbage_collection_threshold is set: its collections depend on \
                     set_per_process_memory_fraction, which the snapshot does not record"
                        .to_string(),
                );
            }
            Settings::from_recorded(s)
        }
        None => {
            remarks.push(
                "allocator_settings not recorded (torch < 2.3): PyTorch's defaults assumed".into(),
            );
            Settings::default()
        }
    };
    if snap.dropped_trace_entries > 0 {
        remarks.push(format!(
            "{} oldest trace entries were dropped when loading",
            snap.dropped_trace_entries
        ));
    }
    if segments
        .iter()
        .any(|s| s.pool_id.is_some_and(|p| p != (0, 0)))
    {
        blocker = Some(
            "segments of private pools (CUDA graphs / MemPool): which requests went to them is \
             not in the trace"
                .to_string(),
        );
    }
    if trace
        .iter()
        .any(|e| matches!(e.action, Action::Other(_) | Action::Annotate) && e.size > 0)
    {
        remarks.push("trace has actions the model ignores".into());
    }
    let init = crate::timings::time("replay: rebuild", || {
        initial::rebuild(&segments, trace, &settings)
    });
    if let Some(at) = init.contradicted_at {
        // Linear whatever the trace: a trace that does not fit its segments is not replayed.
        blocker = Some(format!(
            "trace entry {at} contradicts the state the snapshot ends in ({}): the trace does \
             not fit its segments, not replayed",
            init.first_problem.clone().unwrap_or_default()
        ));
    }
    if init.contradicted_at.is_none() && init.problems > 0 {
        remarks.push(format!(
            "{} trace entries contradict the rebuilt state (first: {})",
            init.problems,
            init.first_problem.clone().unwrap_or_default()
        ));
    }
    let plan = if init.contradicted_at.is_some() {
        Plan::default()
    } else {
        crate::timings::time("replay: plan", || run::plan(trace, &init))
    };
    if plan.too_long {
        blocker = Some("trace of more than 4,294,967,294 entries: too long to replay".to_string());
    }
    if plan.unmatched_frees > 0 {
        remarks.push(format!(
            "{} frees of allocations unknown to the rebuilt state",
            plan.unmatched_frees
        ));
    }
    let reserved_recorded = segments
        .iter()
        .fold(0u64, |a, s| a.saturating_add(s.total_size));
    let mut live_recorded: Vec<(u64, u64)> = segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == crate::torch::model::BlockState::ActiveAllocated)
        .map(|b| (b.address, b.size))
        .collect();
    live_recorded.sort_unstable();
    Prepared {
        device,
        // The plan saw every entry; only a trace too long or contradicted is looked at again.
        has_oom: if plan.too_long || init.contradicted_at.is_some() {
            trace.iter().any(|e| e.action == Action::Oom)
        } else {
            plan.has_oom
        },
        settings,
        init,
        plan,
        blocker,
        remarks,
        reserved_recorded,
        live_recorded,
    }
}

fn join_note(parts: Vec<String>) -> Option<String> {
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Whether changes can be replayed on a device that validates, from its validation replay.
/// Where that replay ran mallocs through the OOM path (the device refused a new segment, cached
/// ones were released and the malloc retried) and no OOM is recorded, the device's capacity is
/// not read from an OOM: a replay of the program's requests must know when the device would
/// refuse, or even unchanged it does not reproduce the recorded run (on real captures its
/// reserved peak came out up to 8 GB higher than the recorded one). The refusals and grants
/// then bound the capacity ([`refusals::read`]); where the unchanged requests replay as
/// recorded at both ends of that range, the changes are replayed at both, else at none.
fn fixes_on(trace: &[TraceEntry], p: &Prepared, out: &run::Outcome, least: Option<u64>) -> Fixes {
    if p.has_oom || out.refused_probes == 0 {
        return Fixes::Replayed;
    }
    match refusals::read(trace, p, out, least) {
        refusals::Read::Range(r) => Fixes::AtCapacities(r),
        refusals::Read::No(why) => Fixes::NotReplayed(format!(
            "fixes not replayed: the device refused memory {} time(s) (cached segments released \
             and the request retried) and no OOM is recorded; {why}",
            out.refused_probes
        )),
    }
}

/// Whether, and how, a validated device's changes are replayed.
#[derive(Clone, Debug)]
enum Fixes {
    /// On the capacity its OOMs show, or none (new segments always succeed).
    Replayed,
    /// At both ends of the capacity range its refusals show.
    AtCapacities(refusals::Inferred),
    /// Not: the words say why.
    NotReplayed(String),
}

impl Fixes {
    fn note(&self) -> Option<String> {
        match self {
            Fixes::Replayed => None,
            Fixes::AtCapacities(r) => Some(format!(
                "the device refused memory {} time(s) and no OOM is recorded: by those refusals \
                 and what it granted, its capacity is between {} and {} (unchanged, the requests \
                 replay as recorded at both); fixes are replayed at both ends and the smaller \
                 saving is shown",
                r.refusals,
                crate::findings::fmt_bytes(r.low),
                crate::findings::fmt_bytes(r.high)
            )),
            Fixes::NotReplayed(why) => Some(why.clone()),
        }
    }
}

/// The validation replay (recorded order, recorded device answers, no change), checked as it
/// runs (`check::Checker`): it stops at the first step whose segment events differ from the
/// recorded ones, and the note names that trace entry and the difference.
/// `invalid` is raised as soon as the device is known not to validate (what-ifs running
/// meanwhile watch it and stop).
fn validate(
    trace: &[TraceEntry],
    p: &Prepared,
    invalid: &AtomicBool,
) -> (DeviceReplay, run::Outcome, Fixes) {
    if p.blocker.is_some() || trace.is_empty() {
        invalid.store(true, Ordering::Relaxed);
    }
    let mut checker = check::Checker::new(&p.plan.recorded, invalid);
    let skipped = p.init.contradicted_at.is_some();
    let mut demands = refusals::Demands::new(&mut checker);
    let out = if skipped {
        run::Outcome::default()
    } else {
        run::replay(
            trace,
            &p.plan,
            &p.init,
            p.settings.clone(),
            true,
            None,
            &Edits::default(),
            &mut demands,
        )
    };
    let (least, episodes) = (demands.least, std::mem::take(&mut demands.episodes));
    run::add_visits(checker.visits);
    let (matched, first) = (checker.matched, checker.first);
    let recorded = if skipped {
        trace
            .iter()
            .filter(|e| {
                matches!(
                    e.action,
                    Action::SegmentAlloc
                        | Action::SegmentFree
                        | Action::SegmentMap
                        | Action::SegmentUnmap
                )
            })
            .count() as u64
    } else {
        p.plan.recorded.len() as u64
    };
    let replayed = checker.replayed;
    let stopped = out.stopped_at.is_some();
    // `run::replay` returns the live blocks sorted.
    let live_ok = !stopped && !skipped && out.live_end == p.live_recorded;
    let mut notes = Vec::new();
    let mut validated = !stopped
        && matched == recorded
        && replayed == recorded
        && out.reserved_end == p.reserved_recorded;
    if trace.is_empty() {
        validated = false;
        notes.push("no trace entries on this device".to_string());
    }
    if let Some(b) = &p.blocker {
        validated = false;
        notes.push(b.clone());
    }
    if let Some((_, what)) = first {
        notes.push(format!("first difference {what}"));
    }
    if stopped {
        notes.push("the replay stopped there".to_string());
    } else if !skipped && out.reserved_end != p.reserved_recorded {
        notes.push(format!(
            "reserved at the end: recorded {} B, replayed {} B",
            p.reserved_recorded, out.reserved_end
        ));
    }
    if out.unexpected_ooms > 0 {
        notes.push(format!(
            "the model ran out of memory on {} allocation(s) the program got (first at trace \
             entry {})",
            out.unexpected_ooms,
            out.first_unexpected_oom.unwrap_or(0)
        ));
    }
    if !validated || !live_ok {
        notes.extend(p.remarks.iter().cloned());
    }
    if !live_ok && validated && !stopped {
        notes.push("allocated blocks at the end differ from the snapshot's".into());
    }
    if trace.len() == 1 {
        notes.push(
            "trace of 1 entry (recorded with max_entries=1): the check covers that entry only"
                .into(),
        );
    }
    let fixes = if validated {
        fixes_on(trace, p, &out, least)
    } else {
        Fixes::Replayed
    };
    if validated && let Some(why) = fixes.note() {
        notes.push(why);
    }
    let r = DeviceReplay {
        device: p.device,
        trace_entries: trace.len() as u64,
        fixes_replayed: validated && !matches!(fixes, Fixes::NotReplayed(_)),
        capacity_read: match &fixes {
            Fixes::AtCapacities(r) => Some((r.low, r.high)),
            _ => None,
        },
        refusals: match &fixes {
            Fixes::AtCapacities(_) => refusals::episodes(trace, &episodes),
            _ => Vec::new(),
        },
        validated,
        segment_events_recorded: recorded,
        segment_events_matched: matched,
        segment_events_replayed: replayed,
        reserved_end_bytes_recorded: p.reserved_recorded,
        reserved_end_bytes_replayed: out.reserved_end,
        allocations: out.allocations,
        allocation_addresses_matched: out.addresses_matched,
        first_address_mismatch: out.first_address_mismatch.map(|i| i as u64),
        live_blocks_end_matched: live_ok,
        peak_allocated_bytes: out.peak_allocated,
        peak_reserved_bytes: out.peak_reserved,
        note: join_note(notes),
    };
    if !validated {
        invalid.store(true, Ordering::Relaxed);
    }
    (r, out, fixes)
}

/// One device's validation replay: its report, and of its outcome what the what-ifs compare
/// with (peaks and recorded OOMs; the segment events and final blocks are dropped once compared).
struct Validation {
    replay: DeviceReplay,
    out: run::Outcome,
    /// Whether, and how, changes are replayed (when it validated).
    fixes: Fixes,
}

/// One device's allocator-setting trials (PT008): the advice, and each trial's what-if for the
/// fixes that offer a setting.
struct SettingRuns {
    advice: OomSettingsAdvice,
    runs: Vec<(Vec<Change>, WhatIf)>,
}

/// One device's prepared state, validation replay and setting trials, each computed once.
#[derive(Default)]
struct DeviceCache {
    prepared: OnceLock<Arc<Prepared>>,
    validation: OnceLock<Arc<Validation>>,
    settings: OnceLock<Arc<SettingRuns>>,
    /// Raised once the device is known not to validate: what-ifs started before the
    /// validation finished stop then (they would not be offered).
    invalid: AtomicBool,
}

/// The replays of one snapshot, shared by every analysis that needs them: each device's
/// prepared state (the rebuilt initial state and the plan) and its validation replay are
/// computed once, on first use, and reused by the summary's check, every what-if and the
/// pictures. Each method takes the snapshot the cache is about (always the same one).
/// `Sync`: threads asking for the same device wait for the one computing it. A clone is a
/// handle on the same cache (to warm it on another thread).
#[derive(Clone, Default)]
pub struct Replays {
    inner: Arc<ReplayCache>,
}

#[derive(Default)]
struct ReplayCache {
    devices: std::sync::Mutex<rustc_hash::FxHashMap<i64, Arc<DeviceCache>>>,
}

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

impl std::fmt::Debug for Replays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replays").finish_non_exhaustive()
    }
}

/// Devices with trace entries.
pub(crate) fn traced_devices(snap: &Snapshot) -> Vec<i64> {
    match &snap.device_traces {
        Some(t) => (0..t.len() as i64)
            .filter(|&d| t.get(d as usize).is_some_and(|v| !v.is_empty()))
            .collect(),
        None => Vec::new(),
    }
}

impl Replays {
    pub fn new() -> Replays {
        Replays::default()
    }

    fn cache(&self, device: i64) -> Arc<DeviceCache> {
        match self.inner.devices.lock() {
            Ok(mut c) => c.entry(device).or_default().clone(),
            Err(_) => Arc::default(),
        }
    }

    fn prepared(&self, snap: &Snapshot, device: i64) -> Arc<Prepared> {
        self.cache(device)
            .prepared
            .get_or_init(|| {
                Arc::new(crate::timings::time("replay: prepare", || {
                    prepare(snap, device)
                }))
            })
            .clone()
    }

    fn validation(&self, snap: &Snapshot, device: i64) -> Arc<Validation> {
        let p = self.prepared(snap, device);
        let cache = self.cache(device);
        cache
            .validation
            .get_or_init(|| {
                let (replay, mut out, fixes) = crate::timings::time("replay: validation", || {
                    validate(snap.trace(device), &p, &cache.invalid)
                });
                out.events = Vec::new();
                out.live_end = Vec::new();
                Arc::new(Validation { replay, out, fixes })
            })
            .clone()
    }

    /// Whether the device is already known not to validate (its validation finished without
    /// reproducing the recorded events, or stopped at a mismatch): a what-if there would not
    /// be offered, so its changes need not be worked out. Never waits.
    pub fn known_not_to_validate(&self, device: i64) -> bool {
        let cache = self.cache(device);
        cache.invalid.load(Ordering::Relaxed)
            || cache.validation.get().is_some_and(|v| !v.replay.validated)
    }

    /// Compute every traced device's validation replay now (to run it on another thread).
    pub fn warm(&self, snap: &Snapshot) {
        for d in traced_devices(snap) {
            self.validation(snap, d);
        }
    }

    /// [`replay_device`], from the cache.
    pub fn device(&self, snap: &Snapshot, device: i64) -> DeviceReplay {
        self.validation(snap, device).replay.clone()
    }

    /// [`replay_snapshot`], from the cache.
    pub fn capture(&self, snap: &Snapshot) -> CaptureReplay {
        let devices: Vec<DeviceReplay> = traced_devices(snap)
            .into_iter()
            .map(|d| self.device(snap, d))
            .collect();
        capture_of(snap, devices)
    }

    /// [`what_if`], on the shared prepared state and validation.
    pub fn what_if(&self, snap: &Snapshot, device: i64, changes: &[Change]) -> WhatIf {
        let p = self.prepared(snap, device);
        let cache = self.cache(device);
        what_if_prepared(
            snap.trace(device),
            &p,
            || self.validation(snap, device),
            &cache.invalid,
            changes,
        )
    }

    /// [`advise_settings_for_oom`], from the cache.
    pub fn advise_settings_for_oom(&self, snap: &Snapshot, device: i64) -> OomSettingsAdvice {
        self.setting_runs(snap, device).advice.clone()
    }

    /// The what-if of one allocator setting: the advice's own trial when it ran one (each PT008
    /// fix asks for a setting the advice tried), else a replay.
    pub fn setting_what_if(&self, snap: &Snapshot, device: i64, changes: &[Change]) -> WhatIf {
        let runs = self.setting_runs(snap, device);
        match runs.runs.iter().find(|(c, _)| c == changes) {
            Some((_, w)) => w.clone(),
            None => self.what_if(snap, device, changes),
        }
    }

    fn setting_runs(&self, snap: &Snapshot, device: i64) -> Arc<SettingRuns> {
        self.cache(device)
            .settings
            .get_or_init(|| Arc::new(self.try_settings(snap, device)))
            .clone()
    }

    fn try_settings(&self, snap: &Snapshot, device: i64) -> SettingRuns {
        let mut runs = Vec::new();
        let mut a = OomSettingsAdvice {
            device,
            simulated: false,
            trials: Vec::new(),
            expandable_segments_avoids: None,
            smallest_max_split_size_mb: None,
            note: None,
        };
        if !self.prepared(snap, device).has_oom {
            a.note = Some("no oom entry in this device's trace".into());
            return SettingRuns { advice: a, runs };
        }
        let mut trial = |setting: String, changes: Vec<Change>| -> Option<bool> {
            let w = self.what_if(snap, device, &changes);
            if !w.simulated {
                a.note = w.note;
                return None;
            }
            let avoids = w.new_ooms == 0 && w.ooms.iter().all(|o| o.fits_after);
            a.trials.push(SettingTrial {
                setting,
                avoids_oom: avoids,
                peak_reserved_after: w.peak_reserved_after,
            });
            runs.push((changes, w));
            Some(avoids)
        };
        let exp = trial(
            "expandable_segments:True".into(),
            vec![Change::ExpandableSegments(true)],
        );
        if let Some(exp) = exp {
            a.expandable_segments_avoids = Some(exp);
            for mb in MAX_SPLIT_TRIALS_MB {
                if trial(
                    format!("max_split_size_mb:{mb}"),
                    vec![Change::MaxSplitSizeMb(mb)],
                ) == Some(true)
                    && a.smallest_max_split_size_mb.is_none()
                {
                    a.smallest_max_split_size_mb = Some(mb);
                }
            }
            a.simulated = true;
        }
        SettingRuns { advice: a, runs }
    }

    /// [`recorded_states`], from the cache: the prepared state is shared; the validation replay
    /// runs again (watched) only on a device whose cached one validated.
    pub fn recorded_states(
        &self,
        snap: &Snapshot,
        device: i64,
        at: &[At],
    ) -> Option<Vec<Vec<Segment>>> {
        if !self.validation(snap, device).replay.validated {
            return None;
        }
        state::recorded_states_prepared(snap, &self.prepared(snap, device), at)
    }

    /// [`state_at_capacity`], from the cache.
    pub fn state_at_capacity(
        &self,
        snap: &Snapshot,
        device: i64,
        capacity: u64,
    ) -> Option<Snapshot> {
        let v = self.validation(snap, device);
        if !v.replay.validated {
            return None;
        }
        state::state_at_capacity_prepared(
            snap,
            &self.prepared(snap, device),
            capacity,
            &v.out.empty_cache_probes,
        )
    }
}

/// Replay one device and compare with what was recorded.
pub fn replay_device(snap: &Snapshot, device: i64) -> DeviceReplay {
    Replays::new().device(snap, device)
}

/// Replay every device that has trace entries.
pub fn replay_snapshot(snap: &Snapshot) -> CaptureReplay {
    Replays::new().capture(snap)
}

fn capture_of(snap: &Snapshot, devices: Vec<DeviceReplay>) -> CaptureReplay {
    let sum =
        |f: fn(&DeviceReplay) -> u64| devices.iter().fold(0u64, |a, d| a.saturating_add(f(d)));
    let note = if snap.device_traces.is_none() {
        Some("no trace: memory history was not recorded (only segments)".to_string())
    } else if devices.is_empty() {
        Some("every device trace is empty: memory history was not recorded".to_string())
    } else {
        let notes: Vec<String> = devices
            .iter()
            .filter_map(|d| d.note.as_ref().map(|n| format!("device {}: {n}", d.device)))
            .collect();
        join_note(notes)
    };
    CaptureReplay {
        validated: !devices.is_empty() && devices.iter().all(|d| d.validated),
        segment_events_recorded: sum(|d| d.segment_events_recorded),
        segment_events_matched: sum(|d| d.segment_events_matched),
        reserved_end_bytes_recorded: sum(|d| d.reserved_end_bytes_recorded),
        reserved_end_bytes_replayed: sum(|d| d.reserved_end_bytes_replayed),
        note,
        fixes_replayed: !devices.is_empty() && devices.iter().all(|d| d.fixes_replayed),
        devices,
    }
}

/// Device memory the allocator could have reserved: the smallest reserved + `device_free` over
/// the recorded OOMs of the unchanged replay.
fn capacity_of(trace: &[TraceEntry], out: &run::Outcome) -> Option<u64> {
    out.ooms
        .iter()
        .filter_map(|&(i, _, reserved, _)| {
            trace
                .get(i)
                .and_then(TraceEntry::device_free)
                .map(|f| reserved.saturating_add(f))
        })
        .min()
}

/// Replay a device's requests with `changes` and report peaks and the fate of each recorded OOM.
pub fn what_if(snap: &Snapshot, device: i64, changes: &[Change]) -> WhatIf {
    Replays::new().what_if(snap, device, changes)
}

/// A what-if on a prepared device; `validation` gives its validation replay (which may still be
/// running on another thread: a trace without `oom` entries has no device capacity to read from
/// it, so the changed replay runs meanwhile and is dropped if the device does not validate).
fn what_if_prepared(
    trace: &[TraceEntry],
    p: &Prepared,
    validation: impl FnOnce() -> Arc<Validation>,
    invalid: &AtomicBool,
    changes: &[Change],
) -> WhatIf {
    let mut settings = p.settings.clone();
    // Unchanged, the what-if is the recorded run: recorded segment addresses where free.
    let mut edits = Edits {
        recorded_addresses: true,
        ..Edits::default()
    };
    let mut notes = Vec::new();
    for c in changes {
        match c {
            Change::FreeEarly { allocs, at } => {
                for a in allocs {
                    match p.plan.alloc_aref(trace, *a) {
                        Some(r) => {
                            edits.free_at.insert(r, *at);
                        }
                        None => notes.push(format!("trace entry {a} is not an alloc")),
                    }
                }
            }
            Change::Rematerialize { allocs } => {
                for &(a, drop_at, again_at) in allocs {
                    match p.plan.alloc_aref(trace, a) {
                        Some(r) if drop_at < again_at => {
                            edits.remat.push((r, drop_at, again_at, a))
                        }
                        Some(_) => notes.push(format!(
                            "trace entry {a}: dropped at {drop_at}, not before its recompute at {again_at}"
                        )),
                        None => notes.push(format!("trace entry {a} is not an alloc")),
                    }
                }
            }
            Change::ExpandableSegments(on) => settings.expandable_segments = *on,
            Change::MaxSplitSizeMb(mb) => {
                if !settings.apply("max_split_size_mb", &mb.to_string()) {
                    notes.push(format!(
                        "max_split_size_mb:{mb} is below PyTorch's minimum of 20"
                    ));
                }
            }
            Change::RoundupPower2Divisions(v) => {
                if !settings.apply("roundup_power2_divisions", v) {
                    notes.push(format!(
                        "roundup_power2_divisions:{v} is not a valid setting"
                    ));
                }
            }
        }
    }
    let mut w = WhatIf {
        device: p.device,
        simulated: false,
        settings: settings.clone(),
        peak_allocated_before: 0,
        peak_allocated_after: 0,
        peak_reserved_before: 0,
        peak_reserved_after: 0,
        capacity_bytes: None,
        ooms: Vec::new(),
        new_ooms: 0,
        retries_before: 0,
        retries_after: 0,
        note: None,
    };
    // A replay that stops when the device turns out not to validate (it would not be offered).
    let run_after = |capacity: Option<u64>, edits: &Edits| {
        run::replay(
            trace,
            &p.plan,
            &p.init,
            settings.clone(),
            false,
            capacity,
            edits,
            &mut run::Unless(invalid),
        )
    };
    // Without a recorded OOM the capacity is unknown whatever the validation says.
    // A trace that contradicts its rebuilt state rarely validates: its what-if waits for the
    // validation rather than competing with it for the cores.
    let doubtful = p.init.problems > 0 || p.plan.unmatched_frees > 0 || p.blocker.is_some();
    // Probes are read by the validation (OOM path or `empty_cache()`): with any, the what-if
    // waits for it.
    let early = (!p.has_oom && !doubtful && p.plan.probes() == 0).then(|| run_after(None, &edits));
    let v = validation();
    let (base, out0) = (&v.replay, &v.out);
    if !base.validated {
        notes.insert(
            0,
            format!(
                "not simulated: the unchanged replay does not validate on this device ({})",
                base.note.clone().unwrap_or_default()
            ),
        );
        w.note = join_note(notes);
        return w;
    }
    edits.empty_cache_probes = out0.empty_cache_probes.clone();
    let (capacity, after) = match (&v.fixes, early) {
        (Fixes::NotReplayed(why), _) => {
            notes.insert(0, format!("not simulated: {why}"));
            w.note = join_note(notes);
            return w;
        }
        (Fixes::AtCapacities(r), _) => {
            // Each end of the range reproduces the recorded run; the change is told by the
            // end where it saves the least.
            let (low, high) = (
                run_after(Some(r.low), &edits),
                run_after(Some(r.high), &edits),
            );
            notes.extend(v.fixes.note());
            let key = |o: &run::Outcome| (o.unexpected_ooms, o.peak_reserved, o.peak_allocated);
            w.retries_after = low.served_retries().max(high.served_retries());
            if key(&high) > key(&low) {
                (Some(r.high), high)
            } else {
                (Some(r.low), low)
            }
        }
        (Fixes::Replayed, Some(after)) => (None, after),
        (Fixes::Replayed, None) => {
            let capacity = capacity_of(trace, out0);
            (capacity, run_after(capacity, &edits))
        }
    };
    w.simulated = true;
    w.capacity_bytes = capacity;
    w.peak_allocated_before = out0.peak_allocated;
    w.peak_reserved_before = out0.peak_reserved;
    w.peak_allocated_after = after.peak_allocated;
    w.peak_reserved_after = after.peak_reserved;
    w.new_ooms = after.unexpected_ooms;
    w.retries_before = out0.served_retries();
    w.retries_after = w.retries_after.max(after.served_retries());
    w.ooms = after
        .ooms
        .iter()
        .map(|&(i, size, _, fits)| OomOutcome {
            trace_index: i as u64,
            request_bytes: size,
            capacity_bytes: out0.ooms.iter().find(|o| o.0 == i).and_then(|o| {
                trace
                    .get(i)
                    .and_then(TraceEntry::device_free)
                    .map(|f| o.2.saturating_add(f))
            }),
            fits_after: fits,
        })
        .collect();
    if capacity.is_none() {
        notes.push("no recorded OOM: device capacity unknown, new segments always succeed".into());
    }
    w.note = join_note(notes);
    w
}

/// For a device whose trace records OOMs (PT008: fragmentation), try `expandable_segments:True`
/// and `max_split_size_mb` for each of [`MAX_SPLIT_TRIALS_MB`]; name the smallest that avoids
/// every recorded OOM without a new one.
pub fn advise_settings_for_oom(snap: &Snapshot, device: i64) -> OomSettingsAdvice {
    Replays::new().advise_settings_for_oom(snap, device)
}
