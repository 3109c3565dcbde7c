//! Will it fit, with sites: [`replay::fit`](crate::torch::replay::fit) and
//! [`replay::predict`](crate::torch::replay::predict) answer in stacks; this turns their stacks
//! into the user frames and roles a reader needs (the failing request's first user line, what
//! was live by site and role). Typed data only: presenters render it (`present::fit`).

use serde::Serialize;

use crate::findings::Location;
use crate::frames::FrameFilter;
use crate::torch::model::{Snapshot, StackId};
use crate::torch::replay::fit::{DeviceFit, Failure, FitOptions};
use crate::torch::replay::predict::{Mismatch, Point, Prediction};
use crate::torch::replay::{Replays, predict};
use crate::torch::stacks::{self, StackIndex};

/// Live bytes at a failure from one site (user frame) and role.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveSite {
    pub site: Option<Location>,
    /// What the memory is for, from the stack (inferred).
    pub role: &'static str,
    pub bytes: u64,
    pub blocks: u64,
}

/// The first failing request with its site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailureReport {
    #[serde(flatten)]
    pub failure: Failure,
    /// The request's first user frame.
    pub site: Option<Location>,
    /// What was live then, by site and role, largest first (at most 10).
    pub live_sites: Vec<LiveSite>,
}

/// Will it fit, for one device, with sites.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceFitReport {
    #[serde(flatten)]
    pub fit: DeviceFit,
    pub first_failure: Option<FailureReport>,
}

/// The live sites shown at a failure.
pub const LIVE_SITES_SHOWN: usize = 10;

fn site_of(snap: &Snapshot, idx: &StackIndex, stack: Option<StackId>) -> Option<Location> {
    idx.site(stack).0.and_then(|k| stacks::location(snap, k))
}

/// A failure's stacks as sites and roles.
pub fn failure_report(snap: &Snapshot, idx: &StackIndex, f: &Failure) -> FailureReport {
    let mut by: Vec<LiveSite> = Vec::new();
    for l in &f.live {
        let site = site_of(snap, idx, l.stack);
        let role = idx.role(l.stack).as_str();
        match by.iter_mut().find(|s| s.site == site && s.role == role) {
            Some(s) => {
                s.bytes = s.bytes.saturating_add(l.bytes);
                s.blocks += l.blocks;
            }
            None => by.push(LiveSite {
                site,
                role,
                bytes: l.bytes,
                blocks: l.blocks,
            }),
        }
    }
    by.sort_by_key(|s| std::cmp::Reverse(s.bytes));
    by.truncate(LIVE_SITES_SHOWN);
    FailureReport {
        failure: f.clone(),
        site: site_of(snap, idx, f.stack),
        live_sites: by,
    }
}

/// Will it fit, for every traced device of `snap`.
pub fn capture_fit(
    snap: &Snapshot,
    replays: &Replays,
    frames: &FrameFilter,
    opts: &FitOptions,
) -> Vec<DeviceFitReport> {
    let idx = StackIndex::new(snap, frames);
    snap.devices()
        .into_iter()
        .filter(|&d| !snap.trace(d).is_empty())
        .map(|d| {
            let fit = replays.fit(snap, d, opts);
            let first_failure = fit
                .on
                .as_ref()
                .and_then(|o| o.first_failure.as_ref())
                .map(|f| failure_report(snap, &idx, f));
            DeviceFitReport { fit, first_failure }
        })
        .collect()
}

/// A prediction with the failing request's site.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PredictionReport {
    #[serde(flatten)]
    pub prediction: Prediction,
    pub first_failure: Option<FailureReport>,
}

/// [`predict::predict`], with sites from the capture its trace is built on.
pub fn predict_report(
    points: &[Point],
    parameter: &str,
    at: f64,
    frames: &FrameFilter,
    opts: &FitOptions,
) -> Result<PredictionReport, Mismatch> {
    let p = predict::predict(points, parameter, at, opts)?;
    let snap = points[p.reference].snap;
    let first_failure =
        p.on.as_ref()
            .and_then(|o| o.first_failure.as_ref())
            .map(|f| failure_report(snap, &StackIndex::new(snap, frames), f));
    Ok(PredictionReport {
        prediction: p,
        first_failure,
    })
}

/// PT017 for each validated device whose recorded requests do not all fit on `capacity` bytes:
/// on the line of the first request that fails there, with what the run needs (simulated).
///
/// Every other finding of the capture gets the devices' `needs` as evidence (the editor's hover
/// shows it), whether or not the capacity fits.
pub fn capacity_findings(
    snap: &Snapshot,
    a: &crate::torch::Analysis,
    capacity: u64,
    others: &mut [crate::findings::Finding],
) -> Vec<crate::findings::Finding> {
    use crate::findings::{Code, Evidence, Finding, Label, Severity, fmt_bytes};
    let opts = FitOptions {
        capacity: Some(capacity),
        settings_trials: false,
        samples: 4,
    };
    let mut out = Vec::new();
    for d in snap.devices() {
        if snap.trace(d).is_empty() {
            continue;
        }
        let fit = a.replays.fit(snap, d, &opts);
        let (Some(n), Some(on)) = (&fit.needs, &fit.on) else {
            continue;
        };
        let line = format!(
            "device {d} needs {} to run without an OOM ({} on the {} set: {})",
            fmt_bytes(n.needs_bytes),
            if on.fits { "fits" } else { "does not fit" },
            fmt_bytes(capacity),
            if on.fits {
                format!("{} spare", fmt_bytes(on.spare_bytes.unwrap_or(0)))
            } else {
                Code::PT017.to_string()
            }
        );
        for f in others.iter_mut() {
            f.evidence
                .push(Evidence::new(Label::Simulated, line.clone()));
        }
        if on.fits {
            continue;
        }
        let cap = fmt_bytes(capacity);
        let needs = fmt_bytes(n.needs_bytes);
        let failure = on
            .first_failure
            .as_ref()
            .map(|f| failure_report(snap, &a.stacks, f));
        let stack = on.first_failure.as_ref().and_then(|f| f.stack);
        let key = a.stacks.site(stack).0;
        let (loc, frames) = crate::torch::stacks::culprit(snap, key, stack);
        let what = match on.first_failure.as_ref().and_then(|f| f.entry) {
            Some(e) => format!(
                "a request of {} (trace entry {e})",
                fmt_bytes(on.first_failure.as_ref().map_or(0, |f| f.request_bytes))
            ),
            None => "the blocks live at the first trace entry".into(),
        };
        let mut f = Finding::new(
            Code::PT017,
            Severity::Error,
            format!("OOM here on {cap}: this step needs {needs} (device {d}; {what} fails first)."),
        )
        .bytes(n.needs_bytes, None, Label::Simulated)
        .evidence(Evidence::new(Label::Simulated, format!(
            "replayed on a device of {capacity} B through the allocator model (validated against \
             this capture's segment events): {what} fails after the OOM path freed the cache"
        )))
        .evidence(Evidence::new(Label::Simulated, format!(
            "needs {} B: the smallest capacity (to 2 MiB) on which every request of device {d} \
             is served",
            n.needs_bytes
        )));
        if let Some(fr) = &failure {
            for s in fr.live_sites.iter().take(3) {
                let at = s.site.as_ref().map_or_else(
                    || "<no user frame>".into(),
                    |l| format!("{}:{}", l.file, l.line),
                );
                f = f.evidence(Evidence::new(
                    Label::Simulated,
                    format!(
                        "live then: {} in {} blocks from {at} ({}, role inferred)",
                        fmt_bytes(s.bytes),
                        s.blocks,
                        s.role
                    ),
                ));
            }
        }
        if !on.fits_with.is_empty() {
            f = f.evidence(Evidence::new(
                Label::Simulated,
                format!(
                    "fits on {cap} with PYTORCH_CUDA_ALLOC_CONF={}",
                    on.fits_with.join(" or ")
                ),
            ));
        }
        if let Some(l) = loc {
            f = f.at(Some(l), frames);
        }
        f.scope = Some(format!("device {d}"));
        out.push(f);
    }
    out
}

/// A user line as the fit's JSON names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteEntry {
    pub file: String,
    pub line: u32,
    pub function: String,
}

fn site_entry(l: &Option<Location>) -> Option<SiteEntry> {
    l.as_ref().map(|l| SiteEntry {
        file: l.shown().to_string(),
        line: l.line,
        function: l.function.clone(),
    })
}

/// What was live at a failure, from one line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveEntry {
    pub site: Option<SiteEntry>,
    pub role: &'static str,
    pub bytes: u64,
    pub blocks: u64,
}

/// `first_failure`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailureEntry {
    /// Trace index; `null`: the blocks live at the first trace entry do not fit.
    pub entry: Option<u64>,
    /// The request, rounded as the allocator rounds it.
    pub size: u64,
    pub site: Option<SiteEntry>,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub live: Vec<LiveEntry>,
}

impl FailureEntry {
    pub fn of(f: &FailureReport) -> FailureEntry {
        FailureEntry {
            entry: f.failure.entry,
            size: f.failure.request_bytes,
            site: site_entry(&f.site),
            reserved_bytes: f.failure.reserved_bytes,
            allocated_bytes: f.failure.allocated_bytes,
            live: f
                .live_sites
                .iter()
                .map(|s| LiveEntry {
                    site: site_entry(&s.site),
                    role: s.role,
                    bytes: s.bytes,
                    blocks: s.blocks,
                })
                .collect(),
        }
    }
}

/// `on`: the replay on one capacity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OnEntry {
    pub capacity_bytes: u64,
    /// As the user named it (`H100 80 GB (79.15 GiB after a 512.00 MiB CUDA context)`).
    pub capacity: Option<String>,
    pub fits: bool,
    pub spare_bytes: Option<u64>,
    pub peak_reserved_bytes: u64,
    pub first_failure: Option<FailureEntry>,
    /// Settings under which the same capacity serves every request.
    pub fits_with: Vec<String>,
}

impl OnEntry {
    pub fn of(
        o: &crate::torch::replay::fit::AtCapacity,
        failure: Option<&FailureReport>,
        shown: Option<&str>,
    ) -> OnEntry {
        OnEntry {
            capacity_bytes: o.capacity_bytes,
            capacity: shown.map(str::to_string),
            fits: o.fits,
            spare_bytes: o.spare_bytes,
            peak_reserved_bytes: o.peak_reserved_bytes,
            first_failure: failure.map(FailureEntry::of),
            fits_with: o.fits_with.clone(),
        }
    }
}

/// One device of `captures[].torch.fit` (the keys scripts read: docs/FITS.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FitEntry {
    pub device: i64,
    pub validated: bool,
    /// `simulated`, or `not simulated` (no numbers) where the replay does not validate.
    pub label: &'static str,
    pub needs_bytes: Option<u64>,
    pub needs_bytes_expandable: Option<u64>,
    pub needs_bytes_max_split: Option<u64>,
    pub best_max_split_size_mb: Option<u64>,
    pub max_split: Vec<crate::torch::replay::fit::SettingNeeds>,
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    pub monotonic: Option<bool>,
    pub capacities_checked: Option<u32>,
    /// Reserved + free at the recorded OOM (read from the capture).
    pub recorded_capacity_bytes: Option<u64>,
    /// No OOM recorded, but the device refused memory: [lowest, highest] its capacity can be by
    /// those refusals and what it granted (inferred).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_capacity_range_bytes: Option<[u64; 2]>,
    pub note: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on: Option<OnEntry>,
}

impl FitEntry {
    pub fn of(d: &DeviceFitReport, capacity_shown: Option<&str>) -> FitEntry {
        let f = &d.fit;
        let n = f.needs.as_ref();
        FitEntry {
            device: f.device,
            validated: f.validated,
            label: if f.validated {
                "simulated"
            } else {
                "not simulated"
            },
            needs_bytes: n.map(|n| n.needs_bytes),
            needs_bytes_expandable: f.needs_bytes_expandable,
            needs_bytes_max_split: f.needs_bytes_max_split,
            best_max_split_size_mb: f.best_max_split_size_mb,
            max_split: f.max_split.clone(),
            peak_allocated_bytes: n.map(|n| n.peak_allocated_bytes),
            peak_reserved_bytes: n.map(|n| n.peak_reserved_bytes),
            monotonic: n.map(|n| n.monotonic),
            capacities_checked: n.map(|n| n.capacities_checked),
            recorded_capacity_bytes: f.recorded_capacity_bytes,
            recorded_capacity_range_bytes: f.recorded_capacity_range_bytes.map(|(l, h)| [l, h]),
            note: f.note.clone(),
            on: f
                .on
                .as_ref()
                .map(|o| OnEntry::of(o, d.first_failure.as_ref(), capacity_shown)),
        }
    }
}
