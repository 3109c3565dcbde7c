//! Named memory patterns (PT001–PT010), each fired only on evidence found in the snapshot.
//!
//! Every finding carries the evidence that supports it, each line labelled measured (counted from
//! blocks or trace entries), read (a field of the file) or inferred (a role guess, a cause, an
//! estimated saving). Expected retention is said to be expected.

use crate::findings::{Code, Evidence, Finding, Fix, FixKind, Label, Severity, fmt_bytes};
use crate::site::SiteRole;
use crate::torch::Analysis;
use crate::torch::fragmentation::Verdict;
use crate::torch::model::{BlockState, Snapshot, StackId};
use crate::torch::release::{Cause, GraphSeen};
use crate::torch::sites::percent;
use crate::torch::stacks::{Role, SiteKey, culprit, site_string};
use crate::torch::timeline::{DeviceTimeline, SCALAR_BYTES, SiteTrace, WINDOWS};

/// Allocations needed in a device trace before "repeats every step" can be judged.
const MIN_ALLOCS_FOR_STEPS: u64 = 24;

fn pct_text(p: Option<f64>) -> String {
    p.map(|p| format!("{p:.1}%")).unwrap_or_else(|| "–".into())
}

fn where_(snap: &Snapshot, key: SiteKey) -> String {
    match key.and_then(|k| snap.frames.get(k as usize)) {
        Some(f) => format!("{}:{} ({})", f.filename, f.line, f.name),
        None => "an allocation without a Python stack".into(),
    }
}

/// Run every detector.
pub fn detect(snap: &Snapshot, a: &Analysis) -> Vec<Finding> {
    let mut out = Vec::new();
    oom_findings(snap, a, &mut out);
    for t in &a.timeline.devices {
        retained_per_step(snap, a, t, &mut out);
        batched_frees(snap, a, t, &mut out);
    }
    pending_frees(snap, a, &mut out);
    crate::torch::optim_state::detect(snap, a, &mut out);
    activation_pressure(snap, a, &mut out);
    crate::torch::no_backward::detect(snap, a, &mut out);
    ddp_replication(snap, a, &mut out);
    top_site(snap, a, &mut out);
    crate::torch::near_oom::detect(snap, a, &mut out);
    crate::torch::device_skew::detect(snap, a, &mut out);
    crate::torch::autocast_cache::detect(snap, a, &mut out);
    crate::torch::capture_limits::detect(snap, a, &mut out);
    out
}

fn any_oom(a: &Analysis) -> bool {
    a.totals.oom_events().next().is_some()
}

/// PT009 for every OOM event, PT008 when the allocator state shows fragmentation.
fn oom_findings(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    // A retry loop can record hundreds of OOMs: the first few are reported, the count is said.
    let total = a.totals.oom_events().count();
    for (n, oom) in a.totals.oom_events().take(4).enumerate() {
        let Some(diag) = a
            .fragmentation
            .iter()
            .find(|d| d.device == oom.device && d.index == oom.index)
        else {
            continue;
        };
        let (loc, stack) = culprit(snap, oom.site_key, oom.stack);
        let free = oom
            .device_free
            .map(|f| format!(" with {} free on the device", fmt_bytes(f)))
            .unwrap_or_default();
        let mut f = Finding::new(
            Code::PT009,
            Severity::Error,
            format!(
                "Out of memory on device {}: a request of {}{} failed at {}.",
                oom.device,
                fmt_bytes(oom.size),
                free,
                where_(snap, oom.site_key),
            ),
        )
        .at(loc.clone(), stack.clone())
        .bytes(oom.size, None, Label::Measured)
        .evidence(Evidence::read(format!(
            "trace entry #{} of device {}: action oom, size {} B, device_free {}",
            oom.index,
            oom.device,
            oom.size,
            oom.device_free
                .map(|v| format!("{v} B"))
                .unwrap_or_else(|| "not recorded".into()),
        )));
        f.scope = Some(format!("device {}", oom.device));
        if n == 0 && total > 4 {
            f = f.evidence(Evidence::measured(format!(
                "{total} OOM events in the trace; the first 4 are reported"
            )));
        }
        let live = a
            .timeline
            .device(oom.device)
            .and_then(|t| t.oom_sets.iter().find(|s| s.index == oom.index));
        if let Some(live) = live {
            f = f.evidence(Evidence::measured(format!(
                "just before the OOM {} were live in {} blocks (replayed back from the snapshot state)",
                fmt_bytes(live.bytes),
                live.blocks
            )));
            for (k, bytes, blocks, _) in live.sites.iter().take(3) {
                f = f.evidence(Evidence::measured(format!(
                    "held at the OOM: {} in {} blocks from {} ({})",
                    fmt_bytes(*bytes),
                    blocks,
                    site_string(snap, *k),
                    pct_text(percent(*bytes, live.bytes)),
                )));
            }
        }
        f = f.evidence(Evidence::inferred(diag.explain()));
        if diag.verdict == Verdict::LiveTensorsNearCapacity {
            f = f.fix(Fix::advice(
                "Reduce live memory: smaller batch or sequence, activation checkpointing, \
                 sharding (FSDP/ZeRO) or lower precision; allocator settings will not help here",
            ));
        }
        // The cause (PT008) leads; the event (PT009) follows.
        if diag.verdict == Verdict::Fragmentation {
            let mut g = Finding::new(
                Code::PT008,
                Severity::Error,
                format!(
                    "Fragmentation caused the OOM on device {}: {} requested, but the largest \
                     inactive block is {} while {} sit inactive across {} segment(s).",
                    diag.device,
                    fmt_bytes(diag.request),
                    fmt_bytes(diag.largest_inactive),
                    fmt_bytes(diag.inactive),
                    diag.segments_with_inactive,
                ),
            )
            .at(loc, stack)
            .bytes(diag.request, None, Label::Measured)
            .evidence(Evidence::read(format!(
                "failed request {} B (oom entry #{})",
                diag.request, diag.index
            )))
            .evidence(Evidence::measured(format!(
                "largest inactive block {} B; inactive total {} B in {} of {} segments",
                diag.largest_inactive,
                diag.inactive,
                diag.segments_with_inactive,
                diag.segment_count
            )))
            .evidence(Evidence::inferred(diag.explain()));
            g.scope = Some(format!("device {}", diag.device));
            if diag.expandable_already {
                g = g.evidence(Evidence::read(
                    "expandable segments are already on in this run",
                ));
            } else {
                g = g.fix(
                    Fix::new(
                        "Set PYTORCH_ALLOC_CONF=expandable_segments:True before `import torch`",
                        FixKind::AllocConf {
                            value: "expandable_segments:True".into(),
                        },
                    )
                    .preferred(),
                );
            }
            let mb = diag.max_split_mb();
            g = g
                .fix(Fix::new(
                    format!(
                        "Then try PYTORCH_ALLOC_CONF=max_split_size_mb:{mb} (near the failed request) \
                         so large cached blocks are not split"
                    ),
                    FixKind::AllocConf {
                        value: format!("max_split_size_mb:{mb}"),
                    },
                ))
                .fix(Fix::advice(
                    "Reduce the variety of allocation sizes: pad batches and sequences to fixed shapes",
                ));
            out.push(g);
        }
        out.push(f);
    }
}

fn repeats(s: &SiteTrace) -> bool {
    s.retained >= 3 && s.retained_parts() >= 3
}

/// PT002 (retained autograd graph) and PT003 (growing Python container).
fn retained_per_step(snap: &Snapshot, a: &Analysis, t: &DeviceTimeline, out: &mut Vec<Finding>) {
    if t.allocs < MIN_ALLOCS_FOR_STEPS {
        return;
    }
    let allocated = a.totals.overall.allocated;
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
        let Some(lead) = scalars
            .iter()
            .max_by_key(|s| (s.scalar_retained.min(3), s.last_scalar_alloc))
            .copied()
        else {
            return;
        };
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
        out.push(f);
        // The other retained user sites belong to the same graphs.
        return;
    }
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

/// PT007: frees that arrive in batches, long after allocation (Python GC collecting cycles).
fn batched_frees(snap: &Snapshot, a: &Analysis, t: &DeviceTimeline, out: &mut Vec<Finding>) {
    let Some(b) = &t.burst else { return };
    // Only the collector's own frames on the free stacks say a cycle held the tensors: a batch
    // is also what the autocast cache, a dropped graph or zero_grad release (torch::release).
    let collected =
        crate::torch::release::collector_frees(snap, &a.releases, t.device, b.start, b.end);
    if b.frees < 8 || collected.saturating_mul(2) < b.frees {
        return;
    }
    let (loc, stack) = culprit(snap, b.site, b.stack);
    let mut f = Finding::new(Code::PT007,
        Severity::Warning,
        format!(
            "Frees arrive in batches: {} blocks ({}) allocated over {} parts of the trace were freed \
             together{} — tensors held by reference cycles until the garbage collector runs.",
            b.frees,
            fmt_bytes(b.bytes),
            b.alloc_parts,
            " from the garbage collector",
        ),
    )
    .at(loc, stack)
    .bytes(b.bytes, percent(b.bytes, a.totals.overall.allocated), Label::Measured)
    .evidence(Evidence::measured(format!(
        "trace entries #{}–#{} of device {}: {} frees with no allocation in between",
        b.start, b.end, t.device, b.frees
    )))
    .evidence(Evidence::measured(format!(
        "{} such batched free runs on this device; the largest freed mostly blocks from {}",
        t.batched_bursts,
        site_string(snap, b.site)
    )));
    f = f.evidence(Evidence::measured(format!(
        "{collected} of the {} free stacks go through Python's garbage collector (gc_collect)",
        b.frees
    )));
    f = f
        .evidence(Evidence::inferred(
            "memory that should be freed each step waits for a GC cycle: a reference cycle holds the tensors",
        ))
        .fix(Fix::advice(
            "At start-up: `from torch.utils.viz._cycles import warn_tensor_cycles; warn_tensor_cycles()` \
             reports each cycle that holds a CUDA tensor; break it (weakref, del, avoid closures over self)",
        ));
    f.scope = Some(format!("device {}", t.device));
    out.push(f);
}

/// PT010: blocks freed by the program but still held for another stream.
fn pending_frees(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    let snap_pending = a.totals.overall.pending_free;
    let trace_pending: Vec<_> = a
        .timeline
        .devices
        .iter()
        .flat_map(|t| t.pending.iter().map(move |p| (t.device, p)))
        .collect();
    let trace_pending_bytes = trace_pending
        .iter()
        .fold(0u64, |x, (_, p)| x.saturating_add(p.size));
    let delayed: u64 = a.timeline.devices.iter().map(|t| t.delayed.count).sum();
    let delayed_bytes = a
        .timeline
        .devices
        .iter()
        .fold(0u64, |x, t| x.saturating_add(t.delayed.bytes));
    if snap_pending == 0 && trace_pending.is_empty() && delayed == 0 {
        return;
    }
    // Culprit: the free stack of the largest pending free, else a pending block's stack, else a
    // delayed free.
    let mut stack: Option<StackId> = trace_pending
        .iter()
        .max_by_key(|(_, p)| p.size)
        .and_then(|(_, p)| p.stack);
    if stack.is_none() {
        stack = snap
            .segments
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::ActivePendingFree)
            .max_by_key(|b| b.size)
            .and_then(|b| b.stack);
    }
    if stack.is_none() {
        stack = a.timeline.devices.iter().find_map(|t| t.delayed.example);
    }
    let (key, _) = a.stacks.site(stack);
    let (loc, st) = culprit(snap, key, stack);
    let waiting = snap_pending.max(trace_pending_bytes);
    let severity = if waiting > 0 {
        Severity::Warning
    } else {
        Severity::Information
    };
    let message = if waiting > 0 {
        format!(
            "{} was freed by the program but is still held until another stream's work completes \
             (pending free){}.",
            fmt_bytes(waiting),
            key.map(|_| format!(", freed at {}", where_(snap, key)))
                .unwrap_or_default()
        )
    } else {
        format!(
            "{delayed} frees ({}) completed only after later allocations: their memory was held \
             for another stream.",
            fmt_bytes(delayed_bytes)
        )
    };
    let mut f = Finding::new(Code::PT010, severity, message)
        .at(loc, st)
        .bytes(waiting.max(delayed_bytes), None, Label::Measured);
    if snap_pending > 0 {
        f = f.evidence(Evidence::measured(format!(
            "{} B in active_pending_free blocks at snapshot time",
            snap_pending
        )));
    }
    if !trace_pending.is_empty() {
        f = f.evidence(Evidence::measured(format!(
            "{} free_requested entries ({} B) with no free_completed by the end of the trace",
            trace_pending.len(),
            trace_pending_bytes
        )));
    }
    // Where the held blocks were allocated (the free stack above says where they were released).
    let held = snap
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().map(move |b| (s.stream, b)))
        .filter(|(_, b)| b.state == BlockState::ActivePendingFree)
        .max_by_key(|(_, b)| b.size);
    if let Some((stream, b)) = held {
        let (k, _) = a.stacks.site(b.stack);
        if k.is_some() && k != key {
            f = f.evidence(Evidence::measured(format!(
                "the largest held block ({} B, stream {stream}) was allocated at {}",
                b.size,
                site_string(snap, k)
            )));
        }
    }
    if delayed > 0 {
        let worst = a
            .timeline
            .devices
            .iter()
            .map(|t| t.delayed.max_entries_between)
            .max()
            .unwrap_or(0);
        let us = a
            .timeline
            .devices
            .iter()
            .filter_map(|t| t.delayed.max_us)
            .max();
        f = f.evidence(Evidence::measured(format!(
            "{delayed} frees completed late ({} B), up to {worst} trace entries{} after the request",
            delayed_bytes,
            us.map(|u| format!(" / {:.3} ms", u as f64 / 1000.0))
                .unwrap_or_default()
        )));
    }
    f = f
        .evidence(Evidence::inferred(
            "a tensor used on a side stream (`record_stream`, NCCL, prefetch) is released only when that \
             stream's recorded events complete",
        ))
        .fix(Fix::advice(
            "Release the tensor after the side stream's work (`torch.cuda.current_stream().wait_stream(s)`), \
             avoid `record_stream` on large buffers, or synchronise before the next large allocation",
        ));
    out.push(f);
}

/// PT005: forward activations dominate the peak (or the OOM) and are freed after it.
fn activation_pressure(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    // At an OOM, the live set just before it; otherwise the trace peak with most activations.
    let at_oom = a
        .timeline
        .devices
        .iter()
        .filter_map(|t| t.oom_sets.first().map(|p| (t, p)))
        .max_by_key(|(_, p)| p.role(Role::Activation));
    let at_peak = a
        .timeline
        .devices
        .iter()
        .filter_map(|t| t.peak_set.as_ref().map(|p| (t, p)))
        .max_by_key(|(_, p)| p.role(Role::Activation));
    let oom = at_oom.is_some();
    let Some((t, set)) = at_oom.or(at_peak) else {
        return;
    };
    let act = set.role(Role::Activation);
    if act == 0 || act.saturating_mul(2) < set.bytes {
        return;
    }
    // With native frames on the release stacks a graph shows (torch::release): a pass that
    // built none has nothing to checkpoint, and a forward with no backward is no_backward's.
    let graph = a.releases.graph();
    let held = a.releases.native_frames.then(|| {
        a.releases
            .held_at(snap, &a.stacks, t.device, set.index, Some(Role::Activation))
    });
    let by_graph = held.as_ref().map(|h| {
        h.released.get(Cause::GraphInBackward).bytes
            + h.released.get(Cause::Backward).bytes
            + h.released.get(Cause::GraphDropped).bytes
    });
    if !oom && (graph == GraphSeen::DroppedWithoutBackward || by_graph == Some(0)) {
        return;
    }
    let end_act = a
        .device_sites
        .iter()
        .zip(a.totals.devices.iter())
        .find(|(_, d)| d.device == t.device)
        .map(|(s, _)| s.role_total(Role::Activation))
        .unwrap_or(0);
    let freed = act.saturating_sub(end_act);
    if !oom && freed.saturating_mul(2) < act {
        // Not freed after the peak: retention, not pressure (PT002 looks at that).
        return;
    }
    let act_sites: Vec<_> = set
        .sites
        .iter()
        .filter(|(_, _, _, st)| a.stacks.role(*st) == Role::Activation)
        .collect();
    let Some((key, _, _, stack)) = act_sites.first().copied() else {
        return;
    };
    let (loc, st) = culprit(snap, *key, *stack);
    // Layers repeat their lines: the median count of live activation blocks per innermost Python
    // line (`torch::layers`) is the number of layers; without allocations in the trace, the
    // median block count per site. Checkpointing keeps about one layer's activations at a time.
    let layers = crate::torch::layers::at(snap, a, t.device, set.index).unwrap_or_else(|| {
        let mut counts: Vec<u64> = act_sites.iter().map(|(_, _, n, _)| *n).collect();
        counts.sort_unstable();
        counts.get(counts.len() / 2).copied().unwrap_or(1).max(1)
    });
    let saving = act.saturating_sub(act / layers);
    let severity = if oom || any_oom(a) {
        Severity::Warning
    } else {
        Severity::Information
    };
    // The step's forward starts after the previous optimizer step / zero_grad (read from the
    // release stacks); without them, at the trough before the peak.
    let step_start = a
        .releases
        .native_frames
        .then(|| crate::torch::release::step_start_before(snap, &a.releases, t.device, set.index))
        .flatten();
    let rise_us = step_start.and_then(|(_, us)| us).or(t.rise_us);
    let cost = match rise_us {
        Some(us) if us > 0 && !oom => format!(
            "one extra forward pass per step: the forward up to the peak took {:.1} ms in this trace",
            us as f64 / 1000.0
        ),
        _ => "one extra forward pass per step (about a third more step time when backward ≈ 2× forward)"
            .to_string(),
    };
    let when = if oom {
        "when the device ran out of memory"
    } else {
        "at the trace peak"
    };
    let message = if oom {
        format!(
            "Forward activations filled the device: {} of {} live when it ran out of memory ({}).",
            fmt_bytes(act),
            fmt_bytes(set.bytes),
            pct_text(percent(act, set.bytes)),
        )
    } else {
        format!(
            "Forward activations dominate peak memory: {} of {} live at the peak ({}), freed again \
             after it.",
            fmt_bytes(act),
            fmt_bytes(set.bytes),
            pct_text(percent(act, set.bytes)),
        )
    };
    let mut f = Finding::new(Code::PT005, severity, message)
        .at(loc, st)
        .bytes(act, percent(act, set.bytes), Label::Inferred)
        .evidence(Evidence::measured(format!(
            "{when} (before entry #{} of device {}): {} live",
            set.index,
            t.device,
            fmt_bytes(set.bytes)
        )))
        .evidence(Evidence::inferred(format!(
            "{} of it in {} sites whose stacks look like forward activations",
            fmt_bytes(act),
            act_sites.len(),
        )));
    if !oom {
        f = f.evidence(Evidence::inferred(format!(
            "{} of those activations were freed after the peak (sawtooth), {} remain at the snapshot",
            fmt_bytes(freed),
            fmt_bytes(end_act)
        )));
        match step_start {
            Some((start, Some(us))) => {
                f = f.evidence(Evidence::measured(format!(
                    "this step's forward began at entry #{start}, after the previous optimizer \
                     step or zero_grad, and reached the peak in {:.1} ms",
                    us as f64 / 1000.0
                )))
            }
            _ => {
                if let Some(us) = t.rise_us {
                    f = f.evidence(Evidence::measured(format!(
                        "live memory rose from its trough to the peak in {:.1} ms",
                        us as f64 / 1000.0
                    )));
                }
            }
        }
    }
    match by_graph {
        Some(b) => {
            f = f.evidence(Evidence::measured(format!(
                "{} of the activations live then were later freed by autograd (saved tensors \
                 released by the graph, read from their free stacks)",
                fmt_bytes(b)
            )))
        }
        None => {
            f = f.evidence(Evidence::inferred(
                "activations are saved by the forward pass for backward (role guessed from \
                 nn.Module forward frames)",
            ))
        }
    }
    f = f
        .evidence(Evidence::inferred(format!(
            "activation lines repeat about {layers}× (layers); checkpointing each layer keeps about one \
             layer's activations at a time: about {} saved",
            fmt_bytes(saving)
        )))
        .fix(
            Fix::advice(
                "Wrap repeated blocks in `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`",
            )
            .saving(saving)
            .cost(cost),
        );
    f.scope = Some(format!("device {}", t.device));
    out.push(f);
}

/// PT006: DDP keeps full gradient buckets next to full parameters on each rank.
fn ddp_replication(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    let allocated = a.totals.overall.allocated;
    let comm = a.sites.role_total(Role::CommunicationBuffer);
    if comm == 0 || allocated == 0 || comm.saturating_mul(20) < allocated {
        return;
    }
    let params = a.sites.role_total(Role::Parameter);
    let opt = a.sites.role_total(Role::OptimizerState);
    let grads = a.sites.role_total(Role::Backward);
    let model_state = comm
        .saturating_add(params)
        .saturating_add(opt)
        .saturating_add(grads);
    if model_state.saturating_mul(2) < allocated {
        return;
    }
    let Some(site) = a
        .sites
        .sites
        .iter()
        .find(|s| s.role() == Role::CommunicationBuffer)
    else {
        return;
    };
    let (loc, stack) = culprit(snap, site.key, site.stack);
    let severity = if any_oom(a) {
        Severity::Warning
    } else {
        Severity::Information
    };
    let f = Finding::new(Code::PT006,
        severity,
        format!(
            "DDP keeps a full replica on this rank: {} of gradient buckets next to {} of parameters \
             and {} of optimizer state ({} of live memory).",
            fmt_bytes(comm),
            fmt_bytes(params),
            fmt_bytes(opt),
            pct_text(percent(model_state, allocated)),
        ),
    )
    .at(loc, stack)
    .bytes(model_state, percent(model_state, allocated), Label::Inferred)
    .evidence(Evidence::measured(format!(
        "{} live in blocks allocated under torch.distributed / DDP's reducer",
        fmt_bytes(comm)
    )))
    .evidence(Evidence::measured(format!(
        "parameters {} · optimizer state {} · backward buffers {} (role guessed from stacks)",
        fmt_bytes(params),
        fmt_bytes(opt),
        fmt_bytes(grads)
    )))
    .evidence(Evidence::inferred(
        "every DDP rank holds the same full-size parameters, gradients and optimizer state",
    ))
    .fix(Fix::advice(
        "Shard model state: FSDP (`torch.distributed.fsdp.fully_shard`) or ZeRO \
         (`ZeroRedundancyOptimizer`) keep about 1/world_size of it per rank",
    ));
    out.push(f);
}

/// PT001: the site that holds the most live memory (attribution hint).
fn top_site(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    let allocated = a.totals.overall.allocated;
    // A tiny site beside mostly stackless memory is no answer: PT015 says so instead.
    if crate::torch::capture_limits::top_is_tiny(a) {
        return;
    }
    let Some(s) = a.sites.sites.iter().find(|s| s.key.is_some()) else {
        return;
    };
    let (loc, stack) = culprit(snap, s.key, s.stack);
    let p = s.percent_of(allocated);
    let site_role = crate::torch::site_role(a, out, s);
    let known = site_role != SiteRole::Unknown;
    let role = site_role.as_str();
    let mut f = Finding::new(
        Code::PT001,
        Severity::Hint,
        format!(
            "{} of live memory ({}) was allocated at {}{}.",
            pct_text(p),
            fmt_bytes(s.bytes),
            where_(snap, s.key),
            if known {
                format!(" ({role})")
            } else {
                String::new()
            }
        ),
    )
    .at(loc, stack)
    .bytes(s.bytes, p, Label::Measured)
    .evidence(Evidence::measured(format!(
        "{} active_allocated blocks, {} B ({} B requested)",
        s.blocks, s.bytes, s.requested_bytes
    )));
    if site_role == SiteRole::UserContainer {
        f = f.evidence(Evidence::inferred(
            "role: user container (the trace shows this line growing every step, PT003)",
        ));
    } else if known {
        f = f.evidence(Evidence::inferred(format!("role from the stack: {role}")));
    }
    out.push(f);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::AnalysisOptions;
    use crate::torch::analyse;
    use crate::torch::model::{Action, TraceEntry};
    use crate::torch::stacks::tests::intern;
    use crate::torch::totals::tests::{block, entry, segment};

    fn codes(f: &[Finding]) -> Vec<&'static str> {
        f.iter().map(|f| f.code.as_str()).collect()
    }

    /// The stack of an `nn.Linear` forward called from the user's `model.py:30`.
    fn activation_stack(snap: &mut Snapshot) -> crate::torch::model::StackId {
        intern(
            snap,
            &[
                (
                    "/v/site-packages/torch/nn/modules/linear.py",
                    125,
                    "forward",
                ),
                (
                    "/v/site-packages/torch/nn/modules/module.py",
                    1747,
                    "_call_impl",
                ),
                ("/u/model.py", 30, "forward"),
            ],
        )
    }

    /// A training loop of `steps` steps: forward activations freed in backward, plus `extra`.
    fn training(
        snap: &mut Snapshot,
        steps: u64,
        mut extra: impl FnMut(&mut Snapshot, u64, &mut Vec<TraceEntry>),
    ) -> Vec<TraceEntry> {
        let act = activation_stack(snap);
        let mut list = Vec::new();
        for step in 0..steps {
            for k in 0..4u64 {
                let mut e = entry(Action::Alloc, 0x10_0000 + step * 0x1000 + k, 1 << 20);
                e.set_stack(Some(act));
                list.push(e);
            }
            extra(snap, step, &mut list);
            for k in 0..4u64 {
                let addr = 0x10_0000 + step * 0x1000 + k;
                list.push(entry(Action::FreeRequested, addr, 1 << 20));
                list.push(entry(Action::FreeCompleted, addr, 1 << 20));
            }
        }
        list
    }

    #[test]
    fn healthy_training_loop_raises_no_warning() {
        let mut snap = Snapshot::default();
        let list = training(&mut snap, 8, |_, _, _| {});
        snap.device_traces = Some(vec![list]);
        snap.segments = vec![segment(
            0,
            1 << 30,
            vec![block(8 << 20, 8 << 20, BlockState::Inactive)],
        )];
        let a = analyse(&snap, &AnalysisOptions::default());
        assert!(
            a.findings.iter().all(|f| f.severity < Severity::Warning),
            "{:?}",
            codes(&a.findings)
        );
    }

    /// `x`-sized activation allocations that are never freed, `layers` per step.
    fn forward_without_backward(
        snap: &mut Snapshot,
        steps: u64,
        layers: u64,
        mut per_step: impl FnMut(&mut Snapshot, u64, &mut Vec<TraceEntry>),
    ) -> Vec<TraceEntry> {
        let act = activation_stack(snap);
        let mut list = Vec::new();
        for step in 0..steps {
            for k in 0..layers {
                let mut e = entry(Action::Alloc, 0x10_0000 + step * 0x1000 + k, 1 << 20);
                e.set_stack(Some(act));
                list.push(e);
            }
            per_step(snap, step, &mut list);
        }
        list
    }

    #[test]
    fn a_layer_loop_inside_one_forward_is_not_a_retained_graph() {
        // One forward over 32 layers, dumped before backward (e.g. at an OOM): the activation
        // site repeats across the whole window, but nothing marks separate steps.
        let mut snap = Snapshot::default();
        let list = forward_without_backward(&mut snap, 1, 32, |_, _, _| {});
        snap.device_traces = Some(vec![list]);
        let a = analyse(&snap, &AnalysisOptions::default());
        assert!(
            !codes(&a.findings).contains(&"PT002"),
            "{:?}",
            codes(&a.findings)
        );
    }

    #[test]
    fn a_cache_filled_in_forward_while_backward_frees_the_rest_is_not_a_retained_graph() {
        // Each step: 4 activations freed by backward, one cached mask kept, and a loss scalar.
        let mut snap = Snapshot::default();
        let mask = intern(
            &mut snap,
            &[
                (
                    "/v/site-packages/torch/nn/modules/module.py",
                    1747,
                    "_call_impl",
                ),
                ("/u/model.py", 88, "forward"),
            ],
        );
        let loss = intern(&mut snap, &[("/u/train.py", 50, "main")]);
        let list = training(&mut snap, 8, |_, step, list| {
            let mut m = entry(Action::Alloc, 0x70_0000 + step, 1 << 20);
            m.set_stack(Some(mask));
            list.push(m);
            let mut l = entry(Action::Alloc, 0x50_0000 + step, 4);
            l.set_stack(Some(loss));
            list.push(l);
            list.push(entry(Action::FreeRequested, 0x50_0000 + step, 4));
            list.push(entry(Action::FreeCompleted, 0x50_0000 + step, 4));
        });
        snap.device_traces = Some(vec![list]);
        let a = analyse(&snap, &AnalysisOptions::default());
        assert!(
            !codes(&a.findings).contains(&"PT002"),
            "{:?}",
            codes(&a.findings)
        );
    }

    #[test]
    fn a_running_total_replaced_each_step_pins_pt002_to_the_total() {
        // `total = total + loss`: the new total is made after the loss, the old one freed; the
        // graph behind it keeps every step's activations.
        let mut snap = Snapshot::default();
        let loss = intern(&mut snap, &[("/u/train.py", 50, "main")]);
        let total = intern(&mut snap, &[("/u/train.py", 51, "main")]);
        let list = forward_without_backward(&mut snap, 8, 4, |_, step, list| {
            let mut l = entry(Action::Alloc, 0x50_0000 + step, 4);
            l.set_stack(Some(loss));
            list.push(l);
            let mut t = entry(Action::Alloc, 0x60_0000 + step, 4);
            t.set_stack(Some(total));
            list.push(t);
            if step > 0 {
                for addr in [0x50_0000 + step - 1, 0x60_0000 + step - 1] {
                    list.push(entry(Action::FreeRequested, addr, 4));
                    list.push(entry(Action::FreeCompleted, addr, 4));
                }
            }
        });
        snap.device_traces = Some(vec![list]);
        let a = analyse(&snap, &AnalysisOptions::default());
        let f = a.findings.iter().find(|f| f.code == Code::PT002);
        let f = f.unwrap_or_else(|| panic!("no PT002 in {:?}", codes(&a.findings)));
        assert_eq!(f.location.as_ref().map(|l| l.line), Some(51));
        assert!(!codes(&a.findings).contains(&"PT003"));
    }

    #[test]
    fn a_loss_line_that_also_allocates_the_loss_functions_temporaries_marks_steps() {
        // `loss = F.cross_entropy(out, y)` allocates log-softmax outputs (freed) and the loss
        // itself on one line; every step's graph is kept behind the loss.
        let mut snap = Snapshot::default();
        let loss = intern(&mut snap, &[("/u/train.py", 50, "main")]);
        let list = forward_without_backward(&mut snap, 8, 4, |_, step, list| {
            let tmp = 0x40_0000 + step * 0x100;
            let mut t = entry(Action::Alloc, tmp, 8 << 20);
            t.set_stack(Some(loss));
            list.push(t);
            let mut l = entry(Action::Alloc, 0x50_0000 + step, 4);
            l.set_stack(Some(loss));
            list.push(l);
            list.push(entry(Action::FreeRequested, tmp, 8 << 20));
            list.push(entry(Action::FreeCompleted, tmp, 8 << 20));
        });
        snap.device_traces = Some(vec![list]);
        let a = analyse(&snap, &AnalysisOptions::default());
        let f = a.findings.iter().find(|f| f.code == Code::PT002);
        let f = f.unwrap_or_else(|| panic!("no PT002 in {:?}", codes(&a.findings)));
        assert_eq!(f.location.as_ref().map(|l| l.line), Some(50));
        assert_eq!(
            f.bytes,
            Some(8 * 4 * (1 << 20) + 8 * 4),
            "activations + kept losses"
        );
        assert!(
            f.evidence.iter().any(|e| e.text.contains(
                "(≤ 4 B requested) is made at /u/train.py:50:main once per step: 8 allocations"
            )),
            "{:?}",
            f.evidence
        );
    }

    #[test]
    fn a_model_output_kept_every_step_is_pt003_at_its_forward_line() {
        // `history.append(model(x))` in a training loop: the output is made inside `forward`
        // (an activation by its stack) while backward frees the rest of each step's forward.
        let mut snap = Snapshot::default();
        let head = intern(
            &mut snap,
            &[
                (
                    "/v/site-packages/torch/nn/modules/linear.py",
                    125,
                    "forward",
                ),
                ("/u/model.py", 60, "forward"),
                ("/u/train.py", 44, "main"),
            ],
        );
        let list = training(&mut snap, 8, |_, step, list| {
            let mut e = entry(Action::Alloc, 0x900_0000 + step * 0x1000, 4096);
            e.set_stack(Some(head));
            list.push(e);
        });
        snap.device_traces = Some(vec![list]);
        let a = analyse(&snap, &AnalysisOptions::default());
        let f = a.findings.iter().find(|f| f.code == Code::PT003);
        let f = f.unwrap_or_else(|| panic!("no PT003 in {:?}", codes(&a.findings)));
        assert_eq!(
            f.location.as_ref().map(|l| (l.file.as_str(), l.line)),
            Some(("/u/model.py", 60))
        );
        assert_eq!(f.bytes, Some(8 * 4096));
        assert!(!codes(&a.findings).contains(&"PT002"));
    }

    #[test]
    fn growing_container_is_pt003_at_the_appending_line() {
        let mut snap = Snapshot::default();
        let grow = intern(&mut snap, &[("/u/train.py", 44, "main")]);
        let mut live = Vec::new();
        let list = training(&mut snap, 8, |_, step, list| {
            let mut e = entry(Action::Alloc, 0x900_0000 + step * 0x1000, 4096);
            e.set_stack(Some(grow));
            list.push(e);
        });
        for step in 0..8u64 {
            let mut b = block(4096, 4096, BlockState::ActiveAllocated);
            b.stack = Some(grow);
            live.push(b);
            let _ = step;
        }
        snap.segments = vec![segment(0, 0x900_0000, live)];
        snap.device_traces = Some(vec![list]);
        let a = analyse(&snap, &AnalysisOptions::default());
        let f = a.findings.iter().find(|f| f.code == Code::PT003);
        let f = f.unwrap_or_else(|| panic!("no PT003 in {:?}", codes(&a.findings)));
        assert_eq!(f.location.as_ref().map(|l| l.line), Some(44));
        assert_eq!(f.fixes[0].kind, FixKind::DetachCpuAppend);
        assert!(!codes(&a.findings).contains(&"PT002"));
    }

    #[test]
    fn oom_with_split_cache_is_pt008_and_pt009() {
        let mut snap = Snapshot::default();
        let st = intern(&mut snap, &[("/u/train.py", 12, "main")]);
        snap.segments = (0..4u64)
            .map(|i| {
                segment(
                    0,
                    (i + 1) << 32,
                    vec![
                        block(40 << 20, 40 << 20, BlockState::ActiveAllocated),
                        block(24 << 20, 0, BlockState::Inactive),
                    ],
                )
            })
            .collect();
        let mut oom = entry(Action::Oom, 0, 64 << 20);
        oom.set_device_free(Some(1 << 20));
        oom.set_stack(Some(st));
        snap.device_traces = Some(vec![vec![oom]]);
        let a = analyse(&snap, &AnalysisOptions::default());
        assert_eq!(&codes(&a.findings)[..2], &["PT008", "PT009"]);
        let pt8 = &a.findings[0];
        assert_eq!(
            pt8.fixes[0].kind,
            FixKind::AllocConf {
                value: "expandable_segments:True".into()
            }
        );
        // The trace holds only the OOM: the replay serves nothing, so no max_split_size_mb helps
        // and the fix says so (simulated) instead of offering `max_split_size_mb:64`.
        assert_eq!(pt8.fixes[1].kind, FixKind::Advice);
        assert_eq!(
            pt8.fixes[1].simulated.as_ref().and_then(|s| s.oom_avoided),
            Some(false)
        );
        assert_eq!(pt8.location.as_ref().map(|l| l.line), Some(12));
    }
}
