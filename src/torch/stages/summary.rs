//! The stages as the JSON contract's `captures[].torch.stages` (serde) and the headline's
//! stage at the peak.

use serde::Serialize;

use crate::torch::model::Snapshot;
use crate::torch::stacks::site_string;
use crate::torch::stages::{Stage, StageSource, Stages};

/// One stage of one device (`captures[].torch.stages[]`).
#[derive(Clone, Debug, Serialize)]
pub struct StageSummary {
    pub device: i64,
    /// The recorded `record_function` name, or inferred: `forward`, `optimizer`, and the frees
    /// after a peak named by their release stacks (`backward`, `graph dropped`, `autocast cache
    /// clear`, `zero_grad`, `gc`, `release`; docs/STAGES.md).
    pub name: String,
    /// `recorded` (an `external_annotations` START/END pair) or `inferred` (from the trace).
    pub source: &'static str,
    /// Label of the name and span: `read` or `inferred`; the bytes are `measured`.
    pub label: &'static str,
    pub occurrence: u32,
    pub step: u32,
    pub depth: u32,
    /// Recorded spans of this name over exactly these entries folded into this one.
    pub repeats: u32,
    pub span: Span,
    pub start_bytes: i64,
    pub end_bytes: i64,
    pub growth_bytes: i64,
    pub peak_bytes: i64,
    pub peak_index: u64,
    /// Whether the device's trace peak falls in this stage (the innermost one holding it).
    pub holds_device_peak: bool,
    pub top_sites: Vec<StageSite>,
}

/// Trace entries `start_index..end_index` of the device, and their times.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Span {
    pub start_index: u64,
    pub end_index: u64,
    pub start_us: Option<i64>,
    pub end_us: Option<i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StageSite {
    pub site: String,
    pub bytes: u64,
    pub blocks: u64,
}

/// The stage holding a device's peak, for the headline.
#[derive(Clone, Debug, Serialize)]
pub struct StageAtPeak {
    pub device: i64,
    pub name: String,
    pub source: &'static str,
    pub step: u32,
    pub peak_bytes: i64,
}

impl StageAtPeak {
    /// "peak in `Optimizer.step#AdamW.step` of step 3" (an inferred stage says so).
    pub fn phrase(&self) -> String {
        match self.source {
            "recorded" => format!("peak in `{}` of step {}", self.name, self.step),
            _ => format!("peak in the {} of step {} (inferred)", self.name, self.step),
        }
    }
}

fn source(s: StageSource) -> &'static str {
    match s {
        StageSource::Recorded => "recorded",
        StageSource::Inferred => "inferred",
    }
}

fn one(snap: &Snapshot, s: &Stage, holds: bool) -> StageSummary {
    StageSummary {
        device: s.device,
        name: s.name.clone(),
        source: source(s.source),
        label: s.source.label(),
        occurrence: s.occurrence,
        step: s.step,
        depth: s.depth,
        repeats: s.repeats,
        span: Span {
            start_index: s.start,
            end_index: s.end,
            start_us: s.start_us,
            end_us: s.end_us,
        },
        start_bytes: s.start_bytes,
        end_bytes: s.end_bytes,
        growth_bytes: s.growth(),
        peak_bytes: s.peak_bytes,
        peak_index: s.peak_index,
        holds_device_peak: holds,
        top_sites: s
            .top_sites
            .iter()
            .map(|(k, bytes, blocks)| StageSite {
                site: site_string(snap, *k),
                bytes: *bytes,
                blocks: *blocks,
            })
            .collect(),
    }
}

/// Every stage, in device then trace order.
pub fn stages(snap: &Snapshot, st: &Stages) -> Vec<StageSummary> {
    st.stages
        .iter()
        .enumerate()
        .map(|(i, s)| one(snap, s, st.at_peak.iter().any(|(_, k)| *k == i)))
        .collect()
}

/// The stage holding each device's peak.
pub fn at_peak(st: &Stages) -> Vec<StageAtPeak> {
    st.at_peak
        .iter()
        .filter_map(|(d, i)| {
            let s = st.stages.get(*i)?;
            Some(StageAtPeak {
                device: *d,
                name: s.name.clone(),
                source: source(s.source),
                step: s.step,
                peak_bytes: s.peak_bytes,
            })
        })
        .collect()
}
