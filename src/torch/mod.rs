//! PyTorch CUDA memory snapshots: model, loading and analyses.

pub mod load;
pub mod model;

use std::path::Path;

use crate::analyze::Options;
use crate::error::{CaptureError, ErrorKind};
use crate::report::CaptureReport;

/// Analyse one snapshot file.
pub fn analyze_file(path: &Path, _opts: &Options) -> Result<CaptureReport, CaptureError> {
    Err(CaptureError::new(
        path,
        ErrorKind::Unsupported,
        None,
        "PyTorch engine not built yet",
        "",
    ))
}

/// Analyse a set of per-rank snapshots and compare them.
pub fn analyze_ranks(paths: &[&Path], _opts: &Options) -> Result<Vec<CaptureReport>, CaptureError> {
    Err(CaptureError::new(
        paths[0],
        ErrorKind::Unsupported,
        None,
        "PyTorch engine not built yet",
        "",
    ))
}

/// Diff two snapshots (PT011).
pub fn analyze_diff(
    earlier: &Path,
    _later: &Path,
    _opts: &Options,
) -> Result<CaptureReport, CaptureError> {
    Err(CaptureError::new(
        earlier,
        ErrorKind::Unsupported,
        None,
        "PyTorch engine not built yet",
        "",
    ))
}
