//! The PyTorch sections of the text report, in the seed's order: totals (with the rank
//! comparison), top sites, free timeline, growth since an earlier snapshot.

use crate::present::escape::one_line;
use std::fmt::Write as _;

use super::tag;
use crate::findings::{Label, fmt_bytes};
use crate::report::{CaptureReport, SiteFrame, SiteRole, pct};
use crate::torch::summary::Summary;

const M: &str = "[measured]";
const R: &str = "[read]";
const I: &str = "[inferred]";

fn b(v: u64) -> String {
    if v < 1024 {
        format!("{v} B")
    } else {
        format!("{} ({v} B)", fmt_bytes(v))
    }
}

fn percent(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 * 100.0 / whole as f64)
}

pub(super) fn sections(
    s: &mut String,
    r: &CaptureReport,
    t: &Summary,
    top: usize,
    first_of_group: bool,
) {
    for c in &t.range {
        let _ = writeln!(
            s,
            "Range: device {} entries {}..{} of {} (--range; the allocator state at entry {} rebuilt by the replay that reproduces the recorded events)",
            c.device, c.start_index, c.end_index, c.of_entries, c.end_index
        );
    }
    if !t.range.is_empty() {
        s.push('\n');
    }
    totals(s, t);
    if let Some(h) = &t.host {
        // Pinned host memory is the host's: never added to the device totals above.
        let _ = writeln!(
            s,
            "Pinned host memory (host_segments, apart from the device totals)\n  reserved {} {R}; allocated {} {R}; {} segments, {} host trace entries {R}\n",
            b(h.reserved_bytes),
            b(h.allocated_bytes),
            h.segments,
            h.trace_entries
        );
    }
    ranks(s, t, first_of_group);
    sites(s, r, t, top);
    timeline(s, t);
    s.push_str(&crate::present::stages::text(t));
    s.push_str(&crate::present::categories::text(t));
    s.push_str(&crate::present::compile_regions::text(t));
    s.push_str(&crate::present::trend::text(t));
    diff(s, t);
    fit(s, t);
}

/// "Will it fit" (`report --fit` / `--on`): the same lines as `memlsp fit`.
fn fit(s: &mut String, t: &Summary) {
    let Some(f) = &t.fit else {
        return;
    };
    let _ = writeln!(s, "Will it fit (docs/FITS.md)");
    if f.is_empty() {
        let _ = writeln!(
            s,
            "  no device trace: memory history was not recorded, nothing to replay"
        );
    }
    let mut body = String::new();
    for d in f {
        crate::present::fit::device_text(&mut body, d);
    }
    for line in body.lines() {
        let _ = writeln!(s, "  {line}");
    }
    s.push('\n');
}

fn totals(s: &mut String, t: &Summary) {
    let o = &t.totals.memory;
    let _ = writeln!(s, "Totals");
    let _ = writeln!(
        s,
        "  reserved (Σ segment total_size)   {} {M}",
        b(o.reserved_bytes)
    );
    let _ = writeln!(
        s,
        "  live tensors (active_allocated)   {} {M}; requested {} {M}, rounding slack {} {M}",
        b(o.allocated_bytes),
        b(o.requested_bytes),
        b(o.allocated_bytes.saturating_sub(o.requested_bytes))
    );
    let _ = writeln!(
        s,
        "  freed, awaiting other streams     {} {M}",
        b(o.pending_free_bytes)
    );
    let _ = writeln!(
        s,
        "  inactive cache (reusable)         {} {M}; largest inactive block {} {M}",
        b(o.inactive_bytes),
        o.largest_inactive_block_bytes
            .map(b)
            .unwrap_or_else(|| "none".into())
    );
    let _ = writeln!(
        s,
        "  segments                          {} {M} ({} expandable, {} holding inactive blocks)",
        o.segment_count, o.expandable_segment_count, o.segments_with_inactive_blocks
    );
    if o.inactive_bytes > 0 {
        let _ = writeln!(
            s,
            "  empty_cache() would return        {} in {} wholly inactive segments {M}; the rest of the \
             inactive cache is reused by PyTorch but stays reserved (nvidia-smi counts it)",
            fmt_bytes(o.releasable_segments.bytes),
            o.releasable_segments.count
        );
    }
    if t.totals.trace_present {
        let _ = writeln!(
            s,
            "  trace entries                     {} {M}{}",
            t.totals.trace_entries,
            if t.totals.dropped_trace_entries > 0 {
                format!(
                    "; {} oldest entries dropped by --max-trace-events {M}",
                    t.totals.dropped_trace_entries
                )
            } else {
                String::new()
            }
        );
        if let Some(p) = &t.totals.peak_active_bytes_trace_relative {
            let _ = writeln!(
                s,
                "  trace-relative peak               {} at entry #{} of device {} {M} \
                 (running sum of alloc − free_completed from the first recorded entry)",
                if p.bytes < 0 {
                    format!("-{}", b(p.bytes.unsigned_abs()))
                } else {
                    b(p.bytes as u64)
                },
                p.index,
                p.device
            );
        }
        for d in &t.timeline {
            let l = &d.live_bytes_reconstructed;
            if l.peak > 0 && l.peak_index.is_some() {
                let _ = writeln!(
                    s,
                    "  live peak, device {}               ≈ {} {I} (snapshot state replayed back through the trace)",
                    d.device,
                    b(l.peak as u64)
                );
            }
        }
        let r = &t.replay;
        if r.validated && r.segment_events_recorded > 0 {
            let _ = writeln!(
                s,
                "  allocator replay                  reproduces all {} recorded segment events {M} and the \
                 final reserved {} [simulated]{}",
                r.segment_events_recorded,
                fmt_bytes(r.reserved_end_bytes_replayed),
                // A validated device whose fixes are not replayed says why in its note.
                if r.fixes_replayed {
                    format!(": the fixes below are replayed on it{}", capacities_read(r))
                } else {
                    format!("; {}", r.note.as_deref().unwrap_or_default())
                }
            );
        } else if !r.validated {
            let _ = writeln!(
                s,
                "  allocator replay                  reproduces {} of {} recorded segment events {M}: {}",
                r.segment_events_matched,
                r.segment_events_recorded,
                r.note.as_deref().unwrap_or("no simulation on this capture")
            );
        }
    } else {
        let _ = writeln!(s, "  trace                             none recorded {R}");
    }
    let used: Vec<_> = t
        .devices
        .iter()
        .filter(|d| d.memory.segment_count > 0 || d.trace_entries > 0)
        .collect();
    if used.len() > 1 {
        for d in used {
            let _ = writeln!(
                s,
                "  device {}: reserved {} · live {} · inactive {} · {} trace entries {M}",
                d.device,
                fmt_bytes(d.memory.reserved_bytes),
                fmt_bytes(d.memory.allocated_bytes),
                fmt_bytes(d.memory.inactive_bytes),
                d.trace_entries
            );
        }
    }
    s.push('\n');
}

/// Where a device's capacity is read from its refusals (no OOM recorded): the range its
/// fixes are replayed at.
fn capacities_read(r: &crate::torch::replay::CaptureReplay) -> String {
    r.devices
        .iter()
        .filter_map(|d| {
            d.capacity_read.map(|(lo, hi)| {
                format!(
                    " at both ends of the capacity device {}'s refusals show ({} to {}; no OOM \
                     recorded) {I}, the smaller saving shown",
                    d.device,
                    fmt_bytes(lo),
                    fmt_bytes(hi)
                )
            })
        })
        .collect::<Vec<_>>()
        .join(";")
}

fn ranks(s: &mut String, t: &Summary, first_of_group: bool) {
    let Some(c) = &t.rank_comparison else {
        return;
    };
    if !first_of_group {
        let _ = writeln!(
            s,
            "Ranks: this is rank {} of {} (the table is in the first rank's section)\n",
            t.rank.unwrap_or(0),
            c.rows.len()
        );
        return;
    }
    s.push_str(&ranks_table(c));
}

/// The comparison of ranks (`report DIR`, `compare`).
pub(crate) fn ranks_table(c: &crate::torch::ranks::RankComparison) -> String {
    let mut s = String::new();
    let s = &mut s;
    let _ = writeln!(s, "Ranks ({} snapshots)", c.rows.len());
    for r in &c.rows {
        let i = r.rank;
        let name = r
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  rank {i} {name}: live {} · reserved {} · inactive {} · peak {} · {} OOM · top {} ({}) {M}",
            fmt_bytes(r.allocated),
            fmt_bytes(r.reserved),
            fmt_bytes(r.inactive),
            r.peak
                .map(|p| format!("≈{} {I}", fmt_bytes(p)))
                .unwrap_or_else(|| "–".into()),
            r.ooms,
            r.top_site,
            r.top_percent
                .map(|p| format!("{p:.1}%"))
                .unwrap_or_else(|| "–".into()),
        );
    }
    match c.imbalance {
        Some(x) if x > 1.2 => {
            let _ = writeln!(
                s,
                "  imbalance: the fullest rank holds {x:.2}× the live memory of the emptiest {M}"
            );
        }
        Some(_) => {
            let _ = writeln!(s, "  ranks are balanced (live memory within 20%) {M}");
        }
        None => {}
    }
    s.push('\n');
    std::mem::take(s)
}

fn sites(s: &mut String, r: &CaptureReport, t: &Summary, top: usize) {
    let _ = writeln!(s, "Top sites (share of live memory)");
    if r.sites.is_empty() {
        let _ = writeln!(s, "  no live tensor blocks {M}\n");
        return;
    }
    for (i, site) in r.sites.iter().take(top).enumerate() {
        let name = match &site.location {
            Some(l) => one_line(&format!("{}:{}:{}", l.file, l.line, l.function)).into_owned(),
            None => "<no stack>".into(),
        };
        let _ = writeln!(
            s,
            "  {:>2}. {:>5}  {:>10}  {:>5} blocks  {}  {}{}",
            i + 1,
            pct(Some(site.percent)),
            fmt_bytes(site.bytes),
            site.blocks,
            name,
            tag(site.label),
            match site.role {
                None | Some(SiteRole::Unknown) => String::new(),
                Some(role) => format!("  role: {} {I}", role.as_str()),
            }
        );
        if site.frame == SiteFrame::PythonFallback {
            let _ = writeln!(
                s,
                "        (no user frame in the stack: first Python frame shown)"
            );
        }
        for l in &site.callers {
            let _ = writeln!(
                s,
                "        called from {}",
                one_line(&format!("{}:{} {}", l.file, l.line, l.function))
            );
        }
    }
    let distinct = t.allocation_sites.distinct_sites;
    if distinct > top {
        let _ = writeln!(s, "  … {} more sites {M}", distinct.saturating_sub(top));
    }
    s.push('\n');
}

fn timeline(s: &mut String, t: &Summary) {
    let _ = writeln!(s, "Free timeline");
    if !t.totals.trace_present || t.timeline.is_empty() {
        let _ = writeln!(
            s,
            "  no trace entries: when blocks were freed cannot be told from this file {R}\n"
        );
        return;
    }
    for d in &t.timeline {
        let _ = writeln!(
            s,
            "  device {}: {} allocs, {} free_requested, {} free_completed {M}",
            d.device, d.allocs, d.free_requested, d.free_completed
        );
        if d.frees_of_blocks_allocated_before_window > 0 {
            let _ = writeln!(
                s,
                "    {} frees of blocks allocated before the recorded window {M}",
                d.frees_of_blocks_allocated_before_window
            );
        }
        let _ = writeln!(
            s,
            "    pending frees (requested, never completed): {} ({}) {M}; delayed frees (completed later): {} ({}) {M}",
            d.pending_frees.count,
            fmt_bytes(d.pending_frees.bytes),
            d.delayed_frees.count,
            fmt_bytes(d.delayed_frees.bytes)
        );
        let segs = [
            ("segment_alloc", d.segment_alloc),
            ("segment_free", d.segment_free),
            ("segment_map", d.segment_map),
            ("segment_unmap", d.segment_unmap),
        ];
        let seg_text: Vec<String> = segs
            .iter()
            .filter(|(_, c)| c.count > 0)
            .map(|(k, c)| format!("{} {k} ({})", c.count, fmt_bytes(c.bytes)))
            .collect();
        if !seg_text.is_empty() {
            let _ = writeln!(s, "    segments: {} {M}", seg_text.join(", "));
        }
        for x in d.repeating_unfreed_sites.iter().take(3) {
            let _ = writeln!(
                s,
                "    repeats without frees: {} — {} allocs, {} freed, {} live, in {} of {} parts {M}",
                x.site,
                x.allocs,
                x.freed,
                x.retained,
                x.window_parts,
                crate::torch::timeline::WINDOWS
            );
        }
        if let Some(burst) = d.burst.filter(|b| b.frees >= 8) {
            let _ = writeln!(
                s,
                "    largest run of frees: {} blocks ({}) at entries #{}–#{}, allocated over {} parts {M}",
                burst.frees,
                fmt_bytes(burst.bytes),
                burst.start,
                burst.end,
                burst.alloc_parts
            );
        }
    }
    let ooms = &t.totals.oom_events;
    if ooms.len() > 4 {
        let _ = writeln!(s, "  {} OOM events; the first 4: {M}", ooms.len());
    }
    for o in ooms.iter().take(4) {
        let _ = writeln!(
            s,
            "  OOM on device {} at entry #{}: request {} {R}, device_free {} {R}, at {}",
            o.device,
            o.index,
            b(o.size),
            o.device_free
                .map(b)
                .unwrap_or_else(|| "not recorded".into()),
            one_line(&o.first_user_frame.site)
        );
        if let Some(set) = t
            .device_timeline(o.device)
            .and_then(|d| d.oom_live.iter().find(|x| x.index == o.index))
        {
            let _ = writeln!(
                s,
                "    live just before: {} in {} blocks {M}",
                fmt_bytes(set.live_bytes),
                set.live_blocks
            );
            for x in set.sites.iter().take(3) {
                let _ = writeln!(
                    s,
                    "      {:>5}  {}  {} blocks  {} {M}",
                    pct(percent(x.bytes, set.live_bytes)),
                    fmt_bytes(x.bytes),
                    x.blocks,
                    x.site
                );
            }
        }
    }
    if ooms.is_empty() {
        let _ = writeln!(s, "  no OOM event in the trace {M}");
    }
    s.push('\n');
}

fn diff(s: &mut String, t: &Summary) {
    let Some(d) = &t.diff else {
        return;
    };
    let _ = writeln!(s, "Growth since {}", d.earlier);
    let _ = writeln!(
        s,
        "  live {} → {} {M}; reserved {} → {} {M}",
        fmt_bytes(d.allocated_bytes_before),
        fmt_bytes(d.allocated_bytes_after),
        fmt_bytes(d.reserved_bytes_before),
        fmt_bytes(d.reserved_bytes_after)
    );
    if d.grown.is_empty() {
        let _ = writeln!(
            s,
            "  no site grew in both live bytes and block count {M}: no evidence of a leak between the snapshots"
        );
    }
    for g in d.grown.iter().take(10) {
        let _ = writeln!(
            s,
            "  {}  {}  {:+} blocks  {} {M}",
            crate::findings::fmt_signed_bytes(i128::from(g.bytes_delta)),
            fmt_bytes(g.bytes_after),
            g.blocks_delta,
            g.site
        );
    }
    s.push('\n');
}

/// What to capture next, from what this snapshot lacks.
pub(super) fn next_steps(r: &CaptureReport, t: &Summary) -> Vec<String> {
    let mut out = Vec::new();
    let leaky = r.findings.iter().any(|f| f.code.is_leak());
    if !t.totals.trace_present || t.totals.trace_entries <= 1 {
        out.push(
            "Next snapshot: record history first — `torch.cuda.memory._record_memory_history(max_entries=100000)` \
             before the run, `torch.cuda.memory._dump_snapshot(\"snap.pickle\")` after"
                .to_string(),
        );
    }
    if t.diff.is_none() {
        out.push(format!(
            "{}: dump two snapshots k steps apart at the same point (right after optimizer.step(), \
             after the first step) and run `memlsp report early.pickle --diff late.pickle`",
            if leaky {
                "Confirm the leak"
            } else {
                "To check for growth across steps"
            }
        ));
    }
    if t.totals.oom_events.is_empty() {
        out.push(
            "If the job runs out of memory, dump at the failure: \
             `torch._C._cuda_attach_out_of_memory_observer(lambda d, a, t, f: torch.cuda.memory._dump_snapshot(\"oom.pickle\"))`"
                .to_string(),
        );
    }
    out
}

/// Which questions this snapshot cannot answer, and why.
pub(super) fn uncertainty(t: &Summary) -> Vec<String> {
    let mut out = Vec::new();
    let o = &t.totals.memory;
    if !t.totals.trace_present {
        out.push(
            "no trace (memory history was not recorded): this file cannot say when blocks were allocated or \
             freed, what the peak was, whether frees were delayed, or whether anything repeats per step"
                .to_string(),
        );
    } else if t.totals.trace_entries <= 1 {
        out.push(format!(
            "the trace holds {} entry (legacy `_record_memory_history(True)` keeps one): no history of frees \
             or peaks can be read from it",
            t.totals.trace_entries
        ));
    }
    let nostack = t.no_stack_bytes();
    if nostack > 0 {
        out.push(format!(
            "{} of live memory ({}) has no Python stack {M} (allocated before recording started, with \
             context disabled, or on autograd's backward thread): it is listed as <no stack>",
            fmt_bytes(nostack),
            pct(percent(nostack, o.allocated_bytes))
        ));
    }
    let older = t.frees_of_older_blocks();
    let dropped = t.totals.dropped_trace_entries;
    let read = t.trace_start.iter().any(|s| s.label == "read");
    if read {
        // The ring buffer's own word, per device.
        out.extend(t.trace_start.iter().filter_map(|s| s.sentence()));
    }
    if (older > 0 && !read) || dropped > 0 {
        out.push(format!(
            "the trace starts mid-run ({} frees of blocks allocated earlier{}) {I}: trace-relative peaks start at 0 \
             whatever was already live",
            older,
            if dropped > 0 {
                format!("; {dropped} oldest entries dropped by --max-trace-events")
            } else {
                String::new()
            }
        ));
    }
    out.push(format!(
        "only PyTorch's caching allocator is visible: NCCL, cuDNN/cuBLAS workspaces and direct cudaMalloc \
         are not; compare `torch.cuda.device_memory_used()` or nvidia-smi with the {} reserved here {M}",
        fmt_bytes(o.reserved_bytes)
    ));
    out.push(format!(
        "roles (parameter, activation, optimizer state, …) are guessed from stack frames {}",
        tag(Label::Inferred)
    ));
    out
}
