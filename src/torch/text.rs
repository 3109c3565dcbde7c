//! The human report body, in the seed's order: totals; top sites; free timeline; diagnosis;
//! next steps; uncertainty. Every number is tagged measured, read or inferred.

use crate::findings::Code;
use std::fmt::Write as _;
use std::path::Path;

use crate::analyze::Options;
use crate::findings::fmt_bytes;
use crate::torch::Analysis;
use crate::torch::diff::Diff;
use crate::torch::model::Snapshot;
use crate::torch::ranks::RankComparison;
use crate::torch::sites::percent;
use crate::torch::stacks::{SiteKind, site_string, stack_locations};

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

fn pct(p: Option<f64>) -> String {
    match p {
        Some(p) if p > 0.0 && p < 0.05 => "<0.1%".into(),
        Some(p) => format!("{p:.1}%"),
        None => "–".into(),
    }
}

/// Headline when no finding leads: what is live and where.
pub fn summary_sentence(snap: &Snapshot, a: &Analysis) -> String {
    let o = &a.totals.overall;
    if o.allocated == 0 {
        return format!(
            "No live tensor memory in this snapshot ({} reserved, {} segments).",
            fmt_bytes(o.reserved),
            o.segment_count
        );
    }
    let top = a.sites.sites.first();
    let tail = match top {
        Some(s) if s.key.is_some() => format!(
            "; the largest site is {} with {} of it",
            short_site(snap, s.key),
            pct(s.percent_of(o.allocated))
        ),
        Some(s) => format!(
            "; {} of it has no recorded stack",
            pct(s.percent_of(o.allocated))
        ),
        None => String::new(),
    };
    format!(
        "{} live in {} reserved on {} device(s){}, no problem pattern found.",
        fmt_bytes(o.allocated),
        fmt_bytes(o.reserved),
        a.totals
            .devices
            .iter()
            .filter(|d| d.memory.segment_count > 0)
            .count()
            .max(1),
        tail
    )
}

fn short_site(snap: &Snapshot, key: crate::torch::stacks::SiteKey) -> String {
    match key.and_then(|k| snap.frames.get(k as usize)) {
        Some(f) => format!("{}:{}", f.filename, f.line),
        None => "<no stack>".into(),
    }
}

/// Render the whole report body.
pub fn render(
    snap: &Snapshot,
    a: &Analysis,
    opts: &Options,
    diff: Option<(&Diff, &Path)>,
    ranks: Option<&RankComparison>,
) -> String {
    let mut s = String::new();
    totals(&mut s, a);
    if let Some(r) = ranks {
        r.render(&mut s);
    }
    sites(&mut s, snap, a, opts.top, &opts.frames);
    timeline(&mut s, snap, a);
    if let Some((d, earlier)) = diff {
        diff_section(&mut s, d, earlier);
    }
    diagnosis(&mut s, a);
    next_steps(&mut s, a, diff.is_some());
    uncertainty(&mut s, a);
    s
}

fn totals(s: &mut String, a: &Analysis) {
    let o = &a.totals.overall;
    let _ = writeln!(s, "Totals");
    let _ = writeln!(
        s,
        "  reserved (Σ segment total_size)   {} {M}",
        b(o.reserved)
    );
    let _ = writeln!(
        s,
        "  live tensors (active_allocated)   {} {M}; requested {} {M}, rounding slack {} {M}",
        b(o.allocated),
        b(o.requested),
        b(o.allocated.saturating_sub(o.requested))
    );
    let _ = writeln!(
        s,
        "  freed, awaiting other streams     {} {M}",
        b(o.pending_free)
    );
    let _ = writeln!(
        s,
        "  inactive cache (reusable)         {} {M}; largest inactive block {} {M}",
        b(o.inactive),
        o.largest_inactive.map(b).unwrap_or_else(|| "none".into())
    );
    let _ = writeln!(
        s,
        "  segments                          {} {M} ({} expandable, {} holding inactive blocks)",
        o.segment_count, o.expandable_segments, o.segments_with_inactive
    );
    if o.inactive > 0 {
        let _ = writeln!(
            s,
            "  empty_cache() would return        {} in {} wholly inactive segments {M}; the rest of the \
             inactive cache is reused by PyTorch but stays reserved (nvidia-smi counts it)",
            fmt_bytes(o.releasable.1),
            o.releasable.0
        );
    }
    if a.totals.trace_present {
        let _ = writeln!(
            s,
            "  trace entries                     {} {M}{}",
            a.totals.trace_entries(),
            if a.totals.dropped_trace_entries > 0 {
                format!(
                    "; {} oldest entries dropped by --max-trace-events {M}",
                    a.totals.dropped_trace_entries
                )
            } else {
                String::new()
            }
        );
        if let Some((dev, idx, bytes)) = a.totals.overall_peak() {
            let _ = writeln!(
                s,
                "  trace-relative peak               {} at entry #{idx} of device {dev} {M} \
                 (running sum of alloc − free_completed from the first recorded entry)",
                if bytes < 0 {
                    format!("-{}", b(bytes.unsigned_abs()))
                } else {
                    b(bytes as u64)
                }
            );
        }
        for t in &a.timeline.devices {
            if t.live_peak > 0 && t.live_peak_index.is_some() {
                let _ = writeln!(
                    s,
                    "  live peak, device {}               ≈ {} {I} (snapshot state replayed back through the trace)",
                    t.device,
                    b(t.live_peak as u64)
                );
            }
        }
    } else {
        let _ = writeln!(s, "  trace                             none recorded {R}");
    }
    let used: Vec<_> = a
        .totals
        .devices
        .iter()
        .filter(|d| d.memory.segment_count > 0 || d.trace.as_ref().is_some_and(|t| t.entries > 0))
        .collect();
    if used.len() > 1 {
        for d in used {
            let _ = writeln!(
                s,
                "  device {}: reserved {} · live {} · inactive {} · {} trace entries {M}",
                d.device,
                fmt_bytes(d.memory.reserved),
                fmt_bytes(d.memory.allocated),
                fmt_bytes(d.memory.inactive),
                d.trace.as_ref().map(|t| t.entries).unwrap_or(0)
            );
        }
    }
    s.push('\n');
}

fn sites(
    s: &mut String,
    snap: &Snapshot,
    a: &Analysis,
    top: usize,
    opts_frames: &crate::source::frames::FrameFilter,
) {
    let allocated = a.totals.overall.allocated;
    let _ = writeln!(s, "Top sites (share of live memory)");
    if a.sites.sites.is_empty() {
        let _ = writeln!(s, "  no live tensor blocks {M}\n");
        return;
    }
    for (i, site) in a.sites.sites.iter().take(top).enumerate() {
        let role = crate::torch::site_role(a, site);
        let _ = writeln!(
            s,
            "  {:>2}. {:>5}  {:>10}  {:>5} blocks  {}  {M}{}",
            i + 1,
            pct(site.percent_of(allocated)),
            fmt_bytes(site.bytes),
            site.blocks,
            site.site,
            if role == "unknown" {
                String::new()
            } else {
                format!("  role: {role} {I}")
            }
        );
        if site.kind == SiteKind::PythonFallback {
            let _ = writeln!(
                s,
                "        (no user frame in the stack: first Python frame shown)"
            );
        }
        let frames = stack_locations(snap, site.stack, site.key);
        // The callers in the user's own code say which loop or model part owns the memory.
        let callers = frames
            .iter()
            .skip(1)
            .filter(|l| opts_frames.classify(&l.file) == crate::source::frames::FrameKind::User);
        for l in callers.take(2) {
            let _ = writeln!(
                s,
                "        called from {}:{} {}",
                l.file, l.line, l.function
            );
        }
    }
    if a.sites.sites.len() > top {
        let _ = writeln!(
            s,
            "  … {} more sites {M}",
            a.sites.sites.len().saturating_sub(top)
        );
    }
    s.push('\n');
}

fn timeline(s: &mut String, snap: &Snapshot, a: &Analysis) {
    let _ = writeln!(s, "Free timeline");
    if !a.totals.trace_present || a.timeline.devices.is_empty() {
        let _ = writeln!(
            s,
            "  no trace entries: when blocks were freed cannot be told from this file {R}\n"
        );
        return;
    }
    for t in &a.timeline.devices {
        let _ = writeln!(
            s,
            "  device {}: {} allocs, {} free_requested, {} free_completed {M}",
            t.device, t.allocs, t.free_requested, t.free_completed
        );
        if t.frees_of_older_blocks > 0 {
            let _ = writeln!(
                s,
                "    {} frees of blocks allocated before the recorded window {M}",
                t.frees_of_older_blocks
            );
        }
        let pending = t.pending.iter().fold(0u64, |x, p| x.saturating_add(p.size));
        let _ = writeln!(
            s,
            "    pending frees (requested, never completed): {} ({}) {M}; delayed frees (completed later): {} ({}) {M}",
            t.pending.len(),
            fmt_bytes(pending),
            t.delayed.count,
            fmt_bytes(t.delayed.bytes)
        );
        let segs = [
            ("segment_alloc", t.segment_allocs),
            ("segment_free", t.segment_frees),
            ("segment_map", t.segment_maps),
            ("segment_unmap", t.segment_unmaps),
        ];
        let seg_text: Vec<String> = segs
            .iter()
            .filter(|(_, (n, _))| *n > 0)
            .map(|(k, (n, by))| format!("{n} {k} ({})", fmt_bytes(*by)))
            .collect();
        if !seg_text.is_empty() {
            let _ = writeln!(s, "    segments: {} {M}", seg_text.join(", "));
        }
        let repeating: Vec<_> = t
            .sites
            .iter()
            .filter(|x| x.retained >= 3 && x.retained_parts() >= 3)
            .take(3)
            .collect();
        for r in repeating {
            let _ = writeln!(
                s,
                "    repeats without frees: {} — {} allocs, {} freed, {} live, in {} of {} parts {M}",
                site_string(snap, r.key),
                r.allocs,
                r.freed,
                r.retained,
                r.retained_parts(),
                crate::torch::timeline::WINDOWS
            );
        }
        if let Some(burst) = &t.burst
            && burst.frees >= 8
        {
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
    let ooms = a.totals.oom_events().count();
    if ooms > 4 {
        let _ = writeln!(s, "  {ooms} OOM events; the first 4: {M}");
    }
    for o in a.totals.oom_events().take(4) {
        let _ = writeln!(
            s,
            "  OOM on device {} at entry #{}: request {} {R}, device_free {} {R}, at {}",
            o.device,
            o.index,
            b(o.size),
            o.device_free
                .map(b)
                .unwrap_or_else(|| "not recorded".into()),
            o.site
        );
        if let Some(set) = a
            .timeline
            .device(o.device)
            .and_then(|t| t.oom_sets.iter().find(|x| x.index == o.index))
        {
            let _ = writeln!(
                s,
                "    live just before: {} in {} blocks {M}",
                fmt_bytes(set.bytes),
                set.blocks
            );
            for (k, by, n, _) in set.sites.iter().take(3) {
                let _ = writeln!(
                    s,
                    "      {:>5}  {}  {} blocks  {} {M}",
                    pct(percent(*by, set.bytes)),
                    fmt_bytes(*by),
                    n,
                    site_string(snap, *k)
                );
            }
        }
    }
    if a.totals.oom_events().next().is_none() {
        let _ = writeln!(s, "  no OOM event in the trace {M}");
    }
    s.push('\n');
}

fn diff_section(s: &mut String, d: &Diff, earlier: &Path) {
    let _ = writeln!(s, "Growth since {}", earlier.display());
    let _ = writeln!(
        s,
        "  live {} → {} {M}; reserved {} → {} {M}",
        fmt_bytes(d.allocated_before),
        fmt_bytes(d.allocated_after),
        fmt_bytes(d.reserved_before),
        fmt_bytes(d.reserved_after)
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
            crate::findings::fmt_signed_bytes(g.byte_delta()),
            fmt_bytes(g.bytes_after),
            g.block_delta(),
            g.site
        );
    }
    s.push('\n');
}

fn diagnosis(s: &mut String, a: &Analysis) {
    let _ = writeln!(s, "Diagnosis");
    let real: Vec<_> = a
        .findings
        .iter()
        .filter(|f| f.code != Code::PT001)
        .collect();
    if real.is_empty() {
        let _ = writeln!(
            s,
            "  no leak, retention or OOM pattern matches this snapshot's evidence {I}"
        );
    }
    for f in &a.findings {
        let _ = writeln!(
            s,
            "  {} {} ({}): {} {I}",
            f.code,
            f.code.pattern(),
            f.severity.as_str(),
            f.message
        );
        for e in &f.evidence {
            let _ = writeln!(s, "      [{}] {}", e.label.as_str(), e.text);
        }
    }
    s.push('\n');
}

fn next_steps(s: &mut String, a: &Analysis, have_diff: bool) {
    let _ = writeln!(s, "Next steps");
    let mut n = 0;
    for f in a.findings.iter().filter(|f| f.code != Code::PT001) {
        let at = f
            .location
            .as_ref()
            .map(|l| format!("{}:{}", l.file, l.line))
            .unwrap_or_else(|| "(no user frame)".into());
        for fix in &f.fixes {
            n += 1;

            let _ = writeln!(
                s,
                "  {n}. {} [{}] {at}: {}{}{}",
                f.code,
                f.severity.as_str(),
                fix.title,
                fix.saving_bytes
                    .map(|v| format!("; saves ≈ {} {I}", fmt_bytes(v)))
                    .unwrap_or_default(),
                fix.cost
                    .as_ref()
                    .map(|c| format!("; costs {c} {I}"))
                    .unwrap_or_default()
            );
        }
    }
    let leaky = a.findings.iter().any(|f| f.code.is_leak());
    if !a.totals.trace_present || a.totals.trace_entries() <= 1 {
        n += 1;
        let _ = writeln!(
            s,
            "  {n}. Next snapshot: record history first — `torch.cuda.memory._record_memory_history(max_entries=100000)` \
             before the run, `torch.cuda.memory._dump_snapshot(\"snap.pickle\")` after"
        );
    }
    if !have_diff {
        n += 1;
        let _ = writeln!(
            s,
            "  {n}. {}: dump two snapshots k steps apart at the same point (right after optimizer.step(), \
             after the first step) and run `memlsp report early.pickle --diff late.pickle`",
            if leaky {
                "Confirm the leak"
            } else {
                "To check for growth across steps"
            }
        );
    }
    if a.totals.oom_events().next().is_none() {
        n += 1;
        let _ = writeln!(
            s,
            "  {n}. If the job runs out of memory, dump at the failure: \
             `torch._C._cuda_attach_out_of_memory_observer(lambda d, a, t, f: torch.cuda.memory._dump_snapshot(\"oom.pickle\"))`"
        );
    }
    s.push('\n');
}

fn uncertainty(s: &mut String, a: &Analysis) {
    let _ = writeln!(s, "Uncertainty");
    let o = &a.totals.overall;
    if !a.totals.trace_present {
        let _ = writeln!(
            s,
            "  - no trace (memory history was not recorded): this file cannot say when blocks were allocated or \
             freed, what the peak was, whether frees were delayed, or whether anything repeats per step"
        );
    } else if a.totals.trace_entries() <= 1 {
        let _ = writeln!(
            s,
            "  - the trace holds {} entry (legacy `_record_memory_history(True)` keeps one): no history of frees \
             or peaks can be read from it",
            a.totals.trace_entries()
        );
    }
    let nostack = a.sites.by_kind[2].1.saturating_add(a.sites.by_kind[3].1);
    if nostack > 0 {
        let _ = writeln!(
            s,
            "  - {} of live memory ({}) has no Python stack {M} (allocated before recording started, with \
             context disabled, or on autograd's backward thread): it is listed as <no stack>",
            fmt_bytes(nostack),
            pct(percent(nostack, o.allocated))
        );
    }
    let older: u64 = a
        .timeline
        .devices
        .iter()
        .map(|t| t.frees_of_older_blocks)
        .sum();
    if older > 0 || a.totals.dropped_trace_entries > 0 {
        let _ = writeln!(
            s,
            "  - the trace starts mid-run ({} frees of blocks allocated earlier{}): trace-relative peaks start at 0 \
             whatever was already live",
            older,
            if a.totals.dropped_trace_entries > 0 {
                format!(
                    "; {} oldest entries dropped by --max-trace-events",
                    a.totals.dropped_trace_entries
                )
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(
        s,
        "  - only PyTorch's caching allocator is visible: NCCL, cuDNN/cuBLAS workspaces and direct cudaMalloc \
         are not; compare `torch.cuda.device_memory_used()` or nvidia-smi with the {} reserved here {M}",
        fmt_bytes(o.reserved)
    );
    let _ = writeln!(
        s,
        "  - roles (parameter, activation, optimizer state, …) are guessed from stack frames {I}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch::analyze_snapshot;
    use crate::torch::model::BlockState;
    use crate::torch::stacks::tests::intern;
    use crate::torch::totals::tests::{block, segment};

    #[test]
    fn sections_come_in_the_seed_order_and_name_what_a_trace_less_file_cannot_answer() {
        let mut snap = Snapshot::default();
        let st = intern(
            &mut snap,
            &[
                (
                    "/v/site-packages/torch/nn/modules/linear.py",
                    125,
                    "forward",
                ),
                ("/u/model.py", 12, "forward"),
                (
                    "/v/site-packages/torch/nn/modules/module.py",
                    1747,
                    "_call_impl",
                ),
                ("/u/train.py", 40, "main"),
            ],
        );
        let mut b = block(3 << 20, (3 << 20) - 100, BlockState::ActiveAllocated);
        b.stack = Some(st);
        snap.segments = vec![segment(
            0,
            1 << 30,
            vec![b, block(1 << 20, 0, BlockState::Inactive)],
        )];
        let opts = Options::default();
        let a = analyze_snapshot(&snap, &opts);
        let text = render(&snap, &a, &opts, None, None);
        let order = [
            "Totals",
            "Top sites",
            "Free timeline",
            "Diagnosis",
            "Next steps",
            "Uncertainty",
        ];
        let pos: Vec<usize> = order.iter().filter_map(|s| text.find(s)).collect();
        assert_eq!(pos.len(), order.len(), "{text}");
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert!(
            text.contains("100.0%    3.00 MiB"),
            "one site holds all live memory: {text}"
        );
        assert!(text.contains("called from /u/train.py:40 main"), "{text}");
        assert!(
            !text.contains("_call_impl"),
            "framework callers are skipped: {text}"
        );
        assert!(text.contains("no trace (memory history was not recorded)"));
        assert!(text.contains("_record_memory_history(max_entries=100000)"));
        // Every line with a byte count carries a label.
        for line in text
            .lines()
            .filter(|l| l.contains(" B)") || l.contains("MiB"))
        {
            assert!(
                line.contains("[measured]")
                    || line.contains("[read]")
                    || line.contains("[inferred]"),
                "unlabelled number: {line}"
            );
        }
        assert_eq!(
            summary_sentence(&snap, &a),
            "3.00 MiB live in 4.00 MiB reserved on 1 device(s); the largest site is /u/model.py:12 with 100.0% of it, no problem pattern found."
        );
    }
}
