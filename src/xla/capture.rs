//! One capture file end to end: index → metadata → plans → runtime → findings → report.

use std::path::Path;

use super::hlo::{self, ModuleEntry};
use super::plan::{self, Plan};
use super::space::SpaceFile;
use crate::error::CaptureError;

/// Module names and plan totals, read from `/host:metadata` only (no event is decoded).
pub struct Capture {
    pub file: SpaceFile,
    pub modules: Vec<ModuleEntry>,
    /// Plane-level stats of `/host:metadata` worth showing (`jax_version`, …).
    pub versions: Vec<(String, String)>,
}

impl Capture {
    /// Open a capture and read its module list.
    pub fn open(path: &Path) -> Result<Capture, CaptureError> {
        let file = SpaceFile::open(path)?;
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

    /// The plan of every module, memory colour `color`.
    pub fn plans(&self, color: i64) -> Result<Vec<Plan>, CaptureError> {
        self.modules
            .iter()
            .map(|m| {
                let proto = hlo::decode(&self.file.path, m)?;
                Ok(plan::compute(m, &proto, color))
            })
            .collect()
    }
}

/// `(module name, total peak bytes)` of every module: the metadata-only listing.
pub fn list_modules(path: &Path) -> Result<Vec<(String, u64)>, CaptureError> {
    let cap = Capture::open(path)?;
    Ok(cap
        .plans(0)?
        .into_iter()
        .map(|p| (p.module, p.total_peak_bytes))
        .collect())
}
