//! JAX/XLA profiler captures (`*.xplane.pb`): decoding, the plan and runtime models, analyses.
//!
//! decode (`wire`, `space`, `hlo`, `capture`) → model (`plan::Plan`, `runtime::Runtime`) →
//! analyse (`select`, `growth`, `diagnose`, `sites`) → the typed [`Output`] (`summary`). Only
//! `/host:metadata` is needed for the plan; event planes are walked only for the runtime view.

pub mod capture;
pub mod diagnose;
pub mod donation;
pub mod eval_outputs;
pub mod growth;
pub mod hlo;
pub mod layer_params;
pub mod plan;
pub mod runtime;
pub mod select;
pub mod sites;
pub mod space;
pub mod summary;
pub mod wire;

use crate::error::CaptureError;
use crate::findings::{Finding, Location};
use crate::options::AnalysisOptions;
use crate::site::Site;

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

pub use capture::Capture;

/// `(module name, total peak bytes)` of every module: the metadata-only listing.
pub fn list_modules(path: &std::path::Path) -> Result<Vec<(String, u64)>, CaptureError> {
    let cap = Capture::open(path)?;
    Ok(plan::plans(&cap, 0)?
        .into_iter()
        .map(|p| (p.module, p.total_peak_bytes))
        .collect())
}

/// What the engine hands to the pipeline for one capture.
pub struct Output {
    pub summary: summary::Summary,
    pub sites: Vec<Site>,
    pub findings: Vec<Finding>,
}

/// Analyse an opened capture: choose the module, read the runtime view, diagnose.
pub fn analyse(cap: &Capture, opts: &AnalysisOptions) -> Result<Output, CaptureError> {
    let out = analyse_planes(cap, opts);
    if cap.file.watch.lost(&cap.file.path) {
        // A mapped plane lost its file underneath (pages read as zeros): nothing read holds.
        return Err(CaptureError::truncated_while_read(&cap.file.path));
    }
    out
}

fn analyse_planes(cap: &Capture, opts: &AnalysisOptions) -> Result<Output, CaptureError> {
    use crate::timings::time;
    let plans = time("xla: plans", || plan::plans(cap, 0))?;
    let rt = time("xla: runtime", || runtime::read(cap, &plans))?;
    // The runtime walk reads nearly all of a large capture; what follows is analysis.
    cap.file.progress.advance(cap.file.len);
    let chosen = select::select(&cap.file.path, &plans, &rt, opts.module.as_deref())?;
    let Some((plan, why)) = chosen else {
        return Ok(Output {
            summary: summary::runtime_only(&rt, cap.versions.clone()),
            sites: Vec::new(),
            findings: Vec::new(),
        });
    };
    let execs: Vec<&runtime::Execution> = rt.executions_of(&plan.module).collect();
    let pick = |stack: &[Location]| {
        opts.frames
            .pick(stack.iter().map(|l| l.file.as_str()))
            .map(|(i, _)| i)
    };
    let (growth, between_last_two) = time("xla: growth", || {
        growth::between_executions(cap, &rt, plan, &execs, &opts.frames)
    })?;
    let live_at_last = execs
        .last()
        .map(|e| rt.live_at(e.start_ps))
        .unwrap_or_default();
    let ctx = diagnose::Context {
        plan,
        rt: &rt,
        execs,
        capacity: rt.main().map(|a| a.capacity_bytes),
        device_memory: rt.device_memory,
        call_site: plan.call_site.first().map(|f| f.location()),
        growth,
        live_at_last,
        pick: &pick,
        cpu: cap.versions.iter().any(|(k, _)| k == "cpu_version")
            && !cap.versions.iter().any(|(k, _)| k == "gpu_version"),
    };
    let findings = time("xla: diagnose", || diagnose::diagnose(&ctx));
    let sites = sites::sites(plan, &opts.frames, opts.top);
    let summary = time("xla: summary", || {
        summary::summarize(summary::Parts {
            plan,
            plans: &plans,
            rt: &rt,
            versions: cap.versions.clone(),
            why,
            between_last_two,
            live_at_last: ctx.live_at_last,
            pictures: opts.pictures,
        })
    });
    Ok(Output {
        summary,
        sites,
        findings,
    })
}
