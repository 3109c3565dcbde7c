//! PT016: the autocast weight cache holds a large share of the peak.
//!
//! Inside `torch.autocast`, every fp32 weight that requires grad is cast to the lower precision
//! on first use and the copy is cached until the autocast region exits; `autocast.__exit__`
//! clears the cache (`clear_autocast_cache`). Those frees carry the exit on their own stack
//! (`torch::release`, cause `AutocastCache`), so the bytes the cache held at the peak are counted,
//! not guessed. A bf16 forward can then peak higher than the fp32 one.

use rustc_hash::FxHashMap;

use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};
use crate::torch::Analysis;
use crate::torch::model::{Action, Snapshot, StackId};
use crate::torch::release::Cause;
use crate::torch::sites::percent;
use crate::torch::stacks::culprit;
use crate::torch::stacks::{SiteKey, site_string};

/// The cache must hold at least this share of the peak (percent).
const MIN_SHARE: u64 = 10;

/// PT016 on the device whose peak the autocast cache holds the most of.
pub fn detect(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    if a.releases.blocks().get(Cause::AutocastCache).count == 0 {
        return;
    }
    let best = a
        .timeline
        .devices
        .iter()
        .filter_map(|t| t.peak_set.as_ref().map(|p| (t, p)))
        .map(|(t, p)| {
            let held = a.releases.held_at(snap, &a.stacks, t.device, p.index, None);
            (t, p, held.released.get(Cause::AutocastCache))
        })
        .max_by_key(|(t, _, h)| (h.bytes, std::cmp::Reverse(t.device)));
    let Some((t, set, held)) = best else {
        return;
    };
    if held.bytes == 0 || held.bytes.saturating_mul(100) < set.bytes.saturating_mul(MIN_SHARE) {
        return;
    }
    let all = a
        .releases
        .device(t.device)
        .map(|d| d.blocks.get(Cause::AutocastCache))
        .unwrap_or_default();
    let (key, stack) = exit_site(snap, a, t.device);
    let (loc, st) = culprit(snap, key, stack);
    let mut f = Finding::new(
        Code::PT016,
        Severity::Warning,
        format!(
            "The autocast weight cache held {} of the {} live at the peak ({}): weights cast to \
             the lower precision are kept until the autocast region exits.",
            fmt_bytes(held.bytes),
            fmt_bytes(set.bytes),
            pct(percent(held.bytes, set.bytes)),
        ),
    )
    .at(loc, st)
    .bytes(held.bytes, percent(held.bytes, set.bytes), Label::Measured)
    .evidence(Evidence::measured(format!(
        "at the trace peak (before entry #{} of device {}): {} live",
        set.index,
        t.device,
        fmt_bytes(set.bytes)
    )))
    .evidence(Evidence::measured(format!(
        "{} blocks ({}) live at the peak were later freed by autocast's exit clearing its cache \
         (clear_autocast_cache / autocast.__exit__ on their free stacks)",
        held.count,
        fmt_bytes(held.bytes)
    )))
    .evidence(Evidence::measured(format!(
        "in the whole trace the cache was cleared of {} blocks ({}) at {}",
        all.count,
        fmt_bytes(all.bytes),
        site_string(snap, key)
    )))
    .evidence(Evidence::inferred(
        "without the cache each weight is cast when used and freed after: at most the cache's \
         bytes at the peak are saved, for one extra cast per use",
    ))
    .fix(
        Fix::advice(
            "For inference, cast the model once (`model.to(torch.bfloat16)`) and run without \
             autocast; otherwise `torch.autocast(\"cuda\", dtype=torch.bfloat16, \
             cache_enabled=False)`",
        )
        .saving(held.bytes)
        .cost("with cache_enabled=False, one cast per weight use"),
    );
    f.scope = Some(format!("device {}", t.device));
    out.push(f);
}

/// The user line on the cache-clearing free stacks (the `with torch.autocast(…)` block), by
/// bytes.
fn exit_site(snap: &Snapshot, a: &Analysis, device: i64) -> (SiteKey, Option<StackId>) {
    let mut by: FxHashMap<SiteKey, (u64, Option<StackId>)> = FxHashMap::default();
    for e in snap.trace(device) {
        if e.action == Action::FreeRequested && a.releases.cause(e.stack()) == Cause::AutocastCache
        {
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

fn pct(p: Option<f64>) -> String {
    p.map(|p| format!("{p:.1}%")).unwrap_or_else(|| "–".into())
}
