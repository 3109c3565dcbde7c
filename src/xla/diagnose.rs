//! Diagnosis lines JX001–JX009 from a module's plan and the runtime view (pure: no IO).
//!
//! Every number a finding quotes is labelled: plan bytes are `read` from the buffer assignment,
//! allocator and event counts are `measured`, roles, causes and savings are `inferred`.

use crate::findings::{
    self, Code, Evidence, Finding, Fix, FixKind, Location, Refine, Severity, fmt_bytes,
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

/// "still needs X > capacity Y" when a fix does not bring the plan under the pool.
fn fit_note(ctx: &Context, saving: u64) -> String {
    match ctx.capacity {
        Some(cap) => {
            let after = ctx.plan.total_peak_bytes.saturating_sub(saving);
            if after > cap {
                format!(
                    "; still does not fit: {} > capacity {}",
                    fmt_bytes(after),
                    fmt_bytes(cap)
                )
            } else {
                format!("; fits: {} ≤ capacity {}", fmt_bytes(after), fmt_bytes(cap))
            }
        }
        None => String::new(),
    }
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

/// Square trailing dimensions ≥ 512 (`[…, S, S]`): an attention score / probability matrix.
fn is_square_tail(shape: &str) -> Option<u64> {
    let dims: Vec<u64> = shape
        .split('[')
        .nth(1)?
        .split(']')
        .next()?
        .split(',')
        .filter_map(|d| d.trim().parse().ok())
        .collect();
    let n = dims.len();
    (n >= 2 && dims[n - 1] == dims[n - 2] && dims[n - 1] >= 512).then(|| dims[n - 1])
}

/// Top-level argument of a parameter's op_name: `opt_state['m'][2]['w']` → `opt_state`.
pub fn arg_root(op_name: &str) -> &str {
    let end = op_name.find(['[', '.', '/']).unwrap_or(op_name.len());
    &op_name[..end]
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
    let heap = p.heap_peak_bytes;
    let (fwd, bwd, ws, other) = roles(p);
    let _ = (fwd, bwd, ws, other, heap);
    let no_fit = no_fit(ctx);
    let _ = no_fit;
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
    let _ = (fwd, bwd, ws, other, heap);
    let no_fit = no_fit(ctx);
    let _ = no_fit;
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
        .bytes(p.total_peak_bytes, None)
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
    let heap = p.heap_peak_bytes;
    let (fwd, bwd, ws, other) = roles(p);
    let _ = (fwd, bwd, ws, other, heap);
    let no_fit = no_fit(ctx);
    let _ = no_fit;
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
                .bytes(others, Some(pct(others, cap)))
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

/// JX004: growth per execution.
fn jx004_growth(ctx: &Context) -> Option<Finding> {
    growth_finding(ctx)
}

/// JX005: no parameter donated although a state pytree goes in and a same-shaped one comes out.
fn jx005_no_donation(ctx: &Context) -> Option<Finding> {
    donation_finding(ctx)
}

/// JX002: forward activations kept for the backward pass.
fn jx002_forward_kept(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let heap = p.heap_peak_bytes;
    let (fwd, bwd, ws, other) = roles(p);
    let _ = (fwd, bwd, ws, other, heap);
    let no_fit = no_fit(ctx);
    let _ = no_fit;
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
            .bytes(*bytes, Some(pct(*bytes, heap)))
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
            let largest = rows.iter().map(|b| b.size).max().unwrap_or(0);
            let save = fwd.saturating_sub(largest);
            f = f.fix(if p.user_remat_instructions > 0 {
                Fix::advice(format!(
                    "jax.checkpoint is already applied but the recomputed forwards are all live at once: scan over the layers (jax.lax.scan over a checkpointed layer) so each layer is recomputed during its own backward; saves up to ~{}{}",
                    fmt_bytes(save),
                    fit_note(ctx, save)
                ))
                .saving(save)
                .cost(format!("restructuring the layer loop; {CONFIRM}"))
            } else {
                Fix::new(
                    format!(
                        "wrap the block in jax.checkpoint (remat): saves up to ~{} of forward-kept bytes{}",
                        fmt_bytes(save),
                        fit_note(ctx, save)
                    ),
                    FixKind::JaxCheckpoint,
                )
                .saving(save)
                .cost(format!("about one extra forward pass per step; {CONFIRM}"))
                .preferred()
            });
            f = f.fix(
                Fix::advice(format!(
                    "halve the microbatch and accumulate gradients: ~{} less{}",
                    fmt_bytes(fwd / 2),
                    fit_note(ctx, fwd / 2)
                ))
                .saving(fwd / 2)
                .cost("twice the steps per batch"),
            );
            let square: u64 = rows
                .iter()
                .filter(|b| is_square_tail(&b.shape).is_some())
                .map(|b| b.size)
                .sum();
            if square > 0 {
                let s = rows
                    .iter()
                    .find_map(|b| is_square_tail(&b.shape))
                    .unwrap_or(0);
                f = f.evidence(Evidence::inferred(format!(
                    "{} of them are S×S attention matrices (S = {s}): B·H·S·S per layer",
                    fmt_bytes(square)
                )));
                f = f.fix(
                    Fix::advice(format!(
                        "shorter sequences: halving S shrinks the S×S buffers 4× (~{} less){}",
                        fmt_bytes(square * 3 / 4),
                        fit_note(ctx, square * 3 / 4)
                    ))
                    .saving(square * 3 / 4)
                    .cost("less context per example"),
                );
                f = f.fix(
                    Fix::advice(
                        "chunked / fused (flash) attention — only once you confirm the B·H·S·S buffers leave the plan (memory_analysis())",
                    )
                    .saving(square)
                    .cost("a kernel that supports your backend"),
                );
            }
            out = Some(f);
        }
    }

    out
}

/// JX003: the backward pass dominates.
fn jx003_backward_dominates(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let heap = p.heap_peak_bytes;
    let (fwd, bwd, ws, other) = roles(p);
    let _ = (fwd, bwd, ws, other, heap);
    let no_fit = no_fit(ctx);
    let _ = no_fit;
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
        .bytes(bwd, Some(pct(bwd, heap)))
        .evidence(Evidence::inferred(
            "role from the JAX name stack (`transpose(`)",
        ))
        .fix(
            Fix::advice(format!(
                "shard parameters and gradients (FSDP) or accumulate gradients over microbatches; check for f32 copies of bf16 gradients{}",
                fit_note(ctx, bwd / 2)
            ))
            .saving(bwd / 2)
            .cost("communication (FSDP) or more steps (accumulation)"),
        );
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
    let (ty, rest) = shape.split_once('[')?;
    let mut dims: Vec<u64> = rest
        .split(']')
        .next()?
        .split(',')
        .filter_map(|d| d.trim().parse().ok())
        .collect();
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
    .bytes(bytes, Some(pct(bytes, heap)));
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
        .fix(
            Fix::advice(
                "keep it in bf16 (unscale in bf16) or fuse the upcast into the update, so at most one f32 copy is live",
            )
            .saving(bytes / 2)
            .cost(format!("bf16 rounding of the unscaled gradient; {CONFIRM}")),
        );
    Some(f)
}

/// JX008: XLA already rematerialized.
fn jx008_xla_remat(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let heap = p.heap_peak_bytes;
    let (fwd, bwd, ws, other) = roles(p);
    let _ = (fwd, bwd, ws, other, heap);
    let no_fit = no_fit(ctx);
    let _ = no_fit;
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
    let (fwd, bwd, ws, other) = roles(p);
    let _ = (fwd, bwd, ws, other, heap);
    let no_fit = no_fit(ctx);
    let _ = no_fit;
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
        .bytes(b.size, Some(share))
        .evidence(Evidence::read(format!(
            "{}: {} # {}",
            b.instruction, b.shape, b.op_name
        )))
        .evidence(Evidence::inferred(format!("role: {}", b.role.as_str())));
        // A single array taking a quarter of the step: say what shrinks it.
        if pct(b.size, p.total_peak_bytes) >= 25.0 {
            f = f.fix(if b.heap {
                Fix::advice(
                    "compute this array in chunks (jax.lax.map or a loop over slices of the batch) so only one chunk is live",
                )
                .saving(b.size / 2)
                .cost("a loop in the step; same arithmetic")
            } else {
                Fix::advice(
                    "return a reduced value (metrics, argmax, a norm) instead of the full array, or evaluate in chunks",
                )
                .saving(b.size)
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

fn growth_finding(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    let g = &ctx.growth;
    let scope = Some(p.module.clone());
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
            g.append_site.iter().map(|a| a.0.clone()).collect(),
        )
        .bytes(per, None)
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
        f.scope = scope;
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
            g.append_site.iter().map(|a| a.0.clone()).collect(),
        )
        .bytes(per, None)
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
        f.scope = scope;
        f.refine = g.append_site.as_ref().map(|a| a.1.clone());
        return Some(f);
    }
    None
}

fn donation_finding(ctx: &Context) -> Option<Finding> {
    let p = ctx.plan;
    if p.alias_count > 0 || p.donated_bytes > 0 || p.non_aliased_output_bytes == 0 {
        return None;
    }
    // Parameters whose shape reappears among the outputs could reuse their buffers.
    let mut outs: Vec<String> = p.output_shapes.clone();
    let mut matched: Vec<(&str, u64)> = Vec::new();
    let mut roots: Vec<&str> = Vec::new();
    for prm in &p.parameters {
        let root = arg_root(&prm.op_name);
        if !roots.contains(&root) {
            roots.push(root);
        }
        if let Some(i) = outs.iter().position(|s| *s == prm.shape) {
            outs.swap_remove(i);
            matched.push((root, prm.bytes));
        }
    }
    // Only pytree state (params / optimizer state) counts, not a plain array argument.
    let is_tree = |root: &str| {
        p.parameters
            .iter()
            .any(|x| arg_root(&x.op_name) == root && x.op_name.len() > root.len())
    };
    let mut args: Vec<(&str, u64)> = Vec::new();
    for (root, bytes) in &matched {
        if !is_tree(root) {
            continue;
        }
        match args.iter_mut().find(|a| a.0 == *root) {
            Some(a) => a.1 += bytes,
            None => args.push((root, *bytes)),
        }
    }
    let saving: u64 = args
        .iter()
        .map(|a| a.1)
        .sum::<u64>()
        .min(p.non_aliased_output_bytes);
    if args.is_empty() || saving < (1 << 20) || pct(saving, p.total_peak_bytes) < 10.0 {
        return None;
    }
    // The position of each argument: in the op name for `args[0]`, else its place among the
    // plan's parameter roots (the locate step corrects it from the function's signature).
    let candidates: Vec<(Option<String>, u32)> = args
        .iter()
        .map(|(root, _)| match root.strip_prefix("args") {
            Some(_) => (
                None,
                p.parameters
                    .iter()
                    .find(|x| arg_root(&x.op_name) == *root)
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
                roots.iter().position(|r| r == root).unwrap_or(0) as u32,
            ),
        })
        .collect();
    let argnums = argnum_set(&candidates);
    let names: Vec<String> = args
        .iter()
        .map(|a| format!("{} ({})", a.0, fmt_bytes(a.1)))
        .collect();
    let tuple = argnums_tuple(&argnums);
    let loc = ctx.call_site.clone();
    let mut f = Finding::new(Code::JX005,
        Severity::Warning,
        format!(
            "no parameter is donated: {} come in and same-shaped outputs ({}) are written to new buffers; donate_argnums=({tuple}) can save up to {}",
            names.join(", "),
            fmt_bytes(p.non_aliased_output_bytes),
            fmt_bytes(saving)
        ),
    )
    .at(loc.clone(), loc.iter().cloned().collect())
    .bytes(saving, Some(pct(saving, p.total_peak_bytes)))
    .evidence(Evidence::read(format!(
        "input_output_alias is empty; parameters {} + outputs {} are separate allocations",
        fmt_bytes(p.parameter_bytes),
        fmt_bytes(p.output_bytes)
    )))
    .evidence(Evidence::inferred(format!(
        "{} of parameters have an output of the same shape and dtype",
        fmt_bytes(saving)
    )));
    f.refine = Some(Refine::JitLine {
        function: p
            .hlo_name
            .strip_prefix("jit_")
            .unwrap_or(&p.hlo_name)
            .to_string(),
    });
    f = f.fix(
        Fix::new(
            format!(
                "add donate_argnums=({tuple}) to jax.jit: saves up to {}{}",
                fmt_bytes(saving),
                fit_note(ctx, saving)
            ),
            FixKind::DonateArgnums {
                argnums,
                args: candidates,
            },
        )
        .saving(saving)
        .cost(format!(
            "the donated arrays are invalid after the call (rebind them to the outputs); {CONFIRM}"
        ))
        .preferred(),
    );
    f.scope = Some(p.module.clone());
    Some(f)
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
