//! Report text and JSON for one capture.

use std::path::Path;

use super::capture::Capture;
use super::plan::Plan;
use super::runtime::Runtime;
use crate::analyze::Options;
use crate::error::CaptureError;
use crate::report::{CaptureKind, CaptureReport, EngineData};

/// Program text next to the capture or at its recorded path.
pub fn default_source_lookup(_capture: &Path) -> impl Fn(&str) -> Option<String> {
    |_p: &str| None
}

pub fn report(
    cap: &Capture,
    _plans: Vec<Plan>,
    _rt: Runtime,
    _opts: &Options,
    _source: &dyn Fn(&str) -> Option<String>,
) -> Result<CaptureReport, CaptureError> {
    Ok(CaptureReport {
        path: cap.file.path.clone(),
        kind: CaptureKind::XlaCapture,
        headline: String::new(),
        engine: EngineData::None,
        sites: vec![],
        findings: vec![],
        text: String::new(),
    })
}
