//! JX007, JX001, JX006: the step does not fit its device (an allocator retry, a plan larger than
//! the pool, other live arrays taking the room).

use super::{CONFIRM, Context, no_fit, pct, roles};
use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};

/// JX007: allocator retries = out-of-memory inside the capture.
pub(super) fn jx007_allocator_retry(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let mut out: Option<Finding> = None;
    // JX007: allocator retries = out-of-memory inside the capture.
    if !ctx.rt.retries.is_empty() {
        let longest = ctx
            .rt
            .retries
            .iter()
            .map(|r| r.duration_ps)
            .max()
            .unwrap_or(0);
        let last = ctx.execs.last();
        let none = last.is_some_and(|e| e.kernels == Some(0));
        let mut f = Finding::new(Code::JX007,
            Severity::Error,
            format!(
                "AllocatorRetry waited {} time(s), longest {:.1} s{}: the allocator ran out of memory inside the capture",
                ctx.rt.retries.len(),
                longest as f64 / 1e12,
                if none {
                    format!(", and the last execution of {} launched none", p.module)
                } else {
                    String::new()
                }
            ),
        )
        .evidence(Evidence::measured(format!(
            "{} AllocatorRetry::AllocateRaw event(s), longest {:.3} s",
            ctx.rt.retries.len(),
            longest as f64 / 1e12
        )));
        if none {
            f = f.evidence(Evidence::measured(format!(
                "the last execution of {} launched no kernel",
                p.module
            )));
        }
        if let Some(last) = last.filter(|_| !p.temp_allocations.is_empty()) {
            f = f.evidence(match ctx.rt.temp_allocation(last, &p.temp_allocations) {
                Some(_) => Evidence::inferred(format!(
                    "the temporary block ({}) was allocated in the last execution: the failed request is one of its outputs",
                    fmt_bytes(p.temp_bytes)
                )),
                None => Evidence::inferred(format!(
                    "no allocation of the temporary block ({}) in the last execution: it is the request that failed",
                    fmt_bytes(p.temp_bytes)
                )),
            });
        }
        out = Some(f);
    }

    out
}

/// JX001: the plan alone exceeds the pool.
pub(super) fn jx001_plan_exceeds_capacity(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let heap = p.heap_peak_bytes;
    let (fwd, bwd, ws, other) = roles(p);
    let no_fit = no_fit(ctx);
    let mut out: Option<Finding> = None;
    // JX001: the plan alone exceeds the pool.
    if let (true, Some(cap)) = (no_fit, ctx.capacity) {
        let mut f = Finding::new(Code::JX001,
            Severity::Error,
            format!(
                "the step itself doesn't fit: {} needs {} > capacity {}",
                p.module,
                fmt_bytes(p.total_peak_bytes),
                fmt_bytes(cap)
            ),
        )
        .bytes(p.total_peak_bytes, None, Label::Read)
        .evidence(Evidence::read(format!(
            "plan: parameters {} + outputs not aliased {} + heap peak {} (total {})",
            fmt_bytes(p.parameter_bytes),
            fmt_bytes(p.non_aliased_output_bytes),
            fmt_bytes(heap),
            fmt_bytes(p.total_peak_bytes)
        )))
        .evidence(Evidence::measured(format!(
            "device pool capacity {} (bytes_allocated + bytes_available + bytes_reserved)",
            fmt_bytes(cap)
        )))
        .evidence(Evidence::inferred(format!(
            "heap peak by role: forward kept for backward {} ({:.1}%), backward {} ({:.1}%), workspace {} ({:.1}%), other {} ({:.1}%)",
            fmt_bytes(fwd), pct(fwd, heap), fmt_bytes(bwd), pct(bwd, heap),
            fmt_bytes(ws), pct(ws, heap), fmt_bytes(other), pct(other, heap)
        )));
        if let Some(mem) = ctx.device_memory {
            let need = p.total_peak_bytes as f64 * 1.05;
            if need < mem as f64 * 0.95 && cap < mem {
                let frac = ((need / mem as f64) * 100.0).ceil() / 100.0 + 0.05;
                f = f.fix(
                    Fix::advice(format!(
                        "raise XLA_PYTHON_CLIENT_MEM_FRACTION to {:.2} (the GPU has {}; the pool is {})",
                        frac.min(0.95),
                        fmt_bytes(mem),
                        fmt_bytes(cap)
                    ))
                    .saving(0)
                    .cost("less memory for other processes on the GPU; the capture does not record the env var"),
                );
            }
        }
        f = f.fix(Fix::advice(format!(
            "follow the largest role at the peak (see the other diagnosis lines); {CONFIRM}"
        )));
        out = Some(f);
    }

    out
}

/// JX006: other live arrays take the room the step needs.
pub(super) fn jx006_other_live_arrays(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let no_fit = no_fit(ctx);
    let mut out: Option<Finding> = None;
    // JX006: other live arrays take the room the step needs.
    if let (Some(cap), Some(last)) = (ctx.capacity, ctx.execs.last()) {
        if let Some(in_use) = last.bytes_in_use_at_start {
            let step_new = p.total_peak_bytes.saturating_sub(p.parameter_bytes);
            let others = in_use.saturating_sub(p.parameter_bytes);
            if in_use.saturating_add(step_new) > cap && others > 0 && !no_fit {
                let largest = ctx.live_at_last.first();
                let mut f = Finding::new(Code::JX006,
                    Severity::Warning,
                    format!(
                        "other live arrays take the room: {} was in use when {} started, the step needs {} more than its parameters, capacity {}{}",
                        fmt_bytes(in_use),
                        p.module,
                        fmt_bytes(step_new),
                        fmt_bytes(cap),
                        largest
                            .map(|g| format!("; the largest ({}) came from {}", fmt_bytes(g.bytes), g.label))
                            .unwrap_or_default()
                    ),
                )
                .bytes(others, Some(pct(others, cap)), Label::Measured)
                .evidence(Evidence::measured(format!(
                    "bytes in use at the last execution start: {}",
                    fmt_bytes(in_use)
                )));
                for g in ctx.live_at_last.iter().take(5) {
                    f = f.evidence(Evidence::measured(format!(
                        "{} in {} buffer(s): {}",
                        fmt_bytes(g.bytes),
                        g.count,
                        g.label
                    )));
                }
                f = f.fix(
                    Fix::advice(
                        "keep datasets / eval copies on the host and stream them, delete arrays you no longer need, or use a smaller dtype",
                    )
                    .saving(others)
                    .cost("host-to-device copies per step"),
                );
                if ctx
                    .live_at_last
                    .iter()
                    .any(|g| g.label.starts_with("allocated before"))
                {
                    f = f.evidence(Evidence::inferred(
                        "buffers allocated before the capture started have no name here: start the profiler earlier to see which host event made them",
                    ));
                }
                out = Some(f);
            }
        }
    }

    out
}
