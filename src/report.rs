//! What an analysis hands to the presenters: one `CaptureReport` per capture (per rank / per host).

use std::path::PathBuf;

use serde::Serialize;

use crate::findings::{Finding, Location};

/// The two kinds of evidence memlsp reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum CaptureKind {
    #[serde(rename = "torch-snapshot")]
    TorchSnapshot,
    #[serde(rename = "xla-capture")]
    XlaCapture,
}

impl CaptureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureKind::TorchSnapshot => "torch-snapshot",
            CaptureKind::XlaCapture => "xla-capture",
        }
    }
}

/// Live memory attributed to one source line (PyTorch: active blocks grouped by first user frame;
/// JAX: buffers live at the heap peak grouped by their Python line).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Site {
    /// The culprit frame; `None` for the merged `<no stack>` site.
    pub location: Option<Location>,
    pub bytes: u64,
    /// PyTorch: Σ requested_size of the blocks; JAX: unpadded bytes when known.
    pub requested_bytes: Option<u64>,
    /// Number of blocks / buffers.
    pub blocks: u64,
    /// Share of live memory (PyTorch: of allocated bytes; JAX: of the heap peak).
    pub percent: f64,
    /// The representative stack, innermost first, including framework frames.
    pub stack: Vec<Location>,
    /// Role guess from the stack or name stack (parameter, optimizer state, activation, …).
    pub role: Option<String>,
    /// Rank / device / module the site belongs to.
    pub scope: Option<String>,
    /// What the percent is of, for inlay hints: `live memory` or `heap peak`.
    pub percent_of: &'static str,
}

/// Everything known about one capture, ready to present.
#[derive(Debug, Serialize)]
pub struct CaptureReport {
    pub path: PathBuf,
    pub kind: CaptureKind,
    /// One sentence: the main finding first.
    pub headline: String,
    /// Engine-specific data in the JSON contract's shape (`torch` or `xla` key).
    #[serde(skip)]
    pub engine: EngineData,
    /// Top sites, largest first.
    pub sites: Vec<Site>,
    /// Findings, most severe first.
    pub findings: Vec<Finding>,
    /// Full human report body (totals, top sites, timeline, diagnosis, next steps, uncertainty)
    /// rendered by the engine's presenter; the CLI prints it under the headline.
    #[serde(skip)]
    pub text: String,
}

/// Engine-specific part of a report, already shaped as the JSON contract's `torch` / `xla` value.
#[derive(Debug, Default)]
pub enum EngineData {
    Torch(serde_json::Value),
    Xla(serde_json::Value),
    #[default]
    None,
}
