//! JAX/XLA profiler captures (`*.xplane.pb`): plan, runtime and analyses.
//!
//! decode (`space`, `wire`, `hlo`) → model (`plan::Plan`, `runtime::Runtime`) → analyse
//! (`diagnose`) → present (`present`). Only `/host:metadata` is needed for the plan; event
//! planes are walked only for the runtime view.

pub mod capture;
pub mod diagnose;
pub mod hlo;
pub mod plan;
pub mod present;
pub mod runtime;
pub mod space;
pub mod wire;

/// prost types generated from `proto/` by `build.rs`.
pub mod pb {
    #[allow(clippy::all, missing_docs)]
    pub mod profiler {
        include!(concat!(env!("OUT_DIR"), "/tensorflow.profiler.rs"));
    }
    #[allow(clippy::all, missing_docs)]
    pub mod xla {
        include!(concat!(env!("OUT_DIR"), "/xla.rs"));
    }
}

pub use capture::{Capture, analyze_file, analyze_file_with, list_modules};
