//! PyTorch CUDA memory snapshots: model, loading and analyses.
//!
//! `analyze_snapshot` runs every analysis once over a loaded [`Snapshot`]; `analyze_file`,
//! `analyze_ranks` and `analyze_diff` load files and turn the result into [`CaptureReport`]s.

pub mod diff;
pub mod fragmentation;
pub mod load;
pub mod model;
pub mod patterns;
pub mod ranks;
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
    let totals = totals::compute(snap, &stacks);
    let all_sites = sites::compute(snap, &stacks, None);
    let device_sites = totals
        .devices
        .iter()
        .map(|d| sites::compute(snap, &stacks, Some(d.device)))
        .collect();
    let timeline = timeline::compute(snap, &stacks);
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
        "user container"
    } else {
        s.role().as_str()
    }
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
