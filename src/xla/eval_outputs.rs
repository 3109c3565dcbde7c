//! JX010: an evaluation function that returns a large per-row matrix (probabilities, logits) next
//! to the metric it already reduced inside `jit`.
//!
//! The shape this reads from the compiled plan (pure: no IO):
//! - the module has no backward pass (no buffer of the plan is a forward value kept for a
//!   backward, a backward value or a recomputed one): an evaluation or inference function;
//! - among its outputs, one non-aliased matrix (≥ 2 dimensions) is a large share of the module's
//!   peak, and another output is a reduction (a scalar or a vector: the accuracy, the loss) — the
//!   function reduces the matrix itself and still hands the whole matrix back, where the caller
//!   only reduces it further (argmax, top-k, a metric).
//!
//! A function whose only output is the matrix (a matmul or conv benchmark, a model's forward)
//! is left alone: its result is the point. Plan bytes are read; the saving is a bound, inferred.

use crate::findings::{Code, Evidence, Finding, Fix, Location, Severity, fmt_bytes};

use super::plan::{Category, PeakBuffer, Plan, Role};

/// Chooses the culprit frame of a buffer's stack (the first user frame).
pub type Pick<'a> = &'a dyn Fn(&[Location]) -> Option<usize>;

/// Culprit location and stack (innermost first) of a buffer: the frame `pick` chooses, else the
/// line xprof shows.
fn culprit(b: &PeakBuffer, pick: Pick) -> (Option<Location>, Vec<Location>) {
    let stack: Vec<Location> = b.frames().iter().map(|f| f.location()).collect();
    if stack.is_empty() {
        return (b.line().map(|f| f.location()), stack);
    }
    let i = pick(&stack).unwrap_or(0);
    (Some(stack[i].clone()), stack)
}

/// The returned matrix must be at least this share of the module's total peak (percent)…
const MIN_SHARE_PERCENT: u64 = 20;
/// …and at least this large.
const MIN_BYTES: u64 = 8 << 20;

/// Dimensions of `f32[8192,4096]{1,0}`; `[]` for a scalar, `None` for a tuple or no shape.
fn dims(shape: &str) -> Option<Vec<u64>> {
    let shape = super::hlo::without_layout(shape);
    let shape = shape.trim();
    if shape.starts_with('(') {
        return None;
    }
    let (_, rest) = shape.split_once('[')?;
    let inner = rest.split(']').next()?;
    Some(
        inner
            .split(',')
            .filter_map(|x| x.trim().parse().ok())
            .collect(),
    )
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// JX010: an eval function returns a large matrix beside a value it reduced from it.
pub fn jx010_eval_outputs(p: &Plan, pick: Pick) -> Option<Finding> {
    let trains = p.at_peak.iter().any(|b| {
        matches!(
            b.role,
            Role::Forward | Role::Backward | Role::Recomputed | Role::ScanStack
        )
    }) || p.user_remat_instructions > 0
        || p.roles.get("forward").is_some_and(|b| *b > 0)
        || p.roles.get("backward").is_some_and(|b| *b > 0);
    if trains {
        return None;
    }
    // A reduced output beside the matrix: a scalar or a vector.
    let reduced = p
        .output_shapes
        .iter()
        .filter_map(|s| dims(s))
        .filter(|d| d.len() <= 1)
        .count();
    if reduced == 0 || p.output_shapes.len() < 2 {
        return None;
    }
    let out: &PeakBuffer = p
        .at_peak
        .iter()
        .filter(|b| b.category == Category::Output && !b.heap)
        .filter(|b| dims(&b.shape).is_some_and(|d| d.len() >= 2))
        .max_by_key(|b| b.size)?;
    if out.size < MIN_BYTES
        || out.size.saturating_mul(100) < p.total_peak_bytes.saturating_mul(MIN_SHARE_PERCENT)
        || p.non_aliased_output_bytes < out.size
    {
        return None;
    }
    let shape = super::hlo::without_layout(&out.shape);
    let rows = dims(&out.shape)
        .and_then(|d| d.first().copied())
        .unwrap_or(1);
    // The same matrix computed inside (the logits the softmax / argmax read).
    let twin: Option<&PeakBuffer> = p
        .at_peak
        .iter()
        .filter(|b| b.heap && super::hlo::without_layout(&b.shape) == shape)
        .max_by_key(|b| b.size);
    let (loc, stack) = culprit(out, pick);
    let twin_loc: Option<Location> = twin.and_then(|b| culprit(b, pick).0);
    let held = out.size + twin.map_or(0, |b| b.size);
    let mut f = Finding::new(
        Code::JX010,
        Severity::Warning,
        format!(
            "the function returns {} {shape} beside a value it reduces inside jit: {} of its \
             {} peak{}",
            fmt_bytes(out.size),
            pct_text(share(out.size, p.total_peak_bytes)),
            fmt_bytes(p.total_peak_bytes),
            match (&twin, &twin_loc) {
                (Some(t), Some(l)) => format!(
                    "; with the {} {shape} it is computed from (line {}) {} of it",
                    fmt_bytes(t.size),
                    l.line,
                    pct_text(share(held, p.total_peak_bytes)),
                ),
                _ => String::new(),
            }
        ),
    )
    .at(loc, stack)
    .bytes(
        out.size,
        Some(share(out.size, p.total_peak_bytes)),
        crate::findings::Label::Read,
    )
    .evidence(Evidence::read(format!(
        "output {} {shape} ({}), not aliased with a parameter: new device memory on every call \
         that stays until the caller drops it",
        out.instruction,
        fmt_bytes(out.size),
    )))
    .evidence(Evidence::read(format!(
        "the module's outputs: {}; {} of them a scalar or vector (a value already reduced inside \
         jit: a metric, a loss)",
        p.output_shapes.join(", "),
        reduced,
    )))
    .evidence(Evidence::inferred(
        "no buffer of the plan belongs to a backward pass: an evaluation or inference function",
    ));
    if let Some(t) = twin {
        f = f.evidence(Evidence::read(format!(
            "{} {shape} temporary ({}) live at the heap peak: the matrix the output is computed \
             from",
            t.instruction,
            fmt_bytes(t.size),
        )));
    }
    // Returning an argmax instead: the matrix leaves the outputs, a row vector comes back.
    let small = rows.saturating_mul(4).min(out.size);
    f = f.fix(
        Fix::advice(format!(
            "Return only what the caller uses, reduced inside jit (`jnp.argmax(logits, -1)`, \
             top-k, the loss or the metric) instead of the {shape} matrix: at most {} less per \
             call",
            fmt_bytes(out.size)
        ))
        .saving_range(out.size - small, out.size)
        .preferred(),
    );
    if let Some(t) = twin {
        f = f.fix(Fix::advice(format!(
            "Evaluate in chunks of rows (a Python loop over row blocks, or `jax.lax.map` over \
             them) and reduce each chunk: with k chunks the {} {shape} temporary becomes 1/k of it",
            fmt_bytes(t.size)
        )));
    }
    Some(f)
}

fn pct_text(p: f64) -> String {
    format!("{p:.1}%")
}

#[cfg(test)]
mod tests {
    use super::dims;

    #[test]
    fn shapes_give_their_dimensions_and_tuples_none() {
        assert_eq!(dims("f32[8192,4096]{1,0}"), Some(vec![8192, 4096]));
        assert_eq!(dims("f32[]"), Some(vec![]));
        assert_eq!(dims("s32[8192]"), Some(vec![8192]));
        assert_eq!(dims("(f32[8192,4096], f32[])"), None);
    }
}
