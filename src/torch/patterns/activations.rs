//! PT005: activations an autograd graph holds at the peak.

use super::*;

use crate::torch::replay::sim_checkpoint::SAVES_AT_MOST;

/// PT005: forward activations dominate the peak (or the OOM) and are freed after it.
pub(super) fn activation_pressure(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
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
    // The layers: the calls of the function the forward repeats (`torch::layer_calls`); without
    // a repeated call, the median count of live activation blocks per innermost Python line
    // (`torch::layers`), else per site. Checkpointing keeps about one layer's activations at a
    // time, and never less, so act − act/layers is at most what it saves.
    let calls = crate::torch::layer_calls::at(snap, a, t.device, set.index);
    let layers = match &calls {
        Some(c) => c.calls.len() as u64,
        None => crate::torch::layers::at(snap, a, t.device, set.index).unwrap_or_else(|| {
            let mut counts: Vec<u64> = act_sites.iter().map(|(_, _, n, _)| *n).collect();
            counts.sort_unstable();
            counts.get(counts.len() / 2).copied().unwrap_or(1).max(1)
        }),
    };
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
    let message = headline_message(oom, act, set.bytes);
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
    let (count, title) = checkpoint_words(calls.as_ref(), layers);
    f = f
        .evidence(Evidence::inferred(format!(
            "{count}; checkpointing each layer keeps at least one layer's activations at a time: \
             {SAVES_AT_MOST} {}",
            fmt_bytes(saving)
        )))
        .fix(
            Fix::advice(format!("{title} — {SAVES_AT_MOST} {}", fmt_bytes(saving)))
                .saving(saving)
                .cost(cost),
        );
    f.scope = Some(format!("device {}", t.device));
    out.push(f);
}

/// The finding's message: the activations' share of what was live at the OOM or the peak.
fn headline_message(oom: bool, act: u64, live: u64) -> String {
    if oom {
        format!(
            "Forward activations filled the device: {} of {} live when it ran out of memory ({}).",
            fmt_bytes(act),
            fmt_bytes(live),
            pct_text(percent(act, live)),
        )
    } else {
        format!(
            "Forward activations dominate peak memory: {} of {} live at the peak ({}), freed again \
         after it.",
            fmt_bytes(act),
            fmt_bytes(live),
            pct_text(percent(act, live)),
        )
    }
}

/// The layer count's evidence words and the checkpoint fix's title: the repeated calls where the
/// forward repeats a function, else the repeated lines.
fn checkpoint_words(
    calls: Option<&crate::torch::layer_calls::Layers>,
    layers: u64,
) -> (String, String) {
    match calls {
    Some(c) => (
        format!(
            "the forward calls {} {}× ({}; layers, from the repeated call structure)",
            c.function,
            layers,
            c.caller
                .as_deref()
                .map(|l| format!("from {l}"))
                .unwrap_or_else(|| "one call site".into())
        ),
        format!(
            "Checkpoint each layer: wrap the {layers} calls of `{}`{} in \
             `torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)`",
            c.function.rsplit(':').next().unwrap_or(&c.function),
            c.caller
                .as_deref()
                .map(|l| format!(" at {l}"))
                .unwrap_or_default()
        ),
    ),
    None => (
        format!("activation lines repeat about {layers}× (layers)"),
        "Wrap repeated blocks in `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`"
            .to_string(),
    ),
}
}
