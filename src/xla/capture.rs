//! An opened capture: its plane index and the HLO modules of `/host:metadata` (decode only;
//! plans are computed by `plan::plans`).

use std::path::Path;

use super::hlo::{self, ModuleEntry};
use super::space::SpaceFile;
use crate::error::CaptureError;
use crate::options::DecodeOptions;

/// The planes of a capture and its HLO modules, read from `/host:metadata` only (no event is
/// decoded).
pub struct Capture {
    pub file: SpaceFile,
    pub modules: Vec<ModuleEntry>,
    /// Plane-level stats of `/host:metadata` worth showing (`jax_version`, …).
    pub versions: Vec<(String, String)>,
}

impl Capture {
    /// Open a capture and read its module list.
    pub fn open(path: &Path) -> Result<Capture, CaptureError> {
        Capture::open_with(path, &DecodeOptions::default())
    }

    /// [`Capture::open`] with the decoder's limits (the model budget of each plane's metadata).
    pub fn open_with(path: &Path, opts: &DecodeOptions) -> Result<Capture, CaptureError> {
        let file = SpaceFile::open_with(path, opts)?;
        let mut modules = Vec::new();
        let mut versions = Vec::new();
        let metas: Vec<_> = file.find(|n| n == "/host:metadata").cloned().collect();
        for idx in &metas {
            let plane = file.load(idx)?;
            modules.extend(hlo::modules(&plane));
            for key in [
                "jax_version",
                "jaxlib_version",
                "cpu_version",
                "gpu_version",
            ] {
                if let Some(v) = plane.plane_stat_str(key) {
                    versions.push((key.to_string(), v));
                }
            }
        }
        Ok(Capture {
            file,
            modules,
            versions,
        })
    }
}
