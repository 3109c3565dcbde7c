//! PT002/PT003: memory a training step keeps for the next one.

use super::*;

fn repeats(s: &SiteTrace) -> bool {
    s.retained >= 3 && s.retained_parts() >= 3
}

/// PT002 (retained autograd graph) and PT003 (growing Python container).
pub(super) fn retained_per_step(
    snap: &Snapshot,
    a: &Analysis,
    t: &DeviceTimeline,
    out: &mut Vec<Finding>,
) {
    if t.allocs < MIN_ALLOCS_FOR_STEPS {
        return;
    }
    // Only sites with a Python frame can be pinned; `<no stack>` merges unrelated allocations.
    let rep: Vec<&SiteTrace> = t
        .sites
        .iter()
        .filter(|s| s.key.is_some() && repeats(s))
        .collect();
    if rep.is_empty() {
        return;
    }
    let floor = match (t.floors.first(), t.floors.last()) {
        (Some(a), Some(b)) if b > a => Some((*a, *b)),
        _ => None,
    };
    let activations: Vec<&&SiteTrace> = rep.iter().filter(|s| s.role == Role::Activation).collect();
    // Loss-sized tensors made once per step by the user's code: kept (`losses.append(loss)`) or
    // replaced by the next one (`total = total + loss`). These mark separate steps, which a loop
    // over layers inside one forward does not have. The loss line also allocates the loss
    // function's temporaries (`F.cross_entropy` makes log-softmax outputs of the logits' size),
    // so only the line's loss-sized allocations are counted.
    let scalars: Vec<&SiteTrace> = t
        .sites
        .iter()
        .filter(|s| {
            s.key.is_some()
                && s.role != Role::Activation
                && s.scalar_allocs >= 3
                && s.scalar_windows.count_ones() >= 3
        })
        .collect();
    // When backward runs, most activation bytes are freed each step; a kept graph keeps the saved
    // ones (a third or more of what forward allocates). A cache filled inside some `forward`
    // while the rest is freed normally is a container, not a graph.
    let (act_alloc, act_kept) =
        t.sites
            .iter()
            .filter(|s| s.role == Role::Activation)
            .fold((0u64, 0u64), |(x, y), s| {
                (
                    x.saturating_add(s.alloc_bytes),
                    y.saturating_add(s.retained_bytes),
                )
            });
    let graph_kept = act_kept.saturating_mul(10) >= act_alloc.saturating_mul(3);
    if !activations.is_empty() && !scalars.is_empty() && graph_kept {
        let kept = (act_alloc, act_kept);
        out.extend(kept_graph(snap, a, t, &activations, &scalars, kept, floor));
        // The other retained user sites belong to the same graphs.
        return;
    }
    growing_containers(snap, a, t, &rep, graph_kept, floor, out);
}

/// PT002: forward activations kept across steps, with the per-step loss-sized tensor that keeps
/// them (`kept` = activation bytes allocated and never freed in the trace).
fn kept_graph(
    snap: &Snapshot,
    a: &Analysis,
    t: &DeviceTimeline,
    activations: &[&&SiteTrace],
    scalars: &[&SiteTrace],
    (act_alloc, act_kept): (u64, u64),
    floor: Option<(i64, i64)>,
) -> Option<Finding> {
    let allocated = a.totals.overall.allocated;
    let act_bytes = activations
        .iter()
        .fold(0u64, |x, s| x.saturating_add(s.retained_bytes));
    let act_blocks: u64 = activations.iter().map(|s| s.retained).sum();
    let parts = activations
        .iter()
        .map(|s| s.retained_parts())
        .max()
        .unwrap_or(0);
    // The kept scalars if some are kept, else the one made last in each step (the total
    // that consumes the loss).
    let lead = scalars
        .iter()
        .max_by_key(|s| (s.scalar_retained.min(3), s.last_scalar_alloc))
        .copied()?;
    let (loc, stack) = culprit(snap, lead.key, lead.stack);
    let total = act_bytes.saturating_add(lead.scalar_retained_bytes);
    let mut f = Finding::new(
        Code::PT002,
        Severity::Warning,
        format!(
            "Autograd graphs are kept alive across steps: {} of forward activations allocated \
             in {} of {} parts of the trace are never freed; {} holds a tensor that keeps them \
             alive.",
            fmt_bytes(act_bytes),
            parts,
            WINDOWS,
            where_(snap, lead.key),
        ),
    )
    .at(loc, stack)
    .bytes(total, percent(total, allocated), Label::Inferred)
    .evidence(Evidence::inferred(format!(
        "{} of the {} that forward allocated in the trace were never freed (forward = sites \
         whose stacks look like activations)",
        fmt_bytes(act_kept),
        fmt_bytes(act_alloc)
    )))
    .evidence(Evidence::inferred(format!(
        "{} activation allocations from {} forward site(s) spread over {} of {} parts of the \
         trace were never freed ({} still live)",
        act_blocks,
        activations.len(),
        parts,
        WINDOWS,
        fmt_bytes(act_bytes)
    )));
    f = f.evidence(Evidence::inferred(format!(
        "a loss-sized tensor (≤ {} B requested) is made at {} once per step: {} allocations over \
         {} of {WINDOWS} parts of the trace, {} still live",
        lead.scalar_max_size,
        site_string(snap, lead.key),
        lead.scalar_allocs,
        lead.scalar_windows.count_ones(),
        lead.scalar_retained
    )));
    if let Some((lo, hi)) = floor {
        f = f.evidence(Evidence::measured(format!(
            "the floor of live memory rose from {} to {} across the trace",
            fmt_bytes(lo.max(0) as u64),
            fmt_bytes(hi.max(0) as u64)
        )));
    }
    f = f
        .evidence(Evidence::inferred(
            "a tensor that requires grad is accumulated or logged each step (e.g. \
             `total_loss += loss`), so every step's graph and its saved activations stay reachable",
        ))
        .fix(
            Fix::new(
                "Accumulate `loss.detach()` instead of `loss`",
                FixKind::DetachAccumulated { item: false },
            )
            .saving(total)
            .preferred(),
        )
        .fix(
            Fix::new(
                "Or accumulate `loss.item()` (a Python float; synchronises with the GPU)",
                FixKind::DetachAccumulated { item: true },
            )
            .saving(total),
        )
        .fix(Fix::advice(
            "If nothing is accumulated, look for `backward(retain_graph=True)`",
        ));
    f.scope = Some(format!("device {}", t.device));
    Some(f)
}

/// PT003: lines whose tensors of every step stay (a container appended to each step).
fn growing_containers(
    snap: &Snapshot,
    a: &Analysis,
    t: &DeviceTimeline,
    rep: &[&SiteTrace],
    graph_kept: bool,
    floor: Option<(i64, i64)>,
    out: &mut Vec<Finding>,
) {
    let allocated = a.totals.overall.allocated;
    // Containers: repeated, never-freed allocations that are not model state or scalars, in a
    // trace that shows several steps (sawtooth cycles or optimizer steps). A model output kept
    // each step (`history.append(model(x))`) was allocated inside `forward`: an activation by its
    // stack. Where the graphs are not kept (backward freed the rest of forward), a forward line
    // whose tensor of every step stays is a container too.
    let steps = t.cycles.max(t.optimizer_runs);
    if steps < 3 {
        return;
    }
    // A container keeps what it was given: most of the line's allocations are never freed, in
    // most of the parts where the line allocates. A line whose new tensors replace the previous
    // step's (optimizer state rebuilt each step, a cache overwritten) frees as much as it keeps.
    let containers = rep.iter().filter(|s| {
        (s.role == Role::Unknown || s.role == Role::Activation && !graph_kept)
            && s.retained_max_size > SCALAR_BYTES
            && s.freed.saturating_mul(4) <= s.allocs
            && s.retained_parts() * 4 >= s.alloc_windows.count_ones() * 3
    });
    for s in containers.take(2) {
        let (loc, stack) = culprit(snap, s.key, s.stack);
        let per_part = s.retained as f64 / f64::from(s.retained_parts().max(1));
        let mut f = Finding::new(Code::PT003,
            Severity::Warning,
            format!(
                "{} keeps allocating tensors that are never freed: {} blocks ({}) in {} of {} parts \
                 of the trace — a container that grows every step.",
                where_(snap, s.key),
                s.retained,
                fmt_bytes(s.retained_bytes),
                s.retained_parts(),
                WINDOWS,
            ),
        )
        .at(loc, stack)
        .bytes(s.retained_bytes, percent(s.retained_bytes, allocated), Label::Measured)
        .evidence(Evidence::measured(format!(
            "{} allocations at {} in the trace, {} freed, {} still live (about {:.1} more per part of \
             the trace)",
            s.allocs,
            site_string(snap, s.key),
            s.freed,
            s.retained,
            per_part
        )))
        .evidence(Evidence::measured(format!(
            "the trace spans about {steps} steps ({} sawtooth cycles of live memory, {} optimizer steps)",
            t.cycles, t.optimizer_runs
        )));
        if let Some((lo, hi)) = floor {
            f = f.evidence(Evidence::measured(format!(
                "the floor of live memory rose from {} to {}",
                fmt_bytes(lo.max(0) as u64),
                fmt_bytes(hi.max(0) as u64)
            )));
        }
        f = f
            .evidence(Evidence::inferred(
                "the same line's tensors are kept by a Python list/dict that is appended to each step",
            ))
            .fix(
                Fix::new(
                    "Append `x.detach().cpu()` instead of the GPU tensor",
                    FixKind::DetachCpuAppend,
                )
                .saving(s.retained_bytes)
                .preferred(),
            )
            .fix(Fix::advice(
                "Or bound the container (`collections.deque(maxlen=N)`) or keep Python numbers",
            ));
        f.scope = Some(format!("device {}", t.device));
        out.push(f);
    }
}
