//! PyTorch CUDA memory snapshots: model, loading and analyses.
//!
//! `analyze_snapshot` runs every analysis once over a loaded [`Snapshot`]; `analyze_file`,
//! `analyze_ranks` and `analyze_diff` load files and turn the result into [`CaptureReport`]s.

pub mod diff;
pub mod fragmentation;
mod intern;
pub mod load;
pub mod model;
pub mod patterns;
pub mod ranks;
pub mod replay;
pub mod sites;
pub mod stacks;
pub mod text;
pub mod timeline;
pub mod totals;

use std::path::Path;

use serde_json::{Value, json};

use crate::analyze::Options;
use crate::error::CaptureError;
use crate::findings::{Finding, Location};
use crate::report::{CaptureKind, CaptureReport, EngineData, Site};
use crate::torch::load::{LoadOptions, load_snapshot};
use crate::torch::model::Snapshot;
use crate::torch::stacks::StackIndex;

/// Every analysis of one snapshot.
pub struct Analysis {
    pub totals: totals::Totals,
    /// Sites over all devices.
    pub sites: sites::Sites,
    /// Sites per device (same order as `totals.devices`).
    pub device_sites: Vec<sites::Sites>,
    pub timeline: timeline::Timeline,
    pub fragmentation: Vec<fragmentation::OomDiagnosis>,
    pub findings: Vec<Finding>,
    pub stacks: StackIndex,
}

/// Run every analysis over a loaded snapshot.
pub fn analyze_snapshot(snap: &Snapshot, opts: &Options) -> Analysis {
    let stacks = StackIndex::new(snap, &opts.frames);
    let others = |stacks: &StackIndex| {
        let totals = totals::compute(snap, stacks);
        let all_sites = sites::compute(snap, stacks, None);
        let device_sites: Vec<_> = totals
            .devices
            .iter()
            .map(|d| sites::compute(snap, stacks, Some(d.device)))
            .collect();
        (totals, all_sites, device_sites)
    };
    // The timeline replays the whole trace; on a large one it runs beside the other analyses.
    let entries: usize = snap.device_traces.iter().flatten().map(Vec::len).sum();
    let ((totals, all_sites, device_sites), timeline) = if entries >= PARALLEL_FROM {
        std::thread::scope(|sc| {
            let tl = sc.spawn(|| timeline::compute(snap, &stacks));
            let rest = others(&stacks);
            let tl = tl.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            (rest, tl)
        })
    } else {
        (others(&stacks), timeline::compute(snap, &stacks))
    };
    let fragmentation = fragmentation::diagnose(snap, &totals, &timeline);
    let mut a = Analysis {
        totals,
        sites: all_sites,
        device_sites,
        timeline,
        fragmentation,
        findings: Vec::new(),
        stacks,
    };
    a.findings = patterns::detect(snap, &a);
    sort_findings(&mut a.findings);
    a
}

/// Traces with at least this many entries get the timeline on a second thread.
const PARALLEL_FROM: usize = 200_000;

/// Most severe first; within a severity, more bytes first (stable otherwise).
pub fn sort_findings(f: &mut [Finding]) {
    f.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(b.bytes.unwrap_or(0).cmp(&a.bytes.unwrap_or(0)))
    });
}

fn load_options(opts: &Options) -> LoadOptions {
    LoadOptions {
        max_trace_events: opts.max_trace_events,
    }
}

/// Analyse one snapshot file.
pub fn analyze_file(path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
    let snap = load_snapshot(path, &load_options(opts))?;
    let a = analyze_snapshot(&snap, opts);
    Ok(build_report(path, &snap, &a, opts))
}

/// Analyse a set of per-rank snapshots and compare them.
pub fn analyze_ranks(paths: &[&Path], opts: &Options) -> Result<Vec<CaptureReport>, CaptureError> {
    ranks::analyze(paths, opts)
}

/// Diff two snapshots of one run (PT011); the report is about the later one.
pub fn analyze_diff(
    earlier: &Path,
    later: &Path,
    opts: &Options,
) -> Result<CaptureReport, CaptureError> {
    let lo = load_options(opts);
    let before = load_snapshot(earlier, &lo)?;
    let after = load_snapshot(later, &lo)?;
    let a_before = analyze_snapshot(&before, opts);
    let mut a_after = analyze_snapshot(&after, opts);
    let d = diff::diff(&before, &a_before, &after, &a_after);
    a_after.findings.extend(diff::findings(&after, &d));
    sort_findings(&mut a_after.findings);
    let mut report = build_report(later, &after, &a_after, opts);
    if let EngineData::Torch(Value::Object(o)) = &mut report.engine {
        o.insert("diff".into(), d.to_json(earlier, later));
    }
    report.text = text::render(&after, &a_after, opts, Some((&d, earlier)), None);
    report.headline = headline(&after, &a_after);
    Ok(report)
}

/// The engine JSON: `{"totals": T, "devices": [T + {"device"}], ...}`.
pub fn engine_json(snap: &Snapshot, a: &Analysis, opts: &Options) -> Value {
    let devices: Vec<Value> = a
        .totals
        .devices
        .iter()
        .zip(a.device_sites.iter())
        .map(|(d, s)| {
            let mut v = totals::device_json(d, snap);
            if let Value::Object(o) = &mut v {
                o.insert(
                    "allocation_sites".into(),
                    s.to_json(snap, d.memory.allocated, opts.top),
                );
            }
            v
        })
        .collect();
    json!({
        "format": match snap.format {
            Some(model::SnapshotFormat::SegmentList) => "segment-list",
            _ => "dict",
        },
        "pickle_protocol": snap.pickle_protocol,
        "totals": totals::overall_json(&a.totals, snap),
        "devices": devices,
        "allocation_sites": a.sites.to_json(snap, a.totals.overall.allocated, opts.top),
        "timeline": a.timeline.to_json(snap),
        "fragmentation": a.fragmentation.iter().map(|f| f.to_json()).collect::<Vec<_>>(),
    })
}

/// Top sites as the shared `Site` type (percent of live memory).
pub fn report_sites(snap: &Snapshot, a: &Analysis, top: usize) -> Vec<Site> {
    let allocated = a.totals.overall.allocated;
    a.sites
        .sites
        .iter()
        .take(top)
        .map(|s| Site {
            location: s.key.and_then(|k| stacks::location(snap, k)),
            bytes: s.bytes,
            requested_bytes: Some(s.requested_bytes),
            blocks: s.blocks,
            percent: s.percent_of(allocated).unwrap_or(0.0),
            stack: stacks::stack_locations(snap, s.stack, None),
            role: Some(site_role(a, s).to_string()),
            scope: None,
            percent_of: "live memory",
        })
        .collect()
}

/// A site's role, with "user container" when a pattern found it growing like one.
pub fn site_role(a: &Analysis, s: &sites::SiteStat) -> &'static str {
    let grows = a
        .findings
        .iter()
        .any(|f| f.code == "PT003" && f.location.is_some() && same_site(f.location.as_ref(), s));
    if grows {
        return "user container";
    }
    let role = s.role();
    if role == stacks::Role::Unknown {
        // A line whose allocations the trace shows freed again almost every time.
        let (allocs, freed) = a
            .timeline
            .devices
            .iter()
            .flat_map(|t| t.sites.iter())
            .filter(|t| t.key == s.key && s.key.is_some())
            .fold((0u64, 0u64), |(x, y), t| {
                (x.saturating_add(t.allocs), y.saturating_add(t.freed))
            });
        if allocs >= 4 && freed.saturating_mul(10) >= allocs.saturating_mul(9) {
            return "temporary";
        }
    }
    role.as_str()
}

fn same_site(l: Option<&Location>, s: &sites::SiteStat) -> bool {
    l.is_some_and(|l| s.site == format!("{}:{}:{}", l.file, l.line, l.function))
}

/// One sentence, the main finding first.
pub fn headline(snap: &Snapshot, a: &Analysis) -> String {
    if let Some(f) = a.findings.first()
        && f.severity >= crate::findings::Severity::Information
    {
        return f.message.clone();
    }
    text::summary_sentence(snap, a)
}

/// Assemble the report of one analysed snapshot.
pub fn build_report(path: &Path, snap: &Snapshot, a: &Analysis, opts: &Options) -> CaptureReport {
    CaptureReport {
        path: path.to_path_buf(),
        kind: CaptureKind::TorchSnapshot,
        headline: headline(snap, a),
        engine: EngineData::Torch(engine_json(snap, a, opts)),
        sites: report_sites(snap, a, opts.top),
        findings: a.findings.clone(),
        text: text::render(snap, a, opts, None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch::model::{Action, Block, BlockState, Frame, Segment, TraceEntry};

    #[test]
    fn a_large_trace_analysed_on_two_threads_matches_one_thread() {
        let mut trace = Vec::new();
        for i in 0..(PARALLEL_FROM as u64 / 2 + 1) {
            let st = Some((i % 3) as u32);
            trace.push(TraceEntry::new(Action::Alloc, i, 512, 0).with_stack(st));
            if i % 4 != 0 {
                trace.push(TraceEntry::new(Action::FreeCompleted, i, 512, 0).with_stack(st));
            }
        }
        let frame = |n: &str| Frame {
            name: n.into(),
            filename: "/w/train.py".into(),
            line: 3,
        };
        let snap = Snapshot {
            device_traces: Some(vec![trace]),
            frames: vec![frame("a"), frame("b"), frame("c")],
            stacks: vec![vec![0], vec![1], vec![2]],
            ..Snapshot::default()
        };
        let opts = Options::default();
        let a = analyze_snapshot(&snap, &opts);
        let stacks = StackIndex::new(&snap, &opts.frames);
        assert_eq!(a.timeline, timeline::compute(&snap, &stacks));
        assert_eq!(a.totals, totals::compute(&snap, &stacks));
        assert_eq!(a.timeline.devices[0].allocs, PARALLEL_FROM as u64 / 2 + 1);
    }

    /// Values a corrupt or hostile file can carry: sizes at u64::MAX, stack ids past the table,
    /// negative devices, frees of unknown addresses, an OOM on an empty device.
    #[test]
    fn hostile_values_do_not_panic() {
        let big = Block {
            address: u64::MAX - 1,
            size: u64::MAX,
            requested_size: u64::MAX,
            state: BlockState::ActiveAllocated,
            stack: Some(9999),
            history_len: 0,
        };
        let mut other = big.clone();
        other.state = BlockState::Other("weird".into());
        let mut inactive = big.clone();
        inactive.state = BlockState::Inactive;
        let seg = |device| Segment {
            device,
            address: 0,
            total_size: u64::MAX,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: u64::MAX,
            segment_type: None,
            is_expandable: true,
            pool_id: Some((-1, -1)),
            stack: Some(u32::MAX),
            blocks: vec![big.clone(), other.clone(), inactive.clone()],
        };
        let e = |action: Action, addr: u64, size: u64| {
            TraceEntry::new(action, addr, size, 0)
                .with_time_us(Some(i64::MIN))
                .with_device_free(Some(u64::MAX))
                .with_stack(Some(12345))
        };
        let snap = Snapshot {
            segments: vec![seg(-3), seg(0), seg(0)],
            device_traces: Some(vec![
                vec![
                    e(Action::FreeCompleted, 1, u64::MAX),
                    e(Action::Alloc, 1, u64::MAX),
                    e(Action::Alloc, 1, u64::MAX),
                    e(Action::Oom, 0, u64::MAX),
                    e(Action::FreeRequested, 7, 0),
                    e(Action::Other(0), 0, 1),
                    e(Action::SegmentUnmap, 0, u64::MAX),
                ],
                vec![e(Action::Oom, 0, 1)],
            ]),
            frames: vec![Frame {
                name: String::new(),
                filename: "<frozen x>".into(),
                line: u64::MAX,
            }],
            stacks: vec![vec![0, 77]],
            other_actions: vec!["later".into()],
            ..Snapshot::default()
        };
        let opts = Options::default();
        let a = analyze_snapshot(&snap, &opts);
        let r = build_report(Path::new("x.pickle"), &snap, &a, &opts);
        assert!(!r.headline.is_empty());
        assert!(r.findings.iter().any(|f| f.code == "PT009"));
        let d = diff::diff(&snap, &a, &snap, &a);
        assert!(d.grown.is_empty(), "a snapshot never grows against itself");
    }
}
