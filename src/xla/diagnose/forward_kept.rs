//! JX002: forward activations kept for the backward pass, and the fixes it offers (checkpointing
//! the layers, gradient accumulation over microbatches).

use super::{
    CONFIRM, Context, arg_root, bounded, by_line, is_square_tail, no_fit, pct, roles, saves, shapes,
};
use crate::findings::{Code, Evidence, Finding, Fix, FixKind, Label, Severity, fmt_bytes};
use crate::xla::plan::{PeakBuffer, Plan, Role};

/// JX002: forward activations kept for the backward pass.
pub(super) fn jx002_forward_kept(ctx: &Context) -> Option<Finding> {
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
                layers.count = crate::xla::layer_params::count(p).unwrap_or(1);
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
pub(super) fn dims_in_order(shape: &str) -> Vec<u64> {
    shape
        .split_once('[')
        .and_then(|(_, r)| r.split(']').next())
        .map(|d| d.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// A buffer's shape without the leading layer dimension a scan stacks it along.
fn unstacked(b: &PeakBuffer) -> String {
    let shape = crate::xla::hlo::without_layout(&b.shape).to_string();
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
            crate::xla::hlo::without_layout(&b.shape).to_string(),
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
pub(super) fn microbatch_fix(ctx: &Context) -> Option<Fix> {
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
