//! What a fix saves, simulated: each PyTorch fix turned into a change of the recorded trace and
//! replayed through the allocator model (`replay`), on devices where the unchanged replay
//! reproduces the recorded segment events. The result goes on the fix (`Fix::simulated`).
//!
//! The changes, per pattern:
//! - PT002 (retained graph): every never-freed allocation of the repeating activation sites and
//!   of the kept loss is freed as long after its allocation as the same site's freed
//!   allocations lived (the other steps' lifetime).
//! - PT003 (container): each appended tensor is freed when the next step appends again.
//! - PT005 (activation pressure): per-layer checkpointing as the user writes it, or
//!   `inference_mode` for a forward with no backward (`torch::replay::sim_checkpoint`, over the layer
//!   calls of `torch::layer_calls`); the simulated saving replaces the finding's estimate, so
//!   the finding shows one after-number.
//! - PT008 (fragmentation OOM): `expandable_segments:True` and `max_split_size_mb:N` for a few N;
//!   the fix names the smallest N that avoids the OOM.
//! - PT010 (pending frees): each pending free completes when it is requested.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::findings::{Code, Evidence, Finding, FixKind, Label, OomRetries, Simulated, fmt_bytes};
use crate::torch::Analysis;
use crate::torch::model::{Action, FrameId, Snapshot, TraceEntry};
use crate::torch::replay::{self, Change, WhatIf};
use crate::torch::stacks::{Role, SiteKey};
use crate::torch::timeline::DeviceTimeline;

/// One allocation of a device trace: its `alloc` entry and the entries that freed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Life {
    alloc: usize,
    free_requested: Option<usize>,
    free_completed: Option<usize>,
}

/// Every allocation of a trace by site, or (`only`: by stack, whether its site is wanted) the
/// allocations of some sites: the same lives for those sites as the whole map has.
fn lives(
    trace: &[TraceEntry],
    a: &Analysis,
    only: Option<&[bool]>,
) -> FxHashMap<SiteKey, Vec<Life>> {
    let mut open: FxHashMap<u64, (SiteKey, usize)> = FxHashMap::default();
    let mut out: FxHashMap<SiteKey, Vec<Life>> = FxHashMap::default();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                if let Some(wanted) = only {
                    let stack = e.stack();
                    if stack.is_none_or(|s| wanted.get(s as usize) != Some(&true)) {
                        // The whole map would file this address under another site now.
                        if !open.is_empty() {
                            open.remove(&e.addr);
                        }
                        continue;
                    }
                }
                let key = a.stacks.site(e.stack()).0;
                let v = out.entry(key).or_default();
                open.insert(e.addr, (key, v.len()));
                v.push(Life {
                    alloc: i,
                    free_requested: None,
                    free_completed: None,
                });
            }
            Action::FreeRequested => {
                if let Some(&(k, j)) = open.get(&e.addr)
                    && let Some(l) = out.get_mut(&k).and_then(|v| v.get_mut(j))
                {
                    l.free_requested.get_or_insert(i);
                }
            }
            Action::FreeCompleted => {
                if let Some((k, j)) = open.remove(&e.addr)
                    && let Some(l) = out.get_mut(&k).and_then(|v| v.get_mut(j))
                {
                    l.free_completed = Some(i);
                }
            }
            _ => {}
        }
    }
    out
}

/// PT002's change frees these sites' kept allocations: activations retained three times or more.
fn kept_activations(t: &DeviceTimeline) -> impl Iterator<Item = FrameId> + '_ {
    t.sites
        .iter()
        .filter(|s| s.role == Role::Activation && s.retained >= 3)
        .filter_map(|s| s.key)
}

/// The sites a finding's change reads the lives of (`None`: every site's).
///
/// A finding names its site by place (`key_of`), which the whole map answers with the first of
/// its keys at that place: the keys of the snapshot's stacks at the place are looked up here,
/// and where more than one is there, the whole map is made so that the same one is found.
fn sites_read(f: &Finding, snap: &Snapshot, a: &Analysis, device: i64) -> Option<Vec<FrameId>> {
    let at_place = || -> Option<Vec<FrameId>> {
        let Some(l) = f.location.as_ref() else {
            return Some(Vec::new());
        };
        let keys: Vec<FrameId> = a
            .stacks
            .site_keys()
            .filter(|&k| crate::torch::stacks::location(snap, k).is_some_and(|x| x.same_place(l)))
            .collect();
        (keys.len() <= 1).then_some(keys)
    };
    match f.code {
        Code::PT002 => {
            let mut keys = at_place()?;
            if let Some(t) = a.timeline.device(device) {
                keys.extend(kept_activations(t));
            }
            Some(keys)
        }
        Code::PT003 => at_place(),
        Code::PT005 => Some(Vec::new()),
        _ => None,
    }
}

/// The device a finding is about (`device N` scope), else the first with a trace.
fn device_of(f: &Finding, snap: &Snapshot) -> Option<i64> {
    if let Some(d) = f
        .scope
        .as_deref()
        .and_then(|s| s.strip_prefix("device "))
        .and_then(|d| d.parse().ok())
    {
        return Some(d);
    }
    let traces = snap.device_traces.as_ref()?;
    traces.iter().position(|t| !t.is_empty()).map(|d| d as i64)
}

fn median(mut v: Vec<usize>) -> Option<usize> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[v.len() / 2])
}

/// Free each never-freed allocation of `sites` as long after its allocation as the site's freed
/// allocations lived (else `fallback` entries later).
fn free_like_the_others(
    lives: &FxHashMap<SiteKey, Vec<Life>>,
    sites: &[SiteKey],
    fallback: Option<usize>,
    end: usize,
) -> Vec<Change> {
    let mut by_at: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
    for key in sites {
        let Some(v) = lives.get(key) else { continue };
        let life = median(
            v.iter()
                .filter_map(|l| l.free_completed.map(|f| f - l.alloc))
                .collect(),
        )
        .or(fallback);
        let Some(life) = life else { continue };
        for l in v.iter().filter(|l| l.free_completed.is_none()) {
            let at = l.alloc.saturating_add(life.max(1));
            if at < end {
                by_at.entry(at).or_default().push(l.alloc);
            }
        }
    }
    by_at
        .into_iter()
        .map(|(at, allocs)| Change::FreeEarly { allocs, at })
        .collect()
}

pub(crate) fn simulated(w: &WhatIf, change: &str) -> Option<Simulated> {
    w.simulated.then(|| Simulated {
        device: w.device,
        peak_allocated_before: w.peak_allocated_before,
        peak_allocated_after: w.peak_allocated_after,
        peak_reserved_before: w.peak_reserved_before,
        peak_reserved_after: w.peak_reserved_after,
        oom_avoided: (!w.ooms.is_empty())
            .then(|| w.ooms.iter().all(|o| o.fits_after) && w.new_ooms == 0),
        oom_retries: (w.retries_before > 0 || w.retries_after > 0).then_some(OomRetries {
            before: w.retries_before,
            after: w.retries_after,
        }),
        change: change.to_string(),
    })
}

/// The changes a finding's main fix makes to the trace, and the words for them.
fn changes_for(
    f: &Finding,
    snap: &Snapshot,
    a: &Analysis,
    trace: &[TraceEntry],
    lives: &FxHashMap<SiteKey, Vec<Life>>,
    device: i64,
) -> Option<(Vec<Change>, String)> {
    let end = trace.len();
    let key_of = |f: &Finding| -> SiteKey {
        let l = f.location.as_ref()?;
        lives
            .keys()
            .copied()
            .flatten()
            .find(|k| crate::torch::stacks::location(snap, *k).is_some_and(|x| x.same_place(l)))
    };
    let t = a.timeline.device(device)?;
    match f.code {
        Code::PT002 => {
            let mut sites: Vec<SiteKey> = kept_activations(t).map(Some).collect();
            let lead = key_of(f);
            // The kept loss lives one step: until the next one is made.
            let step = lead
                .and_then(|k| lives.get(&Some(k)))
                .and_then(|v| median(v.windows(2).map(|w| w[1].alloc - w[0].alloc).collect()));
            if let Some(k) = lead {
                sites.push(Some(k));
            }
            let c = free_like_the_others(lives, &sites, step, end);
            (!c.is_empty()).then_some((
                c,
                "the kept activations and loss freed as long after they are made as in the other steps".to_string(),
            ))
        }
        Code::PT003 => {
            let v = lives.get(&Some(key_of(f)?))?;
            let kept: Vec<&Life> = v.iter().filter(|l| l.free_completed.is_none()).collect();
            let c: Vec<Change> = kept
                .windows(2)
                .map(|w| Change::FreeEarly {
                    allocs: vec![w[0].alloc],
                    at: w[1].alloc,
                })
                .collect();
            (!c.is_empty()).then_some((
                c,
                "each appended tensor freed when the next step appends".to_string(),
            ))
        }
        Code::PT005 => {
            // The fix as written: per-layer checkpointing, or inference_mode for a forward
            // with no backward (`torch::replay::sim_checkpoint`), over the layer calls of the forward
            // holding the peak (or the OOM). Without repeated calls there is no layer to
            // checkpoint: no simulation, the finding states a bound.
            let index = t
                .oom_sets
                .first()
                .or(t.peak_set.as_ref())
                .map(|s| s.index as usize)?;
            let layers = crate::torch::layer_calls::at(snap, a, device, index as u64)?;
            let fix = if f.fixes.iter().any(|x| x.kind == FixKind::InferenceMode) {
                crate::torch::replay::sim_checkpoint::Fix::InferenceMode
            } else {
                crate::torch::replay::sim_checkpoint::Fix::Checkpoint
            };
            let c =
                crate::torch::replay::sim_checkpoint::changes(snap, a, trace, index, &layers, fix);
            let words = match fix {
                crate::torch::replay::sim_checkpoint::Fix::Checkpoint => {
                    "each layer call checkpointed: its saved tensors dropped when it returns (its output kept) and made again together just before the backward's first use (one layer at a time)"
                }
                crate::torch::replay::sim_checkpoint::Fix::InferenceMode => {
                    "the tensors the graph held freed when their layer call returns (inference_mode frees them at their last use, no later)"
                }
            };
            // A trace that ends at the OOM holds no backward: the figure is the forward's.
            let tail = if t.oom_sets.is_empty() {
                ""
            } else {
                "; the trace ends at the OOM, so the backward (one layer recomputed at a time) is not in this figure"
            };
            (!c.is_empty()).then(|| (c, format!("{words}{tail}")))
        }
        Code::PT010 => {
            // The allocation each free request is about (one trace entry frees one block).
            let freed: FxHashMap<usize, usize> = lives
                .values()
                .flatten()
                .filter_map(|l| Some((l.free_requested?, l.alloc)))
                .collect();
            let mut c = Vec::new();
            for p in &t.pending {
                if let Some(&alloc) = freed.get(&(p.index as usize)) {
                    c.push(Change::FreeEarly {
                        allocs: vec![alloc],
                        at: (p.index as usize).saturating_add(1),
                    });
                }
            }
            (!c.is_empty()).then_some((
                c,
                "each pending free completed when it is requested".to_string(),
            ))
        }
        _ => None,
    }
}

/// PT013 on a device whose capacity is read from its refusals (no OOM recorded): the range
/// its capacity lies in, beside the retry. Where the releases carry no stack (PT013 cannot
/// read the retry path from them), the validated replay's refusals make the finding.
fn near_oom_capacity(snap: &Snapshot, a: &Analysis, findings: &mut Vec<Finding>) {
    for device in replay::traced_devices(snap) {
        if findings
            .iter()
            .any(|f| f.code == Code::PT013 && device_of(f, snap) == Some(device))
        {
            continue;
        }
        let r = a.replays.device(snap, device);
        if let Some(range) = r.capacity_read {
            findings.extend(crate::torch::near_oom::from_replay(
                snap,
                a,
                device,
                &r.refusals,
                range,
            ));
        }
    }
    for f in findings.iter_mut().filter(|f| f.code == Code::PT013) {
        let Some(device) = device_of(f, snap) else {
            continue;
        };
        let Some((low, high)) = a.replays.device(snap, device).capacity_read else {
            continue;
        };
        f.evidence.push(Evidence::inferred(format!(
            "the device gave this process between {} and {}: the most reserved it granted and \
             the least it refused (the allocator replay reproduces the run at both)",
            fmt_bytes(low),
            fmt_bytes(high)
        )));
        // The setting the advice names, replayed at both ends of that range.
        let w = a
            .replays
            .what_if(snap, device, &[Change::ExpandableSegments(true)]);
        if w.simulated {
            f.evidence.push(Evidence::new(
                Label::Simulated,
                format!(
                    "with `expandable_segments:True`, on a device of {} and of {}: the allocator \
                     takes the OOM path at most {} time(s) ({} in the recorded run), {} new \
                     OOM(s); peak reserved {} → up to {}",
                    fmt_bytes(low),
                    fmt_bytes(high),
                    w.retries_after,
                    w.retries_before,
                    w.new_ooms,
                    fmt_bytes(w.peak_reserved_before),
                    fmt_bytes(w.peak_reserved_after)
                ),
            ));
            // The advice names the setting to avoid the OOM path: not where the replay takes
            // it as often or more.
            if w.retries_after >= w.retries_before
                && let Some(fix) = f.fixes.first_mut()
            {
                fix.title = crate::torch::near_oom::advice_without_the_setting();
            }
        }
    }
}

/// Simulate the fixes of `findings` (PT002, PT003, PT005, PT008, PT010), and give PT013 the
/// capacity a device's refusals show.
pub fn simulate(snap: &Snapshot, a: &Analysis, findings: &mut Vec<Finding>) {
    fixes(snap, a, findings);
    // After the fixes' replays: asking for a device's validation waits for it, and the fixes'
    // replays run beside it.
    near_oom_capacity(snap, a, findings);
}

/// The fixes' replays.
fn fixes(snap: &Snapshot, a: &Analysis, findings: &mut [Finding]) {
    let wanted = [
        Code::PT002,
        Code::PT003,
        Code::PT005,
        Code::PT008,
        Code::PT010,
    ];
    if !findings.iter().any(|f| wanted.contains(&f.code)) {
        return;
    }
    let traces = match &snap.device_traces {
        Some(t) => t,
        None => return,
    };
    // The findings to simulate, with their device and its trace.
    let targets: Vec<(usize, i64, &[TraceEntry])> = findings
        .iter()
        .enumerate()
        .filter(|(_, f)| wanted.contains(&f.code))
        .filter_map(|(i, f)| {
            let device = device_of(f, snap)?;
            let trace = traces.get(usize::try_from(device).ok()?)?;
            Some((i, device, &trace[..]))
        })
        .collect();
    // The sites each device's changes read (`None`: all): a trace of millions of allocations
    // is paired up for a few sites, not for all of them.
    let mut read: FxHashMap<i64, Option<FxHashSet<FrameId>>> = FxHashMap::default();
    for &(i, device, _) in &targets {
        let f = &findings[i];
        if f.code == Code::PT008 {
            continue;
        }
        let sites = sites_read(f, snap, a, device);
        let r = read
            .entry(device)
            .or_insert_with(|| Some(FxHashSet::default()));
        match (r.as_mut(), sites) {
            (Some(set), Some(keys)) => set.extend(keys),
            _ => *r = None,
        }
    }
    let mut cache: FxHashMap<i64, FxHashMap<SiteKey, Vec<Life>>> = FxHashMap::default();
    // The replays to run: (finding, device, changes, words).
    let mut jobs: Vec<(usize, i64, Vec<Change>, String)> = Vec::new();
    for &(i, device, trace) in &targets {
        let f = &mut findings[i];
        if f.code == Code::PT008 {
            settings_for_oom(snap, &a.replays, device, f);
            continue;
        }
        // Its replay would not be offered (the findings stay as they are): no lives to
        // pair up, which on a trace that does not fit its segments is a map of every address.
        if a.replays.known_not_to_validate(device) {
            continue;
        }
        let lv = cache.entry(device).or_insert_with(|| {
            let only = read
                .get(&device)
                .and_then(|r| r.as_ref())
                .map(|keys| a.stacks.stacks_at(keys));
            lives(trace, a, only.as_deref())
        });
        if let Some((changes, words)) = changes_for(f, snap, a, trace, lv, device) {
            jobs.push((i, device, changes, words));
        }
    }
    drop(cache);
    // Each what-if is its own replay of the whole trace: on a large one they share the cores.
    let entries: usize = jobs
        .iter()
        .map(|j| traces.get(j.1 as usize).map_or(0, Vec::len))
        .sum();
    let results: Vec<WhatIf> =
        if jobs.len() > 1 && entries >= crate::torch::PARALLEL_FROM && crate::torch::parallel() {
            // Two workers take the next job until none is left (one, if the thread cannot start).
            let next = std::sync::atomic::AtomicUsize::new(0);
            let work = || {
                let mut done = Vec::new();
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((_, device, changes, _)) = jobs.get(k) else {
                        break;
                    };
                    done.push((k, a.replays.what_if(snap, *device, changes)));
                }
                done
            };
            let mut done = std::thread::scope(|sc| {
                let other = std::thread::Builder::new()
                    .name("memlsp-what-if".into())
                    .spawn_scoped(sc, work);
                let mut done = work();
                if let Ok(h) = other {
                    done.extend(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
                }
                done
            });
            done.sort_unstable_by_key(|d| d.0);
            done.into_iter().map(|d| d.1).collect()
        } else {
            jobs.iter()
                .map(|(_, device, changes, _)| a.replays.what_if(snap, *device, changes))
                .collect()
        };
    for ((i, _, _, words), w) in jobs.iter().zip(results) {
        let f = &mut findings[*i];
        let Some(sim) = simulated(&w, words) else {
            continue;
        };
        // The fixes that make the change: the edits (`loss.detach()`, `.item()`), else the
        // finding's main advice (checkpointing, synchronising the stream).
        // PT005 replays one fix: `inference_mode` where the finding offers it, else its
        // checkpoint advice; its other fixes (`del out`: one graph fewer) are not that change.
        let edits = f.fixes.iter().any(|x| x.kind != FixKind::Advice);
        let inference = f.fixes.iter().any(|x| x.kind == FixKind::InferenceMode);
        let pt005 = f.code == Code::PT005;
        for (i, fix) in f.fixes.iter_mut().enumerate() {
            let replayed = if pt005 {
                if inference {
                    fix.kind == FixKind::InferenceMode
                } else {
                    i == 0
                }
            } else {
                fix.kind != FixKind::Advice || (!edits && i == 0)
            };
            if replayed {
                fix.simulated = Some(sim.clone());
            }
        }
        if f.code == Code::PT005 {
            crate::torch::replay::sim_checkpoint::one_after_number(f);
        }
    }
}

/// PT008: which allocator settings avoid the recorded OOM; the `max_split_size_mb` fix names the
/// smallest N that does.
fn settings_for_oom(snap: &Snapshot, replays: &replay::Replays, device: i64, f: &mut Finding) {
    let advice = replays.advise_settings_for_oom(snap, device);
    if !advice.simulated {
        return;
    }
    for fix in &mut f.fixes {
        let FixKind::AllocConf { value } = &fix.kind else {
            continue;
        };
        let changes = if value.starts_with("expandable_segments") {
            vec![Change::ExpandableSegments(true)]
        } else if value.starts_with("max_split_size_mb") {
            let n = advice.smallest_max_split_size_mb;
            if let Some(n) = n {
                fix.kind = FixKind::AllocConf {
                    value: format!("max_split_size_mb:{n}"),
                };
                fix.title = format!(
                    "Then try PYTORCH_ALLOC_CONF=max_split_size_mb:{n} (the smallest of {} that avoids the OOM in the replay)",
                    replay::MAX_SPLIT_TRIALS_MB
                        .iter()
                        .map(|m| m.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            let mb = match &fix.kind {
                FixKind::AllocConf { value } => value
                    .strip_prefix("max_split_size_mb:")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                _ => 0,
            };
            vec![Change::MaxSplitSizeMb(mb)]
        } else {
            continue;
        };
        let w = replays.setting_what_if(snap, device, &changes);
        fix.simulated = simulated(
            &w,
            "the recorded requests replayed with this allocator setting",
        );
        let split = matches!(&fix.kind, FixKind::AllocConf { value } if value.starts_with("max_split_size_mb"));
        if split && advice.smallest_max_split_size_mb.is_none() {
            // No trial helps: say so instead of offering the edit.
            fix.kind = FixKind::Advice;
            fix.title = format!(
                "max_split_size_mb would not avoid this OOM: none of {} MiB did in the replay",
                replay::MAX_SPLIT_TRIALS_MB
                    .iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lives of some sites are the whole map's lives of those sites, on the leak fixtures
    /// whose sites reuse each other's addresses.
    #[test]
    fn lives_of_some_sites_are_those_of_the_whole_map() {
        for name in [
            "pt002_retained_graph.pickle",
            "pt003_growing_history.pickle",
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/torch")
                .join(name);
            let snap = crate::torch::load::load_snapshot(&path, &Default::default()).unwrap();
            let a = crate::torch::analyse(&snap, &Default::default());
            let recorded = &snap.device_traces.as_ref().unwrap()[0];
            // And the trace with some frees lost (a corrupt file): an address is allocated again
            // while the whole map still has it open under another site.
            let mut n = 0;
            let lossy: Vec<TraceEntry> = recorded
                .iter()
                .filter(|e| {
                    n += usize::from(e.action == Action::FreeCompleted);
                    !(e.action == Action::FreeCompleted && n % 5 == 0)
                })
                .cloned()
                .collect();
            for trace in [&recorded[..], &lossy[..]] {
                let all = lives(trace, &a, None);
                let keys: Vec<FrameId> = a.stacks.site_keys().collect();
                assert!(keys.len() > 3, "{name}: {} sites", keys.len());
                let mut reused = 0;
                for (i, &k) in keys.iter().enumerate() {
                    // One site, and that site with the next.
                    for set in [vec![k], keys[i..(i + 2).min(keys.len())].to_vec()] {
                        let wanted: FxHashSet<FrameId> = set.iter().copied().collect();
                        let some = lives(trace, &a, Some(&a.stacks.stacks_at(&wanted)));
                        let mut expected = all.clone();
                        expected.retain(|key, _| key.is_some_and(|k| wanted.contains(&k)));
                        assert_eq!(some, expected, "{name}: sites {set:?}");
                        reused += usize::from(
                            some.values().flatten().any(|l| l.free_completed.is_none()),
                        );
                    }
                }
                assert!(reused > 0, "{name}: some site keeps an allocation");
            }
        }
    }
}
