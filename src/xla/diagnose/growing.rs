//! JX004: memory in use grows from one execution of the module to the next.

use super::Context;
use crate::findings::{Code, Evidence, Finding, Fix, FixKind, Label, Severity, fmt_bytes};

/// `a → b → c`, shortened to the first four and last two values for long runs.
fn series(v: &[u64]) -> String {
    let f = |x: &[u64]| {
        x.iter()
            .map(|b| fmt_bytes(*b))
            .collect::<Vec<_>>()
            .join(" → ")
    };
    if v.len() <= 8 {
        f(v)
    } else {
        format!(
            "{} → … → {} ({} executions)",
            f(&v[..4]),
            f(&v[v.len() - 2..]),
            v.len()
        )
    }
}

/// Per-gap counts, shortened for long runs.
fn counts(v: &[u64]) -> String {
    if v.len() <= 12 {
        format!("{v:?}")
    } else {
        format!(
            "{:?} … ({} gaps, {} with an append)",
            &v[..8],
            v.len(),
            v.iter().filter(|&&n| n > 0).count()
        )
    }
}

/// JX004: growth per execution.
pub(super) fn jx004_growth(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let g = &ctx.growth;
    // Measured: bytes in use at execution starts grow steadily (BFC captures).
    if g.starts.len() >= 3 && g.starts.windows(2).all(|w| w[1] > w[0]) {
        let first = g.starts[0];
        let last = *g.starts.last()?;
        let per = (last - first) / (g.starts.len() as u64 - 1);
        // Allocator bookkeeping grows by bytes; a leak worth a line grows by arrays.
        if per < (1 << 20) {
            return None;
        }
        let ratio = if p.non_aliased_output_bytes > 0 {
            per as f64 / p.non_aliased_output_bytes as f64
        } else {
            0.0
        };
        let mut f = Finding::new(Code::JX004,
            Severity::Warning,
            format!(
                "memory in use grows by {} per execution of {} ({:.2}x the non-aliased outputs): the program keeps each step's outputs alive, a leak across steps",
                fmt_bytes(per),
                p.module,
                ratio
            ),
        )
        .at(
            g.append_site.as_ref().map(|a| a.0.clone()),
            g.append_site.iter().map(|a| a.0.clone()).collect::<Vec<_>>(),
        )
        .bytes(per, None, Label::Measured)
        .evidence(Evidence::measured(format!(
            "bytes in use at execution starts: {}",
            series(&g.starts)
        )))
        .evidence(Evidence::read(format!(
            "non-aliased outputs of the plan: {}",
            fmt_bytes(p.non_aliased_output_bytes)
        )));
        if g.appends_per_gap.iter().any(|&n| n > 0) {
            f = f.evidence(Evidence::measured(format!(
                "list.append ($<unknown> append) between executions: {}",
                counts(&g.appends_per_gap)
            )));
        }
        f = f.fix(
            Fix::new(
                "append jax.device_get(x) (a host copy), or reduce inside the step (a norm, not the whole tree), or drop the reference",
                FixKind::DeviceGetAppend,
            )
            .saving(per)
            .cost("a device-to-host copy per step (device_get)")
            .preferred(),
        );
        f = f.fix(Fix::advice(
            "a larger pool only delays the OOM by a few steps",
        ));
        f.refine = g.append_site.as_ref().map(|a| a.1.clone());
        return Some(f);
    }
    // Inferred: no allocator events (CPU), but list.append runs after every execution.
    let gaps = g.appends_per_gap.len();
    if gaps >= 2 && g.appends_per_gap.iter().all(|&n| n > 0) && ctx.rt.main().is_none() {
        let per = p.non_aliased_output_bytes;
        let mut f = Finding::new(Code::JX004,
            Severity::Warning,
            format!(
                "list.append runs after every execution of {} ({} of {} executions): if it keeps the step's outputs, memory grows by up to {} per execution (the non-aliased outputs)",
                p.module,
                gaps,
                ctx.execs.len(),
                fmt_bytes(per)
            ),
        )
        .at(
            g.append_site.as_ref().map(|a| a.0.clone()),
            g.append_site.iter().map(|a| a.0.clone()).collect::<Vec<_>>(),
        )
        .bytes(per, None, Label::Inferred)
        .evidence(Evidence::measured(format!(
            "$<unknown> append events after each execution: {}",
            counts(&g.appends_per_gap)
        )))
        .evidence(Evidence::read(format!(
            "non-aliased outputs of the plan: {} per execution",
            fmt_bytes(per)
        )))
        .evidence(Evidence::inferred(
            "this capture has no allocator events (CPU client), so the growth itself is not measured; compare jax.profiler.save_device_memory_profile() before and after the loop",
        ))
        .fix(
            Fix::new(
                "append jax.device_get(x) (a host copy) or a reduced value instead of the device arrays",
                FixKind::DeviceGetAppend,
            )
            .saving(per.saturating_mul(gaps as u64))
            .cost("a device-to-host copy per step")
            .preferred(),
        );
        f.refine = g.append_site.as_ref().map(|a| a.1.clone());
        return Some(f);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_series_are_shortened() {
        assert_eq!(series(&[1 << 20, 2 << 20]), "1.00 MiB → 2.00 MiB");
        let long: Vec<u64> = (1..=10).map(|i| i << 20).collect();
        assert_eq!(
            series(&long),
            "1.00 MiB → 2.00 MiB → 3.00 MiB → 4.00 MiB → … → 9.00 MiB → 10.00 MiB (10 executions)"
        );
    }
}
