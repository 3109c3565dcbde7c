//! What the PyTorch engine hands on: one typed, self-contained summary of a snapshot's analyses
//! (the JSON contract's `torch` value, with serde), so that presenters never need the snapshot
//! itself, which can be a gigabyte.
//!
//! Field names are the JSON contract's; definitions are those of `torch_snapshots/ORACLE.md`.
//! Fields marked `serde(skip)` are for the text and HTML presenters only.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::torch::Analysis;
use crate::torch::diff::{Diff, SiteDelta};
use crate::torch::fragmentation::{OomDiagnosis, Verdict};
use crate::torch::model::{Snapshot, SnapshotFormat};
use crate::torch::ranks::RankComparison;
use crate::torch::replay::CaptureReplay;
use crate::torch::sites::Sites;
use crate::torch::stacks::site_string;
use crate::torch::timeline::{DeviceTimeline, LiveSet};
use crate::torch::totals::{DeviceTotals, Memory, OomEvent, Peak, Totals};

/// The engine's result for one snapshot (`captures[].torch`).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub format: &'static str,
    pub pickle_protocol: Option<u8>,
    pub totals: OverallTotals,
    pub devices: Vec<DeviceSummary>,
    pub allocation_sites: SitesSummary,
    pub timeline: Vec<DeviceTimelineSummary>,
    pub fragmentation: Vec<Fragmentation>,
    /// Recorded (`external_annotations`) and inferred training stages, device then trace order.
    pub stages: Vec<crate::torch::stages::summary::StageSummary>,
    /// The stage holding each traced device's peak; whether the snapshot recorded annotations.
    pub stage_at_peak: Vec<crate::torch::stages::summary::StageAtPeak>,
    pub annotations_recorded: bool,
    /// Live memory at each device's peak by role and by `--category` (docs/CATEGORIES.md).
    pub categories: Vec<crate::torch::categories::DeviceCategories>,
    /// Bytes at each device's peak per `compile_context` (torch 2.8+; docs/RECORDING.md).
    pub compile_contexts: crate::torch::compile_regions::CompileRegions,
    /// Per traced device: whether its trace starts mid-run (read from the ring buffer's
    /// `trace_alloc_overflowed` where recorded, else inferred).
    pub trace_start: Vec<crate::torch::recording::TraceStart>,
    /// Three or more snapshots of one run: per-site bytes per step, slope, leak verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trend: Option<crate::torch::trend::Trend>,
    /// `--range A..B`: the part of each device's trace analysed (absent without `--range`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub range: Vec<crate::torch::range::Cut>,
    /// The pinned host allocator (`host_segments`), never part of the device totals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::torch::recording::HostSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<DiffSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    /// The comparison of the ranks this snapshot was analysed with: one value shared by every
    /// rank's summary, written once per document (`rank_comparisons`, see `present::json`).
    #[serde(skip)]
    pub rank_comparison: Option<std::sync::Arc<RankComparison>>,
    /// What this snapshot contributes to a comparison of ranks (compact: totals and the largest
    /// sites), so ranks can be compared from summaries alone (`memlsp compare`).
    pub rank_summary: crate::torch::ranks::RankSummary,
    /// How well the allocator replay reproduces this capture's recorded segment events.
    pub replay: CaptureReplay,
    /// Will it fit (`report --on CAPACITY`; docs/FITS.md): one entry per traced device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<Vec<crate::torch::replay::fit_sites::FitEntry>>,
    /// Why memory was released, from the release stacks (absent without a trace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub releases: Option<crate::torch::release_summary::ReleaseSummary>,
    /// One process's devices allocating very different sizes at one line (PT014's numbers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_skew: Option<crate::torch::device_skew::Skew>,
    /// One hand-written attention's score-sized blocks at the peak (PT018's numbers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention: Option<crate::torch::attention::Attention>,
    /// Memory over the trace per device, for pictures (computed on request).
    #[serde(skip)]
    pub series: Vec<crate::torch::series::Series>,
    /// The allocator state at the snapshot per device, for pictures (computed on request).
    #[serde(skip)]
    pub segment_bars: Vec<(i64, Vec<crate::torch::series::SegmentBar>)>,
    /// The allocator state at each traced device's peak and first OOM, replayed from the trace
    /// where the replay validates, for pictures (computed on request).
    #[serde(skip)]
    pub state_bars: Vec<crate::torch::series::StatePanel>,
    /// The largest allocations of each device's trace, for the page's search (on request).
    #[serde(skip)]
    pub trace_index: Vec<crate::torch::trace_index::TraceIndex>,
}

/// Allocator state at dump time (ORACLE.md §3), per device or overall.
#[derive(Clone, Debug, Serialize)]
pub struct MemorySummary {
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub pending_free_bytes: u64,
    pub inactive_bytes: u64,
    pub requested_bytes: u64,
    pub largest_inactive_block_bytes: Option<u64>,
    pub segment_count: u64,
    pub block_total: u64,
    pub block_count: BTreeMap<String, u64>,
    pub segments_by_type: BTreeMap<String, SegmentType>,
    pub streams: Vec<u64>,
    pub expandable_segment_count: u64,
    pub segments_with_inactive_blocks: u64,
    pub releasable_segments: CountBytes,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct SegmentType {
    pub count: u64,
    pub reserved_bytes: u64,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CountBytes {
    pub count: u64,
    pub bytes: u64,
}

/// The JSON contract's `T` for the whole snapshot.
#[derive(Clone, Debug, Serialize)]
pub struct OverallTotals {
    #[serde(flatten)]
    pub memory: MemorySummary,
    pub trace_present: bool,
    pub trace_entries: u64,
    pub trace_actions: BTreeMap<String, u64>,
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    pub peak_active_bytes_trace_relative: Option<OverallPeak>,
    pub oom_events: Vec<Oom>,
    pub dropped_trace_entries: u64,
}

/// The device whose trace-relative active peak is largest.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct OverallPeak {
    pub device: i64,
    pub index: u64,
    pub bytes: i64,
}

/// `T + {"device"}` for one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceSummary {
    pub device: i64,
    #[serde(flatten)]
    pub memory: MemorySummary,
    pub trace_present: bool,
    pub trace_entries: u64,
    pub trace_actions: BTreeMap<String, u64>,
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    pub peak_active_bytes_trace_relative: PeakSummary,
    pub peak_reserved_bytes_trace_relative: PeakSummary,
    pub oom_events: Vec<Oom>,
    pub allocation_sites: SitesSummary,
}

/// A running-sum peak over one device's trace (ORACLE.md §4).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PeakSummary {
    pub bytes: Option<i64>,
    pub index: Option<u64>,
    pub min_running_bytes: Option<i64>,
    pub final_running_bytes: Option<i64>,
}

/// One `oom` trace entry.
#[derive(Clone, Debug, Serialize)]
pub struct Oom {
    pub device: i64,
    pub index: u64,
    pub size: u64,
    pub device_free: Option<u64>,
    pub stream: u64,
    pub time_us: Option<i64>,
    pub first_user_frame: FrameRef,
}

/// The frame a site or event is attributed to.
#[derive(Clone, Debug, Serialize)]
pub struct FrameRef {
    /// `<filename>:<line>:<name>` or `<no stack>`.
    pub site: String,
    pub filename: Option<String>,
    pub line: Option<u64>,
    pub name: Option<String>,
    /// `user`, `python_fallback`, `native_only`, `empty`, or `no_stack`.
    pub kind: &'static str,
}

/// The oracle's `allocation_sites` object.
#[derive(Clone, Debug, Serialize)]
pub struct SitesSummary {
    pub distinct_sites: usize,
    pub active_allocated_blocks: u64,
    pub by_kind: BTreeMap<&'static str, BlocksBytes>,
    pub top: Vec<TopSite>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct BlocksBytes {
    pub blocks: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TopSite {
    #[serde(flatten)]
    pub frame: FrameRef,
    pub bytes: u64,
    pub requested_bytes: u64,
    pub blocks: u64,
    pub percent_of_allocated: Option<f64>,
    pub role: &'static str,
}

/// What the trace of one device says (`timeline[]`).
#[derive(Clone, Debug, Serialize)]
pub struct DeviceTimelineSummary {
    pub device: i64,
    pub entries: u64,
    pub allocs: u64,
    pub free_requested: u64,
    pub free_completed: u64,
    pub frees_of_blocks_allocated_before_window: u64,
    pub delayed_frees: DelayedSummary,
    pub pending_frees: PendingSummary,
    pub segment_alloc: CountBytes,
    pub segment_free: CountBytes,
    pub segment_map: CountBytes,
    pub segment_unmap: CountBytes,
    pub live_bytes_reconstructed: LiveReconstructed,
    pub steps_estimate: StepsEstimate,
    pub repeating_unfreed_sites: Vec<RepeatingSite>,
    pub oom_live: Vec<LiveSummary>,
    pub peak_live: Option<LiveSummary>,
    /// The largest run of frees with no allocation in between (PT007's bytes).
    #[serde(rename = "largest_free_burst", skip_serializing_if = "Option::is_none")]
    pub burst: Option<BurstSummary>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct DelayedSummary {
    pub count: u64,
    pub bytes: u64,
    pub max_entries_between: u64,
    pub max_us: Option<i64>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct PendingSummary {
    pub count: usize,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LiveReconstructed {
    pub start: i64,
    pub peak: i64,
    pub peak_index: Option<u64>,
    pub end: i64,
    pub floors: Vec<i64>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct StepsEstimate {
    pub sawtooth_cycles: u64,
    pub optimizer_runs: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RepeatingSite {
    pub site: String,
    pub allocs: u64,
    pub freed: u64,
    pub retained: u64,
    pub retained_bytes: u64,
    pub window_parts: u32,
}

/// Live blocks at one trace index, by site.
#[derive(Clone, Debug, Serialize)]
pub struct LiveSummary {
    pub index: u64,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub sites: Vec<LiveSite>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LiveSite {
    pub site: String,
    pub bytes: u64,
    pub blocks: u64,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct BurstSummary {
    pub start: u64,
    pub end: u64,
    pub frees: u64,
    pub bytes: u64,
    pub alloc_parts: u32,
}

/// The fragmentation check of one `oom` entry.
#[derive(Clone, Debug, Serialize)]
pub struct Fragmentation {
    pub device: i64,
    pub index: u64,
    pub request_bytes: u64,
    pub device_free: Option<u64>,
    pub inactive_bytes: u64,
    pub largest_inactive_block_bytes: u64,
    pub segments_with_inactive_blocks: u64,
    pub live_bytes_before_oom: u64,
    pub verdict: &'static str,
    pub explanation: String,
}

/// `report --diff`: what changed between two snapshots of one run.
#[derive(Clone, Debug, Serialize)]
pub struct DiffSummary {
    pub earlier: String,
    pub later: String,
    pub allocated_bytes_before: u64,
    pub allocated_bytes_after: u64,
    pub reserved_bytes_before: u64,
    pub reserved_bytes_after: u64,
    pub grown: Vec<SiteGrowth>,
    pub shrunk: Vec<SiteGrowth>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SiteGrowth {
    pub site: String,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub bytes_delta: i64,
    pub blocks_before: u64,
    pub blocks_after: u64,
    pub blocks_delta: i64,
    pub role: &'static str,
}

fn memory(m: &Memory) -> MemorySummary {
    MemorySummary {
        reserved_bytes: m.reserved,
        allocated_bytes: m.allocated,
        pending_free_bytes: m.pending_free,
        inactive_bytes: m.inactive,
        requested_bytes: m.requested,
        largest_inactive_block_bytes: m.largest_inactive,
        segment_count: m.segment_count,
        block_total: m.block_total,
        block_count: m.block_count.clone(),
        segments_by_type: m
            .segments_by_type
            .iter()
            .map(|(k, (count, reserved))| {
                (
                    k.clone(),
                    SegmentType {
                        count: *count,
                        reserved_bytes: *reserved,
                    },
                )
            })
            .collect(),
        streams: m.streams.clone(),
        expandable_segment_count: m.expandable_segments,
        segments_with_inactive_blocks: m.segments_with_inactive,
        releasable_segments: CountBytes {
            count: m.releasable.0,
            bytes: m.releasable.1,
        },
    }
}

fn peak(p: &Peak) -> PeakSummary {
    PeakSummary {
        bytes: p.bytes,
        index: p.index,
        min_running_bytes: p.min_running,
        final_running_bytes: p.final_running,
    }
}

fn oom(o: &OomEvent, snap: &Snapshot) -> Oom {
    let frame = o.site_key.and_then(|f| snap.frames.get(f as usize));
    Oom {
        device: o.device,
        index: o.index,
        size: o.size,
        device_free: o.device_free,
        stream: o.stream,
        time_us: o.time_us,
        first_user_frame: FrameRef {
            site: o.site.clone(),
            filename: frame.map(|f| f.filename.clone()),
            line: frame.map(|f| f.line),
            name: frame.map(|f| f.name.clone()),
            kind: o.site_kind.as_str(),
        },
    }
}

/// The JSON contract's `T` for the whole snapshot.
pub fn overall(t: &Totals, snap: &Snapshot) -> OverallTotals {
    let mut actions: BTreeMap<String, u64> = BTreeMap::new();
    let mut first: Option<i64> = None;
    let mut last: Option<i64> = None;
    for tr in t.devices.iter().filter_map(|d| d.trace.as_ref()) {
        for (k, v) in &tr.actions {
            let a = actions.entry(k.clone()).or_default();
            *a = a.saturating_add(*v);
        }
        if let Some(f) = tr.first_time_us {
            first = Some(first.map_or(f, |x| x.min(f)));
        }
        if let Some(l) = tr.last_time_us {
            last = Some(last.map_or(l, |x| x.max(l)));
        }
    }
    OverallTotals {
        memory: memory(&t.overall),
        trace_present: t.trace_present,
        trace_entries: t.trace_entries(),
        trace_actions: actions,
        first_time_us: first,
        last_time_us: last,
        peak_active_bytes_trace_relative: t.overall_peak().map(|(device, index, bytes)| {
            OverallPeak {
                device,
                index,
                bytes,
            }
        }),
        oom_events: t.oom_events().map(|e| oom(e, snap)).collect(),
        dropped_trace_entries: t.dropped_trace_entries,
    }
}

fn device(d: &DeviceTotals, snap: &Snapshot, sites: SitesSummary) -> DeviceSummary {
    let t = d.trace.clone().unwrap_or_default();
    DeviceSummary {
        device: d.device,
        memory: memory(&d.memory),
        trace_present: d.trace.is_some(),
        trace_entries: t.entries,
        trace_actions: t.actions,
        first_time_us: t.first_time_us,
        last_time_us: t.last_time_us,
        peak_active_bytes_trace_relative: peak(&t.peak_active),
        peak_reserved_bytes_trace_relative: peak(&t.peak_reserved),
        oom_events: d.ooms.iter().map(|e| oom(e, snap)).collect(),
        allocation_sites: sites,
    }
}

/// The first `top` sites and the attribution counts.
pub fn sites(s: &Sites, snap: &Snapshot, allocated: u64, top: usize) -> SitesSummary {
    const KINDS: [&str; 4] = ["user", "python_fallback", "native_only", "empty"];
    SitesSummary {
        distinct_sites: s.sites.len(),
        active_allocated_blocks: s.active_blocks,
        by_kind: KINDS
            .iter()
            .zip(s.by_kind.iter())
            .map(|(k, (blocks, bytes))| {
                (
                    *k,
                    BlocksBytes {
                        blocks: *blocks,
                        bytes: *bytes,
                    },
                )
            })
            .collect(),
        top: s
            .sites
            .iter()
            .take(top)
            .map(|x| {
                let f = x.key.and_then(|k| snap.frames.get(k as usize));
                TopSite {
                    frame: FrameRef {
                        site: x.site.clone(),
                        filename: f.map(|f| f.filename.clone()),
                        line: f.map(|f| f.line),
                        name: f.map(|f| f.name.clone()),
                        kind: if x.key.is_none() {
                            "no_stack"
                        } else {
                            x.kind.as_str()
                        },
                    },
                    bytes: x.bytes,
                    requested_bytes: x.requested_bytes,
                    blocks: x.blocks,
                    percent_of_allocated: x.percent_of(allocated),
                    role: x.role().as_str(),
                }
            })
            .collect(),
    }
}

fn live(s: &LiveSet, snap: &Snapshot) -> LiveSummary {
    LiveSummary {
        index: s.index,
        live_bytes: s.bytes,
        live_blocks: s.blocks,
        sites: s
            .sites
            .iter()
            .take(5)
            .map(|(k, b, n, _)| LiveSite {
                site: site_string(snap, *k),
                bytes: *b,
                blocks: *n,
            })
            .collect(),
    }
}

fn timeline(t: &DeviceTimeline, snap: &Snapshot) -> DeviceTimelineSummary {
    let cb = |(count, bytes): (u64, u64)| CountBytes { count, bytes };
    DeviceTimelineSummary {
        device: t.device,
        entries: t.entries,
        allocs: t.allocs,
        free_requested: t.free_requested,
        free_completed: t.free_completed,
        frees_of_blocks_allocated_before_window: t.frees_of_older_blocks,
        delayed_frees: DelayedSummary {
            count: t.delayed.count,
            bytes: t.delayed.bytes,
            max_entries_between: t.delayed.max_entries_between,
            max_us: t.delayed.max_us,
        },
        pending_frees: PendingSummary {
            count: t.pending.len(),
            bytes: t.pending.iter().fold(0u64, |a, p| a.saturating_add(p.size)),
        },
        segment_alloc: cb(t.segment_allocs),
        segment_free: cb(t.segment_frees),
        segment_map: cb(t.segment_maps),
        segment_unmap: cb(t.segment_unmaps),
        live_bytes_reconstructed: LiveReconstructed {
            start: t.live_start,
            peak: t.live_peak,
            peak_index: t.live_peak_index,
            end: t.live_end,
            floors: t.floors.clone(),
        },
        steps_estimate: StepsEstimate {
            sawtooth_cycles: t.cycles,
            optimizer_runs: t.optimizer_runs,
        },
        repeating_unfreed_sites: t
            .sites
            .iter()
            .filter(|s| s.retained_parts() >= 3 && s.retained >= 3)
            .map(|s| RepeatingSite {
                site: site_string(snap, s.key),
                allocs: s.allocs,
                freed: s.freed,
                retained: s.retained,
                retained_bytes: s.retained_bytes,
                window_parts: s.retained_parts(),
            })
            .collect(),
        oom_live: t.oom_sets.iter().map(|s| live(s, snap)).collect(),
        peak_live: t.peak_set.as_ref().map(|s| live(s, snap)),
        burst: t.burst.as_ref().map(|b| BurstSummary {
            start: b.start,
            end: b.end,
            frees: b.frees,
            bytes: b.bytes,
            alloc_parts: b.alloc_parts,
        }),
    }
}

fn fragmentation(d: &OomDiagnosis) -> Fragmentation {
    Fragmentation {
        device: d.device,
        index: d.index,
        request_bytes: d.request,
        device_free: d.device_free,
        inactive_bytes: d.inactive,
        largest_inactive_block_bytes: d.largest_inactive,
        segments_with_inactive_blocks: d.segments_with_inactive,
        live_bytes_before_oom: d.live,
        verdict: match d.verdict {
            Verdict::Fragmentation => "fragmentation",
            Verdict::LiveTensorsNearCapacity => "live_tensors_near_capacity",
            Verdict::Unclear => "unclear",
        },
        explanation: d.explain(),
    }
}

fn growth(g: &SiteDelta) -> SiteGrowth {
    SiteGrowth {
        site: g.site.clone(),
        bytes_before: g.bytes_before,
        bytes_after: g.bytes_after,
        bytes_delta: i64::try_from(g.byte_delta()).unwrap_or(i64::MAX),
        blocks_before: g.blocks_before,
        blocks_after: g.blocks_after,
        blocks_delta: i64::try_from(g.block_delta()).unwrap_or(i64::MAX),
        role: g.role.as_str(),
    }
}

/// The comparison of two snapshots, earlier first.
pub fn diff(d: &Diff, earlier: &Path, later: &Path) -> DiffSummary {
    DiffSummary {
        earlier: earlier.display().to_string(),
        later: later.display().to_string(),
        allocated_bytes_before: d.allocated_before,
        allocated_bytes_after: d.allocated_after,
        reserved_bytes_before: d.reserved_before,
        reserved_bytes_after: d.reserved_after,
        grown: d.grown.iter().map(growth).collect(),
        shrunk: d.shrunk.iter().take(10).map(growth).collect(),
    }
}

/// Summarise every analysis of one snapshot, keeping the first `top` sites.
pub fn summarize(snap: &Snapshot, a: &Analysis, top: usize) -> Summary {
    let replay = if a.simulated {
        a.replays.capture(snap)
    } else {
        CaptureReplay::pending()
    };
    summarize_with(snap, a, top, replay)
}

/// [`summarize`] with the replay already computed.
pub fn summarize_with(snap: &Snapshot, a: &Analysis, top: usize, replay: CaptureReplay) -> Summary {
    Summary {
        format: match snap.format {
            Some(SnapshotFormat::SegmentList) => "segment-list",
            _ => "dict",
        },
        pickle_protocol: snap.pickle_protocol,
        totals: overall(&a.totals, snap),
        devices: a
            .totals
            .devices
            .iter()
            .zip(a.device_sites.iter())
            .map(|(d, s)| device(d, snap, sites(s, snap, d.memory.allocated, top)))
            .collect(),
        allocation_sites: sites(&a.sites, snap, a.totals.overall.allocated, top),
        timeline: a
            .timeline
            .devices
            .iter()
            .map(|t| timeline(t, snap))
            .collect(),
        fragmentation: a.fragmentation.iter().map(fragmentation).collect(),
        stages: crate::torch::stages::summary::stages(snap, &a.stages),
        stage_at_peak: crate::torch::stages::summary::at_peak(&a.stages),
        annotations_recorded: a.stages.recorded,
        categories: Vec::new(),
        compile_contexts: Default::default(),
        trace_start: crate::torch::recording::trace_start(snap, &a.timeline),
        range: Vec::new(),
        trend: None,
        host: crate::torch::recording::host(snap),
        diff: None,
        rank: None,
        rank_comparison: None,
        rank_summary: Default::default(),
        replay,
        fit: None,
        releases: crate::torch::release_summary::summarize(snap, a),
        device_skew: crate::torch::device_skew::skew(snap, a),
        attention: a.attention.clone(),
        series: Vec::new(),
        segment_bars: Vec::new(),
        state_bars: Vec::new(),
        trace_index: Vec::new(),
    }
}

impl Summary {
    /// Bytes of live memory without a Python stack (native-only and empty sites).
    pub fn no_stack_bytes(&self) -> u64 {
        ["native_only", "empty"]
            .iter()
            .filter_map(|k| self.allocation_sites.by_kind.get(k))
            .fold(0u64, |a, b| a.saturating_add(b.bytes))
    }

    /// Frees of blocks allocated before the recorded window, over all devices.
    pub fn frees_of_older_blocks(&self) -> u64 {
        self.timeline
            .iter()
            .map(|t| t.frees_of_blocks_allocated_before_window)
            .sum()
    }

    pub fn device_timeline(&self, device: i64) -> Option<&DeviceTimelineSummary> {
        // Sorted by device, like the engine's timeline.
        let i = self
            .timeline
            .binary_search_by_key(&device, |t| t.device)
            .ok()?;
        self.timeline.get(i)
    }
}
