//! Decode a snapshot file (pickle or JSON) into the [`Snapshot`] model.

use std::path::Path;

use crate::error::{CaptureError, ErrorKind};
use crate::torch::model::Snapshot;

/// Loader options.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Keep only the newest N entries of each device trace (`--max-trace-events`).
    pub max_trace_events: Option<usize>,
}

/// Read and decode a snapshot file (`.pickle`/`.pkl` or the JSON form).
pub fn load_snapshot(path: &Path, _opts: &LoadOptions) -> Result<Snapshot, CaptureError> {
    Err(CaptureError::new(
        path,
        ErrorKind::Unsupported,
        None,
        "snapshot loader not built yet",
        "",
    ))
}

/// Decode snapshot bytes already in memory (`path` is used for error messages only).
pub fn decode_snapshot(
    path: &Path,
    _bytes: &[u8],
    _opts: &LoadOptions,
) -> Result<Snapshot, CaptureError> {
    Err(CaptureError::new(
        path,
        ErrorKind::Unsupported,
        None,
        "snapshot loader not built yet",
        "",
    ))
}
