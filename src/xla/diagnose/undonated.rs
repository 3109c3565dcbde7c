//! JX005: no parameter donated although a state pytree goes in and a same-shaped one comes out.

use super::{CONFIRM, Context, arg_root, argnum_set, argnums_tuple, bounded, pct, saves};
use crate::findings::{
    self, Code, Evidence, Finding, Fix, FixKind, Label, Refine, Severity, fmt_bytes, fmt_range,
};

/// JX005: no parameter donated although a state pytree goes in and a same-shaped one comes out.
pub(super) fn jx005_no_donation(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let est = p.donation.as_ref()?;
    if p.non_aliased_output_bytes == 0 || est.args.is_empty() {
        return None;
    }
    let (lo, hi) = est.range(p.heap_peak_bytes);
    if hi < (1 << 20) || pct(hi, p.total_peak_bytes) < 10.0 {
        return None;
    }
    let roots: Vec<&str> = {
        let mut r: Vec<&str> = Vec::new();
        for prm in &p.parameters {
            let root = arg_root(&prm.op_name);
            if !r.contains(&root) {
                r.push(root);
            }
        }
        r
    };
    // The position of each argument: in the op name for `args[0]`, else its place among the
    // plan's parameter roots (the locate step corrects it from the function's signature). The
    // arguments donated already stay in the tuple.
    let position = |root: &str| -> (Option<String>, u32) {
        match root.strip_prefix("args") {
            Some(_) => (
                None,
                p.parameters
                    .iter()
                    .find(|x| arg_root(&x.op_name) == root)
                    .and_then(|x| {
                        x.op_name
                            .strip_prefix("args[")
                            .and_then(|r| r.split(']').next())
                            .and_then(|n| n.parse().ok())
                    })
                    .unwrap_or(0),
            ),
            None => (
                Some(root.to_string()),
                roots.iter().position(|r| *r == root).unwrap_or(0) as u32,
            ),
        }
    };
    let candidates: Vec<(Option<String>, u32)> = est
        .donated_args
        .iter()
        .map(|r| r.as_str())
        .chain(est.args.iter().map(|a| a.0.as_str()))
        .map(position)
        .collect();
    let argnums = argnum_set(&candidates);
    let names: Vec<String> = est
        .args
        .iter()
        .map(|a| format!("{} ({})", a.0, fmt_bytes(a.1)))
        .collect();
    let tuple = argnums_tuple(&argnums);
    let saving = if findings::saving_range_says(lo, hi) {
        format!("saves {} of the peak", fmt_range(lo, hi))
    } else {
        format!("saves up to {} of the peak", fmt_bytes(hi))
    };
    let loc = ctx.call_site.clone();
    let (what, aliased) = if est.donated_args.is_empty() {
        (
            "no parameter is donated".to_string(),
            format!(
                "input_output_alias is empty; parameters {} + outputs {} are separate allocations",
                fmt_bytes(p.parameter_bytes),
                fmt_bytes(p.output_bytes)
            ),
        )
    } else {
        (
            format!(
                "{} donated, {} not",
                est.donated_args.join(", "),
                est.args
                    .iter()
                    .map(|a| a.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "{} input_output_alias entries ({} donated); outputs not aliased with parameters: {}",
                p.alias_count,
                fmt_bytes(p.donated_bytes),
                fmt_bytes(p.non_aliased_output_bytes)
            ),
        )
    };
    let mut f = Finding::new(Code::JX005,
        Severity::Warning,
        format!(
            "{what}: {} {} in and same-shaped outputs ({}) are written to new buffers; donate_argnums=({tuple}) {saving}, less than the outputs' bytes: the temporaries XLA placed in them then need the heap",
            names.join(", "),
            if names.len() == 1 { "comes" } else { "come" },
            fmt_bytes(est.output_bytes),
        ),
    )
    .at(loc.clone(), loc.iter().cloned().collect::<Vec<_>>())
    .bytes(lo, Some(pct(lo, p.total_peak_bytes)), Label::Inferred)
    .evidence(Evidence::read(aliased))
    .evidence(Evidence::inferred(format!(
        "{} parameter(s) have an output of the same shape and dtype: donated, those outputs ({}) are written into the parameters' buffers{}",
        est.params,
        fmt_bytes(est.output_bytes),
        if est.lent_buffers > 0 {
            format!(
                "; the buffer assignment places {} temporaries ({} in all: activations, gradients) in their output allocations before the outputs are written",
                est.lent_buffers,
                fmt_bytes(est.lent_bytes)
            )
        } else {
            String::new()
        }
    )));
    f = f.evidence(Evidence::inferred(format!(
        "with donation they need the heap: {} of them live at once under the {} (liveness), {} with the heap's own buffers{}; saving = {} of outputs − that growth of the heap ({} → {})",
        fmt_bytes(est.lent_peak),
        if est.scheduled { "compiled schedule" } else { "entry computation's order" },
        fmt_bytes(est.moved_peak),
        if est.copies > 0 {
            format!(
                " and the copies XLA makes of {} parameter(s) ({}) still read after their update may be written",
                est.copies,
                fmt_bytes(est.copy_bytes)
            )
        } else {
            String::new()
        },
        fmt_bytes(est.output_bytes),
        fmt_bytes(p.heap_peak_bytes),
        fmt_range(
            est.lent_peak.max(p.heap_peak_bytes),
            est.moved_peak.max(p.heap_peak_bytes)
        ),
    )));
    f.refine = Some(Refine::JitLine {
        function: p
            .hlo_name
            .strip_prefix("jit_")
            .unwrap_or(&p.hlo_name)
            .to_string(),
    });
    let fix = Fix::new(
        format!(
            "add donate_argnums=({tuple}) to jax.jit{}",
            saves(": ", ctx, lo, hi)
        ),
        FixKind::DonateArgnums {
            argnums,
            args: candidates,
        },
    )
    .cost(format!(
        "the donated arrays are invalid after the call (rebind them to the outputs); {CONFIRM}"
    ))
    .preferred();
    f = f.fix(bounded(fix, lo, hi));
    Some(f)
}
