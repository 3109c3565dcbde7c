//! JX008 (XLA already rematerialized) and JX009 (the top buffers at the peak, attribution hints).

use super::{Context, bounded, located, pct, saves};
use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};

/// JX008: XLA already rematerialized.
pub(super) fn jx008_xla_remat(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let mut out: Option<Finding> = None;
    // JX008: XLA already rematerialized.
    if p.xla_remat_instructions > 0 {
        let f = Finding::new(Code::JX008,
            Severity::Information,
            format!(
                "XLA already rematerialized {} instructions to fit: expect the fix from the program, not from XLA",
                p.xla_remat_instructions
            ),
        )
        .evidence(Evidence::read(format!(
            "{} instructions named `*.remat*` in the compiled module",
            p.xla_remat_instructions
        )));
        out = Some(f);
    }

    out
}

/// JX009: the top buffers at the peak, as attribution hints.
pub(super) fn jx009_top_buffers(ctx: &Context) -> Vec<Finding> {
    let p = ctx.plan;
    let heap = p.heap_peak_bytes;
    let mut out = Vec::new();
    // JX009: the top buffers at the peak, as attribution hints.
    for b in p.at_peak.iter().filter(|b| b.line().is_some()).take(3) {
        let (loc, stack) = located(ctx, b);
        let (base, share) = if b.heap {
            ("heap peak", pct(b.size, heap))
        } else {
            ("peak", pct(b.size, p.total_peak_bytes))
        };
        let mut f = Finding::new(
            Code::JX009,
            Severity::Hint,
            format!(
                "{} {} ({}, {}) live at the peak: {:.1}% of the {base}",
                fmt_bytes(b.size),
                crate::xla::hlo::without_layout(&b.shape),
                b.category.as_str(),
                b.role.as_str(),
                share
            ),
        )
        .at(loc, stack)
        .bytes(b.size, Some(share), Label::Read)
        .evidence(Evidence::read(format!(
            "{}: {} # {}",
            b.instruction, b.shape, b.op_name
        )))
        .evidence(Evidence::inferred(format!("role: {}", b.role.as_str())));
        // A single array taking a quarter of the step: say what shrinks it.
        if pct(b.size, p.total_peak_bytes) >= 25.0 {
            f = f.fix(if b.heap {
                // Two chunks halve the array, many chunks nearly remove it; the peak with the
                // schedule unchanged says how much of that reaches the peak.
                let lo = heap.saturating_sub(p.heap_peak_if_shrunk(&[(b, b.size / 2)]));
                let hi = heap.saturating_sub(p.heap_peak_if_shrunk(&[(b, b.size)]));
                bounded(
                    Fix::advice(format!(
                        "compute this array in chunks (jax.lax.map or a loop over slices of the batch) so only one chunk is live{}",
                        saves(": ", ctx, lo, hi)
                    ))
                    .cost("a loop in the step; same arithmetic"),
                    lo,
                    hi,
                )
            } else {
                // The output allocation goes, but the array may still be computed as a
                // temporary of the same size: the plan does not bound the saving.
                Fix::advice(
                    "return a reduced value (metrics, argmax, a norm) instead of the full array, or evaluate in chunks (the output allocation goes; whether XLA still materialises the array as a temporary, memory_analysis() tells)",
                )
                .cost("the caller no longer gets the full array")
            });
        }
        out.push(f);
    }

    out
}
