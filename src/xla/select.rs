//! Which module of a capture to analyse: the one the user named, else the one whose last
//! execution stalled (an OOM inside the step), else the largest executed plan.

use std::path::Path;

use super::hlo::split_program_id;
use super::plan::Plan;
use super::runtime::Runtime;
use crate::error::{CaptureError, ErrorKind};

/// Which module to analyse, and why.
pub fn select<'p>(
    path: &Path,
    plans: &'p [Plan],
    rt: &Runtime,
    wanted: Option<&str>,
) -> Result<Option<(&'p Plan, String)>, CaptureError> {
    let executed = |p: &Plan| rt.executions_of(&p.module).count();
    let last_exec = |p: &Plan| rt.executions_of(&p.module).last().map(|e| e.start_ps);
    if let Some(w) = wanted {
        let exact = plans.iter().find(|p| p.module == w);
        let (bare, _) = split_program_id(w);
        let found = exact.or_else(|| {
            plans
                .iter()
                .filter(|p| p.hlo_name == bare)
                .max_by_key(|p| (last_exec(p), p.total_peak_bytes))
        });
        return match found {
            Some(p) => Ok(Some((p, "chosen with --module".to_string()))),
            None => {
                let mut names: Vec<&str> = plans.iter().map(|p| p.module.as_str()).collect();
                names.truncate(20);
                Err(CaptureError::new(
                    path,
                    ErrorKind::Unsupported,
                    None,
                    format!(
                        "no module named {w} in this capture; it has: {}",
                        names.join(", ")
                    ),
                    "pass one of these names to --module (`jit_train_step(36)` or `jit_train_step`)",
                ))
            }
        };
    }
    // The module whose last execution launched nothing (an OOM inside the step), latest first.
    let stalled = plans
        .iter()
        .filter(|p| {
            rt.executions_of(&p.module)
                .last()
                .is_some_and(|e| e.kernels == Some(0))
        })
        .max_by_key(|p| last_exec(p));
    if let Some(p) = stalled {
        let why = if rt.retries.is_empty() {
            "its last execution launched no kernel"
        } else {
            "its last execution launched no kernel (allocator retries in the capture)"
        };
        return Ok(Some((p, why.into())));
    }
    if let Some(p) = plans
        .iter()
        .filter(|p| executed(p) > 0)
        .max_by_key(|p| (p.total_peak_bytes, executed(p)))
    {
        return Ok(Some((
            p,
            format!(
                "the largest plan among the modules executed in the capture ({} execution(s))",
                executed(p)
            ),
        )));
    }
    Ok(plans.iter().max_by_key(|p| p.total_peak_bytes).map(|p| {
        (
            p,
            "the largest plan (no execution of any module was recorded)".to_string(),
        )
    }))
}
