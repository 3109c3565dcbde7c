//! Runtime view from allocator (BFC) events and execution events.

use super::capture::Capture;
use super::plan::Plan;
use crate::error::CaptureError;

/// What the event planes say about the run.
#[derive(Clone, Debug, Default)]
pub struct Runtime {}

/// Walk the event planes.
pub fn read(_cap: &Capture, _plans: &[Plan]) -> Result<Runtime, CaptureError> {
    Ok(Runtime::default())
}
