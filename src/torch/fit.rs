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
    by.sort_by(|a, b| b.bytes.cmp(&a.bytes));
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
