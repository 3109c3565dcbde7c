//! JAX/XLA profiler captures (`*.xplane.pb`): plan, runtime and analyses.

use std::path::Path;

use crate::analyze::Options;
use crate::error::{CaptureError, ErrorKind};
use crate::report::CaptureReport;

/// Analyse one `.xplane.pb` file.
pub fn analyze_file(path: &Path, _opts: &Options) -> Result<CaptureReport, CaptureError> {
    Err(CaptureError::new(
        path,
        ErrorKind::Unsupported,
        None,
        "JAX engine not built yet",
        "",
    ))
}
