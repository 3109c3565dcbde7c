//! PT005, the forward-only shape: a forward pass ran with autograd on and no backward ever ran.
//!
//! The evidence is the release stacks (`torch::release`): the graph's saved tensors were freed
//! by `SavedVariable::reset_data` / `release_variables` / `deleteNode` when a user line dropped
//! the output, and no free in the trace went through the autograd engine. Such a graph held its
//! activations for a backward that never came: `torch.inference_mode()` (or `no_grad`) saves
//! nothing. Checkpointing would be the wrong advice here.

use crate::findings::{Code, Evidence, Finding, Fix, FixKind, Label, Severity, fmt_bytes};
use crate::torch::Analysis;
use rustc_hash::FxHashMap;

use crate::torch::model::{Action, Snapshot, StackId};
use crate::torch::release::{Cause, GraphSeen};
use crate::torch::sites::percent;
use crate::torch::stacks::{Role, culprit};
use crate::torch::stacks::{SiteKey, site_string};

/// The graph must hold at least this share of the peak to be worth a finding.
const MIN_SHARE: u64 = 10;

/// PT005 (forward with no backward): the graph of a grad-enabled forward held memory at the peak.
pub fn detect(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    if a.releases.graph() != GraphSeen::DroppedWithoutBackward
        || a.totals.oom_events().next().is_some()
    {
        return;
    }
    let Some((t, set)) = a
        .timeline
        .devices
        .iter()
        .filter_map(|t| t.peak_set.as_ref().map(|p| (t, p)))
        .max_by_key(|(_, p)| p.bytes)
    else {
        return;
    };
    let held = a
        .releases
        .held_at(snap, &a.stacks, t.device, set.index, None);
    let graph = held.released.get(Cause::GraphDropped);
    if graph.bytes == 0 || graph.bytes.saturating_mul(100 / MIN_SHARE) < set.bytes {
        return;
    }
    let dropped = a.releases.blocks().get(Cause::GraphDropped);
    // Pinned where the output was dropped (the user frame on the graph's free stacks): the
    // line in the loop that runs the forward.
    let (key, stack) = dropping_site(snap, a, t.device);
    let (loc, st) = culprit(snap, key, stack);
    let mut f = Finding::new(
        Code::PT005,
        Severity::Information,
        format!(
            "A forward pass ran with autograd on and no backward: its graph held {} of the {} \
             live at the peak ({}) for a backward that never ran.",
            fmt_bytes(graph.bytes),
            fmt_bytes(set.bytes),
            pct(percent(graph.bytes, set.bytes)),
        ),
    )
    .at(loc, st)
    .bytes(
        graph.bytes,
        percent(graph.bytes, set.bytes),
        Label::Measured,
    )
    .evidence(Evidence::measured(format!(
        "at the trace peak (before entry #{} of device {}): {} live in {} blocks",
        set.index,
        t.device,
        fmt_bytes(set.bytes),
        set.blocks
    )))
    .evidence(Evidence::measured(format!(
        "{} blocks ({}) live at the peak were later freed by autograd releasing the graph \
         (SavedVariable::reset_data / release_variables / deleteNode on their free stacks)",
        graph.count,
        fmt_bytes(graph.bytes)
    )))
    .evidence(Evidence::measured(format!(
        "in the whole trace {} frees ({}) release a graph because its output was dropped; none \
         goes through the autograd engine: backward never ran",
        dropped.count,
        fmt_bytes(dropped.bytes)
    )))
    .evidence(Evidence::measured(format!(
        "the graph's frees run at {} (where the output is dropped)",
        site_string(snap, key)
    )));
    // Two graphs at the peak: the previous iteration's output still referenced while the next
    // forward built its own graph (released only when the name is rebound).
    let drops = crate::torch::release::graph_drops_held_at(
        snap,
        &a.releases,
        &a.stacks,
        t.device,
        set.index,
    );
    let older = (drops.len() >= 2).then(|| drops[0]);
    // One graph released at the peak, and this forward's activations (made in the trace, live
    // at the peak) never freed in it: its own graph was alive too, to the end of the trace.
    let acts = a
        .releases
        .held_at(snap, &a.stacks, t.device, set.index, Some(Role::Activation));
    let alive = (older.is_none()
        && drops.len() == 1
        && acts.released.get(Cause::GraphDropped).bytes == 0
        && acts.kept.bytes.saturating_mul(100 / MIN_SHARE) >= set.bytes)
        .then_some(acts.kept);
    if let Some(alive) = alive {
        // Inferred: which blocks are activations is read from their stacks' roles.
        f = f
            .evidence(Evidence::inferred(format!(
                "none of the graph's {} released at the peak is an activation made in the \
                 trace, and {} activation blocks ({}) made in the trace and live at the peak are \
                 never freed in it",
                fmt_bytes(graph.bytes),
                alive.count,
                fmt_bytes(alive.bytes)
            )))
            .evidence(Evidence::inferred(
                "two graphs were alive at the peak: the previous iteration's, released when its \
                 output was rebound, and this forward's own, still alive when the trace ends",
            ));
    }
    if older.is_some() {
        f = f.evidence(Evidence::measured(format!(
            "{} graphs were alive at the peak: the next graph release freed {} of it and a later \
             one {} — the previous iteration's output was still referenced while the next \
             forward built its own graph",
            drops.len(),
            fmt_bytes(drops[0]),
            fmt_bytes(drops[1]),
        )));
    }
    f = f
        .evidence(Evidence::inferred(if alive.is_some() {
            "under inference_mode nothing is saved for backward: each activation is freed at its \
             last use, so neither graph holds anything"
        } else {
            "under inference_mode nothing is saved for backward: each activation is freed at its \
             last use, so at most the graph's bytes are saved"
        }))
        .fix(
            Fix::new(
                match alive {
                    // The live graph's tensors are saved too: the released one's bytes are the
                    // least it saves, not the most.
                    Some(alive) => format!(
                        "Run the forward under `with torch.inference_mode():` (or \
                         `torch.no_grad()`) — no backward uses the graphs it builds — saves {} \
                         and up to {} more (this forward's activations still alive)",
                        fmt_bytes(graph.bytes),
                        fmt_bytes(alive.bytes)
                    ),
                    None => format!(
                        "Run the forward under `with torch.inference_mode():` (or \
                         `torch.no_grad()`) — no backward uses the graph it builds — {} {}",
                        crate::torch::replay::sim_checkpoint::SAVES_AT_MOST,
                        fmt_bytes(graph.bytes)
                    ),
                },
                FixKind::InferenceMode,
            )
            .saving(graph.bytes)
            .cost("none when no gradient is needed"),
        );
    let older = older.or(alive.map(|_| graph.bytes));
    if let Some(older) = older {
        f = f.fix(
            Fix::new(
                "If the graph is needed: `del out` (drop the previous output) before the next \
                 forward, so one graph is alive at a time",
                FixKind::DropOutput,
            )
            .saving(older),
        );
    }
    f.scope = Some(format!("device {}", t.device));
    out.push(f);
}

fn pct(p: Option<f64>) -> String {
    p.map(|p| format!("{p:.1}%")).unwrap_or_else(|| "–".into())
}

/// The site (and a stack) of the free stacks that released graphs by dropping an output, by
/// bytes.
fn dropping_site(snap: &Snapshot, a: &Analysis, device: i64) -> (SiteKey, Option<StackId>) {
    let mut by: FxHashMap<SiteKey, (u64, Option<StackId>)> = FxHashMap::default();
    for e in snap.trace(device) {
        if e.action == Action::FreeRequested && a.releases.cause(e.stack()) == Cause::GraphDropped {
            let (key, _) = a.stacks.site(e.stack());
            let v = by.entry(key).or_insert((0, e.stack()));
            v.0 = v.0.saturating_add(e.size);
        }
    }
    by.into_iter()
        .filter(|(k, _)| k.is_some())
        .max_by_key(|(k, (b, _))| (*b, std::cmp::Reverse(*k)))
        .map_or((None, None), |(k, (_, st))| (k, st))
}
