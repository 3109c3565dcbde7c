//! Diagnosis lines JX001–JX009 from a module's plan and the runtime view (pure: no IO).
//!
//! Every number a finding quotes is labelled: plan bytes are `read` from the buffer assignment,
//! allocator and event counts are `measured`, roles, causes and savings are `inferred`.

use crate::findings::{
    self, Code, Evidence, Finding, Fix, FixKind, Label, Location, Refine, Severity, fmt_bytes,
    fmt_range,
};

use super::plan::{PeakBuffer, Plan, Role};
use super::runtime::{Execution, LiveGroup, Runtime};

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
        let s = super::hlo::without_layout(&b.shape).to_string();
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

pub use super::donation::arg_root;

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

/// JX007: allocator retries = out-of-memory inside the capture.
fn jx007_allocator_retry(ctx: &Context) -> Option<Finding> {
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
fn jx001_plan_exceeds_capacity(ctx: &Context) -> Option<Finding> {
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
fn jx006_other_live_arrays(ctx: &Context) -> Option<Finding> {
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

/// JX002: forward activations kept for the backward pass.
fn jx002_forward_kept(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let heap = p.heap_peak_bytes;
    let fwd = roles(p).0;
    let no_fit = no_fit(ctx);
    let mut out: Option<Finding> = None;
    // JX002: forward activations kept for the backward pass.
    let forward_rows = p
        .at_peak
        .iter()
        .filter(|b| b.heap && matches!(b.role, Role::Forward | Role::ScanStack | Role::Recomputed));
    let groups = by_line(ctx, forward_rows);
    if fwd > 0 && pct(fwd, heap) >= 50.0 {
        if let Some((loc, stack, rows, bytes)) = groups.first() {
            let dominant = pct(*bytes, heap) >= 50.0 && pct(heap, p.total_peak_bytes) >= 50.0;
            let sev = if no_fit || dominant {
                Severity::Warning
            } else {
                Severity::Information
            };
            let mut f = Finding::new(Code::JX002,
                sev,
                format!(
                    "mostly forward, kept for the backward pass: {} ({:.1}% of the heap peak); the largest share, {} in {} buffer(s) ({}), comes from this line{}",
                    fmt_bytes(fwd),
                    pct(fwd, heap),
                    fmt_bytes(*bytes),
                    rows.len(),
                    shapes(rows),
                    if sev == Severity::Information {
                        " (expected retention within a step, not a leak)"
                    } else {
                        ""
                    }
                ),
            )
            .at(loc.clone(), stack.clone())
            .bytes(*bytes, Some(pct(*bytes, heap)), Label::Inferred)
            .evidence(Evidence::read(format!(
                "{} buffer(s) live at the heap peak from this line: {}",
                rows.len(),
                shapes(rows)
            )))
            .evidence(Evidence::inferred(format!(
                "role from the JAX name stack (`jvp(` outside `transpose(`): {:.1}% of the heap peak is forward kept for backward",
                pct(fwd, heap)
            )));
            if p.user_remat_instructions > 0 {
                f = f.evidence(Evidence::read(format!(
                    "jax.checkpoint is already applied ({} instructions in rematted_computation), yet the peak still holds these buffers: the recomputed forwards are scheduled before the backward, so the remat is ineffective here",
                    p.user_remat_instructions
                )));
            }
            let mut layers = layers_of(rows);
            // Unrolled layers whose kept buffers do not repeat: count them from the parameters.
            if !layers.stacked && layers.count <= 1 {
                layers.count = super::layer_params::count(p).unwrap_or(1);
            }
            let (lo, hi) = remat_range(*bytes, &layers);
            let unrolled_on_cpu = ctx.cpu && !layers.stacked && layers.count > 1;
            let scan = format!(
                "{} layers, {} from this line per layer: a checkpointed scan keeps {} and recomputes one layer (at most twice its share live: its forwards and the gradients through them) during that layer's backward",
                layers.count,
                fmt_bytes(bytes.div_ceil(layers.count.max(1))),
                if layers.inputs > 0 {
                    format!(
                        "only the layer inputs ({} stacked)",
                        fmt_bytes(layers.inputs)
                    )
                } else {
                    "only the layer inputs".to_string()
                }
            );
            if p.user_remat_instructions > 0 {
                f = f.fix(bounded(
                    Fix::advice(format!(
                        "jax.checkpoint is already applied but the recomputed forwards are all live at once: scan over the layers (jax.lax.scan over a checkpointed layer) so each layer is recomputed during its own backward{}",
                        saves("; ", ctx, lo, hi)
                    ))
                    .cost(format!("restructuring the layer loop; {CONFIRM}")),
                    lo,
                    hi,
                ));
                f = f.evidence(Evidence::inferred(scan));
            } else if unrolled_on_cpu {
                f = f.evidence(Evidence::inferred(format!(
                    "the {} layers are unrolled (a Python loop, no scan): on XLA:CPU jax.checkpoint per layer does not lower this peak, the recomputed forwards of all layers are scheduled before the backward pass and are live together as the originals were; {scan}",
                    layers.count
                )));
                f = f.fix(
                    Fix::new(
                        "jax.checkpoint on the layer alone: no saving expected here — inside an unrolled Python loop XLA:CPU schedules every recomputed forward before the backward pass, so they are live together as the originals were; use the checkpointed layer in a scan (next fix)",
                        FixKind::JaxCheckpoint,
                    )
                    .cost("about one extra forward pass per step, for no memory on XLA:CPU"),
                );
                f = f.fix(
                    bounded(
                        Fix::advice(format!(
                            "scan over the layers: jax.lax.scan(jax.checkpoint(layer), x, stacked_params), so each layer is recomputed during its own backward{}",
                            saves("; ", ctx, lo, hi)
                        ))
                        .cost(format!(
                            "stack the layers' parameters; about one extra forward pass per step; {CONFIRM}"
                        )),
                        lo,
                        hi,
                    )
                    .preferred(),
                );
            } else {
                f = f.evidence(Evidence::inferred(scan));
                f = f.fix(
                    bounded(
                        Fix::new(
                            format!(
                                "wrap the {} in jax.checkpoint (remat){}",
                                if layers.stacked {
                                    "scanned layer"
                                } else {
                                    "block"
                                },
                                saves(": ", ctx, lo, hi)
                            ),
                            FixKind::JaxCheckpoint,
                        )
                        .cost(format!("about one extra forward pass per step; {CONFIRM}")),
                        lo,
                        hi,
                    )
                    .preferred(),
                );
            }
            if let Some(m) = microbatch_fix(ctx) {
                f = f.fix(m);
            }
            // (bytes, S) of the rows whose shape ends in S×S.
            let square_rows: Vec<(u64, u64)> = rows
                .iter()
                .filter_map(|b| Some((b.size, is_square_tail(&unstacked(b))?)))
                .collect();
            let square: u64 = square_rows.iter().map(|r| r.0).sum();
            if square > 0 {
                let s = square_rows.first().map_or(0, |r| r.1);
                f = f.evidence(Evidence::inferred(format!(
                    "{} of them are S×S attention matrices (S = {s}): B·H·S·S per layer",
                    fmt_bytes(square)
                )));
                // Halving S: the S×S buffers shrink 4×; the line's other buffers at most 2×.
                let (lo, hi) = (square * 3 / 4, square * 3 / 4 + (bytes - square) / 2);
                f = f.fix(bounded(
                    Fix::advice(format!(
                        "shorter sequences: halving S shrinks the S×S buffers 4×{}",
                        saves(": ", ctx, lo, hi)
                    ))
                    .cost("less context per example"),
                    lo,
                    hi,
                ));
                // Flash attention: the S×S buffers leave the plan, blocks of them stay.
                let block = square_rows.iter().map(|r| r.0).max().unwrap_or(0);
                f = f.fix(bounded(
                    Fix::advice(
                        "chunked / fused (flash) attention — only once you confirm the B·H·S·S buffers leave the plan (memory_analysis())",
                    )
                    .cost("a kernel that supports your backend"),
                    square.saturating_sub(block),
                    square,
                ));
            }
            out = Some(f);
        }
    }

    out
}

/// Dimensions of `f32[8,1024,256]{2,1,0}` in order.
fn dims_in_order(shape: &str) -> Vec<u64> {
    shape
        .split_once('[')
        .and_then(|(_, r)| r.split(']').next())
        .map(|d| d.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// A buffer's shape without the leading layer dimension a scan stacks it along.
fn unstacked(b: &PeakBuffer) -> String {
    let shape = super::hlo::without_layout(&b.shape).to_string();
    if b.role != Role::ScanStack {
        return shape;
    }
    let (ty, _) = shape.split_once('[').unwrap_or((&shape, ""));
    let dims = dims_in_order(&shape);
    let rest: Vec<String> = dims.iter().skip(1).map(|d| d.to_string()).collect();
    format!("{ty}[{}]", rest.join(","))
}

/// How a line's forward-kept buffers repeat over layers.
#[derive(Debug, PartialEq, Eq)]
struct Layers {
    /// Number of layers (1 when nothing repeats).
    count: u64,
    /// The buffers are stacked by a scan (`while` loop) along their leading dimension.
    stacked: bool,
    /// The smallest of several stacked buffers: the layer inputs a checkpointed scan keeps.
    inputs: u64,
}

/// Layers from the buffers: a scan's stack length, else how often the same value (op name and
/// shape) of an unrolled loop repeats (read shapes, inferred layers).
fn layers_of(rows: &[&PeakBuffer]) -> Layers {
    let stacked: Vec<&&PeakBuffer> = rows.iter().filter(|b| b.role == Role::ScanStack).collect();
    if !stacked.is_empty() {
        let mut lens: Vec<(u64, usize)> = Vec::new();
        for b in &stacked {
            if let Some(&l) = dims_in_order(&b.shape).first() {
                match lens.iter_mut().find(|x| x.0 == l) {
                    Some(x) => x.1 += 1,
                    None => lens.push((l, 1)),
                }
            }
        }
        let count = lens
            .iter()
            .max_by_key(|x| x.1)
            .map(|x| x.0)
            .unwrap_or(1)
            .max(1);
        let inputs = if stacked.len() >= 2 {
            stacked.iter().map(|b| b.size).min().unwrap_or(0)
        } else {
            0
        };
        return Layers {
            count,
            stacked: true,
            inputs,
        };
    }
    // (op name, shape) → (buffers, bytes of one)
    let mut kinds: Vec<((&str, String), u64, u64)> = Vec::new();
    for b in rows {
        let key = (
            b.op_name.as_str(),
            super::hlo::without_layout(&b.shape).to_string(),
        );
        match kinds.iter_mut().find(|k| k.0 == key) {
            Some(k) => k.1 += 1,
            None => kinds.push((key, 1, b.size)),
        }
    }
    // The values of a layer repeat once per layer: the most common repeat count among the large
    // values (≥ 1 MiB each; small reductions and the layer in flight in the backward differ),
    // the smaller one on a tie.
    let large: Vec<u64> = kinds
        .iter()
        .filter(|k| k.2 >= 1 << 20)
        .map(|k| k.1)
        .collect();
    let counts = if large.is_empty() {
        kinds.iter().map(|k| k.1).collect()
    } else {
        large
    };
    let mut freq: Vec<(u64, usize)> = Vec::new();
    for c in counts {
        match freq.iter_mut().find(|f| f.0 == c) {
            Some(f) => f.1 += 1,
            None => freq.push((c, 1)),
        }
    }
    let count = freq
        .iter()
        .max_by_key(|f| (f.1, std::cmp::Reverse(f.0)))
        .map(|f| f.0)
        .unwrap_or(1);
    Layers {
        count,
        stacked: false,
        inputs: 0,
    }
}

/// What checkpointing the layers (in a scan) saves of a line's `bytes` of forward-kept buffers:
/// at most all of them but the layer inputs the scan keeps; at least that less one layer's share
/// twice over (its recomputed forwards and the gradients through them, live during its backward).
fn remat_range(bytes: u64, layers: &Layers) -> (u64, u64) {
    let share = bytes.div_ceil(layers.count.max(1));
    let hi = bytes.saturating_sub(layers.inputs);
    (hi.saturating_sub(2 * share), hi)
}

/// The batch: the leading dimension most plain-array parameters (`x`, `y`, not pytree leaves)
/// share.
fn batch_rows(p: &Plan) -> Option<u64> {
    let mut lead: Vec<(u64, usize)> = Vec::new();
    for x in &p.parameters {
        if arg_root(&x.op_name) != x.op_name || x.op_name.is_empty() {
            continue;
        }
        let dims = dims_in_order(&x.shape);
        if dims.len() < 2 {
            continue;
        }
        match lead.iter_mut().find(|l| l.0 == dims[0]) {
            Some(l) => l.1 += 1,
            None => lead.push((dims[0], 1)),
        }
    }
    lead.iter().max_by_key(|l| (l.1, l.0)).map(|l| l.0)
}

/// Gradient accumulation over microbatches, bounded from the batch-sized buffers at the peak:
/// split `k` ways they shrink `k`×, and the accumulated gradients (the size of the smallest
/// pytree argument, the parameters) plus one microbatch's gradients are new.
fn microbatch_fix(ctx: &Context) -> Option<Fix> {
    let p = ctx.plan;
    let batch = batch_rows(p)?;
    let k = [8u64, 4, 2]
        .into_iter()
        .find(|k| batch % k == 0 && batch > *k)?;
    let sized: u64 = p
        .at_peak
        .iter()
        .filter(|b| b.heap && dims_in_order(&unstacked(b)).first() == Some(&batch))
        .map(|b| b.size)
        .sum();
    let mut trees: Vec<(&str, u64)> = Vec::new();
    for x in &p.parameters {
        let root = arg_root(&x.op_name);
        if root == x.op_name {
            continue;
        }
        match trees.iter_mut().find(|t| t.0 == root) {
            Some(t) => t.1 += x.bytes,
            None => trees.push((root, x.bytes)),
        }
    }
    let grads = trees.iter().map(|t| t.1).min().unwrap_or(0);
    let hi = sized / k * (k - 1);
    let lo = hi.saturating_sub(2 * grads);
    if sized == 0 {
        return None;
    }
    Some(bounded(
        Fix::advice(format!(
            "accumulate gradients over {k} microbatches of {} rows (jax.lax.scan over the microbatches): the {} of batch-sized buffers at the peak shrink {k}×, the accumulated gradients are new{}",
            batch / k,
            fmt_bytes(sized),
            saves("; ", ctx, lo, hi)
        ))
        .cost(format!("{k} sequential passes per batch")),
        lo,
        hi,
    ))
}

/// JX003: the backward pass dominates.
fn jx003_backward_dominates(ctx: &Context) -> Option<Finding> {
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
    let low: Vec<(&super::plan::Param, Vec<u64>)> = p
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
        if ty != "f32" || dims.len() < 2 || b.role == Role::Backward {
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
            super::hlo::without_layout(&b.shape),
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

/// JX008: XLA already rematerialized.
fn jx008_xla_remat(ctx: &Context) -> Option<Finding> {
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
fn jx009_top_buffers(ctx: &Context) -> Vec<Finding> {
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
                super::hlo::without_layout(&b.shape),
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
fn jx004_growth(ctx: &Context) -> Option<Finding> {
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

/// JX005: no parameter donated although a state pytree goes in and a same-shaped one comes out.
fn jx005_no_donation(ctx: &Context) -> Option<Finding> {
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
