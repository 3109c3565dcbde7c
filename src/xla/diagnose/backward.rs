//! JX003: the backward pass dominates, or f32 copies of a low-precision model's parameters.

use super::forward_kept::{dims_in_order, microbatch_fix};
use super::{CONFIRM, Context, bounded, by_line, no_fit, pct, roles, saves};
use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};
use crate::xla::plan::{PeakBuffer, Role};

/// JX003: the backward pass dominates.
pub(super) fn jx003_backward_dominates(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let heap = p.heap_peak_bytes;
    let bwd = roles(p).1;
    let no_fit = no_fit(ctx);
    if let Some(f) = f32_copies(ctx) {
        return Some(f);
    }
    let mut out: Option<Finding> = None;
    // JX003: the backward pass dominates.
    if bwd > 0 && pct(bwd, heap) >= 50.0 {
        let rows = p
            .at_peak
            .iter()
            .filter(|b| b.heap && b.role == Role::Backward);
        let groups = by_line(ctx, rows);
        let (loc, stack) = groups
            .first()
            .map(|g| (g.0.clone(), g.1.clone()))
            .unwrap_or_default();
        let mut f = Finding::new(Code::JX003,
            if no_fit { Severity::Warning } else { Severity::Information },
            format!(
                "mostly backward: gradients and their temporaries hold {} ({:.1}% of the heap peak)",
                fmt_bytes(bwd),
                pct(bwd, heap)
            ),
        )
        .at(loc, stack)
        .bytes(bwd, Some(pct(bwd, heap)), Label::Inferred)
        .evidence(Evidence::inferred(
            "role from the JAX name stack (`transpose(`)",
        ))
        .fix(
            // What sharding saves depends on the number of devices, which one plan does not
            // tell: no number.
            Fix::advice(
                "shard parameters and gradients (FSDP) over the devices; check for f32 copies of bf16 gradients",
            )
            .cost("communication between the devices"),
        );
        if let Some(m) = microbatch_fix(ctx) {
            f = f.fix(m);
        }
        if p.user_remat_instructions > 0 {
            f = f.evidence(Evidence::read(format!(
                "jax.checkpoint is already applied ({} instructions in rematted_computation), yet these buffers are live together at the peak: the remat is ineffective here",
                p.user_remat_instructions
            )));
        }
        out = Some(f);
    }

    out
}

/// Element type and dimensions of `f32[16384,512]{1,0}` (dimensions sorted, so a transposed
/// copy matches).
fn dims_of(shape: &str) -> Option<(&str, Vec<u64>)> {
    let (ty, _) = shape.split_once('[')?;
    let mut dims = dims_in_order(shape);
    dims.sort_unstable();
    Some((ty.trim(), dims))
}

/// JX003, the f32-copy form: heap buffers at the peak that are f32 arrays with the dimensions of
/// a bf16/f16 parameter, made outside the backward pass — the upcast gradients or updates of a
/// low-precision model. A read fact (shapes, sizes, lines) pointing at an inferred cause.
fn f32_copies(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let heap = p.heap_peak_bytes;
    let low: Vec<(&crate::xla::plan::Param, Vec<u64>)> = p
        .parameters
        .iter()
        .filter_map(|x| {
            let (ty, dims) = dims_of(&x.shape)?;
            matches!(ty, "bf16" | "f16").then_some((x, dims))
        })
        .collect();
    if low.is_empty() {
        return None;
    }
    let twin = |b: &PeakBuffer| {
        let (ty, dims) = dims_of(&b.shape)?;
        if ty != "f32" || dims.len() < 2 || matches!(b.role, Role::Backward | Role::Forward) {
            return None;
        }
        low.iter().find(|(_, d)| *d == dims).map(|(x, _)| *x)
    };
    let rows = p
        .at_peak
        .iter()
        .filter(|b| b.heap && b.size >= (1 << 20) && twin(b).is_some());
    let groups = by_line(ctx, rows);
    let (loc, stack, rows, bytes) = groups.into_iter().next()?;
    if pct(bytes, heap) < 10.0 {
        return None;
    }
    let b = rows[0];
    let param = twin(b)?;
    let mut f = Finding::new(
        Code::JX003,
        Severity::Warning,
        format!(
            "f32 copies of bf16 arrays hold {} ({:.1}% of the heap peak): this line makes {} {}, the f32 version of {} ({})",
            fmt_bytes(bytes),
            pct(bytes, heap),
            b.instruction,
            crate::xla::hlo::without_layout(&b.shape),
            param.op_name,
            param.shape
        ),
    )
    .at(loc, stack)
    .bytes(bytes, Some(pct(bytes, heap)), Label::Inferred);
    for r in &rows {
        f = f.evidence(Evidence::read(format!(
            "{}: {} # {} — {} live at the heap peak",
            r.instruction,
            r.shape,
            r.op_name,
            fmt_bytes(r.size)
        )));
    }
    f = f
        .evidence(Evidence::read(format!(
            "parameter {} is {} ({})",
            param.op_name,
            param.shape,
            fmt_bytes(param.bytes)
        )))
        .evidence(Evidence::inferred(
            "an f32 array with a bf16 parameter's dimensions, made outside the backward pass: an upcast gradient or update (e.g. `g.astype(jnp.float32) / loss_scale`)",
        ))
        ;
    // A bf16 copy is half the f32 one: at most half of it goes; with the schedule unchanged
    // the peak drops by that unless another point of the schedule becomes the peak.
    let shrink: Vec<(&PeakBuffer, u64)> = rows.iter().map(|b| (*b, b.size / 2)).collect();
    let same = heap.saturating_sub(p.heap_peak_if_shrunk(&shrink));
    // The other f32 gradients of bf16 parameters the backward computes while the copy is live
    // (f32 matmul outputs at the peak): unscaled in bf16 too, each gets a bf16 version of half
    // its size beside it.
    let since = rows.iter().map(|b| b.live_events.start).min().unwrap_or(0);
    let beside: u64 = p
        .at_peak
        .iter()
        .filter(|b| b.heap && b.role == Role::Backward && b.live_events.start >= since)
        .filter(|b| {
            dims_of(&b.shape).is_some_and(|(ty, dims)| {
                ty == "f32" && dims.len() >= 2 && low.iter().any(|(_, d)| *d == dims)
            })
        })
        .map(|b| b.size / 2)
        .sum();
    let hi = bytes / 2;
    let lo = same.min(hi).saturating_sub(beside);
    f = f.fix(bounded(
        Fix::advice(format!(
            "keep it in bf16 (unscale in bf16) or fuse the upcast into the update, so at most one f32 copy is live{}",
            saves(": ", ctx, lo, hi)
        ))
        .cost(format!("bf16 rounding of the unscaled gradient; {CONFIRM}")),
        lo,
        hi,
    ));
    Some(f)
}
