//! Diagnosis lines JX001–JX009 from a module's plan and the runtime view (pure: no IO).
//!
//! Every number a finding quotes is labelled: plan bytes are `read` from the buffer assignment,
//! allocator and event counts are `measured`, roles, causes and savings are `inferred`.
//!
//! One file per finding family: `capacity` (JX007, JX001, JX006: the step does not fit),
//! `forward_kept` (JX002 and its checkpointing and microbatch fixes), `backward` (JX003),
//! `growing` (JX004), `undonated` (JX005), `hints` (JX008, JX009). This file holds what they share:
//! the context, culprit lines, shape summaries and the saving ranges their fixes quote.

use crate::findings::{self, Finding, Fix, Location, Refine, fmt_bytes, fmt_range};
use crate::xla::plan::{PeakBuffer, Plan};
use crate::xla::runtime::{Execution, LiveGroup, Runtime};

mod backward;
mod capacity;
mod forward_kept;
mod growing;
mod hints;
mod undonated;

pub use crate::xla::donation::arg_root;
use backward::jx003_backward_dominates;
use capacity::{jx001_plan_exceeds_capacity, jx006_other_live_arrays, jx007_allocator_retry};
use forward_kept::{dims_in_order, jx002_forward_kept};
use growing::jx004_growth;
use hints::{jx008_xla_remat, jx009_top_buffers};
use undonated::jx005_no_donation;

/// Growth evidence across executions of the module.
#[derive(Clone, Debug, Default)]
pub struct Growth {
    /// Bytes in use at each execution start (measured, BFC).
    pub starts: Vec<u64>,
    /// `$<unknown> append` (list.append) calls seen between consecutive executions.
    pub appends_per_gap: Vec<u64>,
    /// Where the appends happen: the `def` line of the user's function around them, and how the
    /// locate step finds the append itself.
    pub append_site: Option<(Location, Refine)>,
}

/// Everything a diagnosis needs about one module.
pub struct Context<'a> {
    pub plan: &'a Plan,
    pub rt: &'a Runtime,
    pub execs: Vec<&'a Execution>,
    /// Device pool size (bytes_allocated + bytes_available + bytes_reserved), measured.
    pub capacity: Option<u64>,
    /// Physical device memory (`memory_size` plane stat), read.
    pub device_memory: Option<u64>,
    /// Where the jitted function was called (the locate step moves findings from here to the
    /// `jax.jit(...)` line that compiled it).
    pub call_site: Option<Location>,
    pub growth: Growth,
    /// Live buffers at the last execution start, by allocating host event.
    pub live_at_last: Vec<LiveGroup>,
    /// Chooses the culprit frame of a buffer's stack.
    pub pick: &'a dyn Fn(&[Location]) -> Option<usize>,
    /// The capture is of the XLA:CPU client (`cpu_version` and no `gpu_version`, read).
    pub cpu: bool,
}

const CONFIRM: &str =
    "confirm before/after with jax.jit(f).lower(*args).compile().memory_analysis()";

/// `part` as a percentage of `whole` (0 when `whole` is 0).
pub fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Culprit location and stack (innermost first) of a buffer: the frame `pick` chooses (the
/// first user frame), else the line xprof shows.
pub fn culprit(
    b: &PeakBuffer,
    pick: &dyn Fn(&[Location]) -> Option<usize>,
) -> (Option<Location>, Vec<Location>) {
    let stack: Vec<Location> = b.frames().iter().map(|f| f.location()).collect();
    if stack.is_empty() {
        return (b.line().map(|f| f.location()), stack);
    }
    let i = pick(&stack).unwrap_or(0);
    (Some(stack[i].clone()), stack)
}

fn located(ctx: &Context, b: &PeakBuffer) -> (Option<Location>, Vec<Location>) {
    culprit(b, ctx.pick)
}

/// Buffers of one culprit line: (location, stack, buffers, bytes).
type LineGroup<'a> = (Option<Location>, Vec<Location>, Vec<&'a PeakBuffer>, u64);

/// Buffers of one role at the heap peak, grouped by culprit line, largest first.
fn by_line<'a>(ctx: &Context, rows: impl Iterator<Item = &'a PeakBuffer>) -> Vec<LineGroup<'a>> {
    let mut out: Vec<LineGroup<'a>> = Vec::new();
    for b in rows {
        let (loc, stack) = located(ctx, b);
        match out.iter_mut().find(|g| g.0 == loc) {
            Some(g) => {
                g.2.push(b);
                g.3 += b.size;
            }
            None => out.push((loc, stack, vec![b], b.size)),
        }
    }
    out.sort_by_key(|g| std::cmp::Reverse(g.3));
    out
}

/// `f32[1,4,2048,2048] ×17` style summary of buffer shapes.
fn shapes(rows: &[&PeakBuffer]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for b in rows {
        let s = crate::xla::hlo::without_layout(&b.shape).to_string();
        match counts.iter_mut().find(|c| c.0 == s) {
            Some(c) => c.1 += 1,
            None => counts.push((s, 1)),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    counts
        .iter()
        .take(3)
        .map(|(s, n)| format!("{s} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Square trailing dimensions ≥ 512 after at least one more (`[…, H, S, S]`): an attention
/// score / probability matrix (a `[rows, features]` matrix that happens to be square is not).
fn is_square_tail(shape: &str) -> Option<u64> {
    let dims = dims_in_order(shape);
    let n = dims.len();
    (n >= 3 && dims[n - 1] == dims[n - 2] && dims[n - 1] >= 512).then(|| dims[n - 1])
}

/// All diagnosis lines for the module, most severe first.
pub fn diagnose(ctx: &Context) -> Vec<Finding> {
    let mut out: Vec<Finding> = [
        jx007_allocator_retry(ctx),
        jx001_plan_exceeds_capacity(ctx),
        jx006_other_live_arrays(ctx),
        jx004_growth(ctx),
        jx005_no_donation(ctx),
        jx002_forward_kept(ctx),
        jx003_backward_dominates(ctx),
        jx008_xla_remat(ctx),
        super::eval_outputs::jx010_eval_outputs(ctx.plan, ctx.pick),
    ]
    .into_iter()
    .flatten()
    .collect();
    out.extend(jx009_top_buffers(ctx));
    let scope = Some(ctx.plan.module.clone());
    for f in &mut out {
        f.scope = scope.clone();
    }
    findings::sort(&mut out);
    out
}

/// Heap-peak bytes per role: (forward, backward, workspace, other).
fn roles(p: &Plan) -> (u64, u64, u64, u64) {
    let role = |k: &str| p.roles.get(k).copied().unwrap_or(0);
    (
        role("forward"),
        role("backward"),
        role("workspace"),
        role("other"),
    )
}

/// The plan alone does not fit the measured pool.
fn no_fit(ctx: &Context) -> bool {
    ctx.capacity.is_some_and(|c| ctx.plan.total_peak_bytes > c)
}

/// The sorted, distinct positions of donation candidates.
pub fn argnum_set(candidates: &[(Option<String>, u32)]) -> Vec<u32> {
    let mut argnums: Vec<u32> = candidates.iter().map(|c| c.1).collect();
    argnums.sort_unstable();
    argnums.dedup();
    argnums
}

/// `0, 1` / `0,` as written inside `donate_argnums=(…)`.
pub fn argnums_tuple(argnums: &[u32]) -> String {
    let tuple = argnums
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if argnums.len() == 1 {
        format!("{tuple},")
    } else {
        tuple
    }
}

/// A fix's saving bounded to `[lo, hi]` (inferred). A range wider than half its upper end says
/// too little: the fix then carries no number at all.
fn bounded(fix: Fix, lo: u64, hi: u64) -> Fix {
    if findings::saving_range_says(lo, hi) {
        fix.saving_range(lo, hi)
    } else {
        fix
    }
}

/// `: saves 12.25–22.77 MiB; fits: …` after a fix title when `[lo, hi]` says something, else
/// nothing (the fix then carries no number, see [`bounded`]).
fn saves(sep: &str, ctx: &Context, lo: u64, hi: u64) -> String {
    if findings::saving_range_says(lo, hi) {
        format!(
            "{sep}saves {}{}",
            fmt_range(lo, hi),
            fit_note_range(ctx, lo, hi)
        )
    } else {
        String::new()
    }
}

/// Whether the plan fits the measured capacity after a saving between `lo` and `hi`.
fn fit_note_range(ctx: &Context, lo: u64, hi: u64) -> String {
    match ctx.capacity {
        Some(cap) => {
            let best = ctx.plan.total_peak_bytes.saturating_sub(hi);
            let worst = ctx.plan.total_peak_bytes.saturating_sub(lo);
            if best > cap {
                format!(
                    "; still does not fit: at least {} > capacity {}",
                    fmt_bytes(best),
                    fmt_bytes(cap)
                )
            } else if worst <= cap {
                format!(
                    "; fits: at most {} ≤ capacity {}",
                    fmt_bytes(worst),
                    fmt_bytes(cap)
                )
            } else {
                format!(
                    "; may fit: {} against capacity {}",
                    fmt_range(best, worst),
                    fmt_bytes(cap)
                )
            }
        }
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_roots_and_square_tails() {
        assert_eq!(arg_root("opt_state['m'][2]['w']"), "opt_state");
        assert_eq!(arg_root("params[1]['w']"), "params");
        assert_eq!(arg_root("x"), "x");
        assert_eq!(is_square_tail("f32[1,4,2048,2048]{3,2,1,0}"), Some(2048));
        assert_eq!(is_square_tail("f32[8,4,256,256]"), None);
        assert_eq!(is_square_tail("f32[2048,1024]"), None);
    }
}
