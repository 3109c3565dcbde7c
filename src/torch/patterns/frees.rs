//! Batched frees (PT007) and frees the allocator still waits on (PT010).

use super::*;

/// PT007: frees that arrive in batches, long after allocation (Python GC collecting cycles).
pub(super) fn batched_frees(
    snap: &Snapshot,
    a: &Analysis,
    t: &DeviceTimeline,
    out: &mut Vec<Finding>,
) {
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
pub(super) fn pending_frees(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
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
