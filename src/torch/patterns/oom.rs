//! PT009 for every OOM event, PT008 where the allocator state shows fragmentation.

use super::*;

/// PT009 for every OOM event, PT008 when the allocator state shows fragmentation.
pub(super) fn oom_findings(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
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
