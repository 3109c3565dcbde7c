//! What the optimizer's allocations are, step by step (for PT004).
//!
//! A step is a run of allocations made under `torch/optim` (one per `optimizer.step()` that
//! allocates). Per site of the optimizer the trace says whether its tensors are made once and
//! kept (state created by the first step), re-made every step with the previous one freed (an
//! out-of-place update of the state: `m = b1 * m + …`), or re-made while the same line frees
//! the old storage inside `tensor.data = …` (`p.data = p.data - …`: the parameters re-created,
//! not state).

use rustc_hash::{FxHashMap, FxHashSet};

use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};
use crate::torch::Analysis;
use crate::torch::model::{Action, Snapshot};
use crate::torch::release::Releases;
use crate::torch::sites::percent;
use crate::torch::stacks::culprit;
use crate::torch::stacks::{Role, SiteKey, StackIndex, site_string};

/// One optimizer site in the trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OptimSite {
    pub key: SiteKey,
    pub allocs: u64,
    pub freed: u64,
    /// Steps (optimizer runs) in which the site allocated.
    pub steps: u64,
    /// Live at the end of the trace.
    pub kept: u64,
    pub kept_bytes: u64,
    /// Frees at this line inside `tensor.data = …` (the parameters re-created, read from the
    /// free stacks' `VariableHooks::set_data`).
    pub replaced_outside: u64,
}

/// The optimizer in one device trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OptimTrace {
    /// Optimizer runs (steps that allocate).
    pub steps: u64,
    /// Steps whose allocations are still live at the end.
    pub steps_kept: u64,
    pub sites: Vec<OptimSite>,
}

impl OptimTrace {
    /// Sites that re-create tensors made outside the optimizer: parameters, not state.
    pub fn parameter_sites(&self) -> impl Iterator<Item = &OptimSite> {
        self.sites
            .iter()
            .filter(|s| s.replaced_outside > 0 && s.kept > 0)
    }
    /// State sites re-made every step (each step allocates all its kept tensors again and the
    /// previous ones are freed).
    pub fn remade_every_step(&self) -> impl Iterator<Item = &OptimSite> {
        self.sites.iter().filter(|s| {
            s.steps >= 2
                && s.kept > 0
                && s.freed >= s.kept
                && s.allocs >= s.steps.saturating_mul(s.kept)
                && s.replaced_outside == 0
        })
    }
}

/// [`compute`] for every traced device, in the timeline's order (what [`detect`] and
/// `model_states` read; computed once for both).
pub fn compute_all(snap: &Snapshot, a: &Analysis) -> Vec<OptimTrace> {
    a.timeline
        .devices
        .iter()
        .map(|t| compute(snap, &a.stacks, &a.releases, t.device))
        .collect()
}

/// Read the optimizer's steps from `device`'s trace.
pub fn compute(
    snap: &Snapshot,
    stacks: &StackIndex,
    releases: &Releases,
    device: i64,
) -> OptimTrace {
    let list = snap.trace(device);
    let mut out = OptimTrace::default();
    // Without an optimizer stack there are no steps, sites or kept state to read.
    if !stacks.has_role(Role::OptimizerState) {
        return out;
    }
    let mut by: FxHashMap<SiteKey, (OptimSite, u64)> = FxHashMap::default();
    // address → (step, site, size) of live optimizer allocations (another allocation at the
    // address removes it, as its free would).
    let mut live: FxHashMap<u64, (u64, SiteKey, u64)> = FxHashMap::default();
    let mut prev_opt = false;
    for e in list {
        match e.action {
            Action::Alloc => {
                let opt = stacks.role(e.stack()) == Role::OptimizerState;
                if opt && !prev_opt {
                    out.steps += 1;
                }
                prev_opt = opt;
                if opt {
                    let (key, _) = stacks.site(e.stack());
                    let s = by.entry(key).or_insert_with(|| {
                        (
                            OptimSite {
                                key,
                                ..OptimSite::default()
                            },
                            0,
                        )
                    });
                    s.0.allocs += 1;
                    if s.1 != out.steps {
                        s.1 = out.steps;
                        s.0.steps += 1;
                    }
                    live.insert(e.addr, (out.steps, key, e.size));
                } else {
                    live.remove(&e.addr);
                }
            }
            Action::FreeRequested => {
                if let Some((_, key, _)) = live.remove(&e.addr)
                    && let Some(s) = by.get_mut(&key)
                {
                    s.0.freed += 1;
                }
                if releases.sets_data(e.stack()) {
                    let (free_key, _) = stacks.site(e.stack());
                    if let Some(s) = by.get_mut(&free_key) {
                        s.0.replaced_outside += 1;
                    }
                }
            }
            _ => {}
        }
    }
    let mut kept_steps = FxHashSet::default();
    for (step, k, size) in live.values() {
        if let Some(s) = by.get_mut(k) {
            s.0.kept += 1;
            s.0.kept_bytes = s.0.kept_bytes.saturating_add(*size);
            kept_steps.insert(*step);
        }
    }
    out.steps_kept = kept_steps.len() as u64;
    out.sites = by.into_values().map(|(s, _)| s).collect();
    out.sites
        .sort_by(|a, b| b.kept_bytes.cmp(&a.kept_bytes).then(a.key.cmp(&b.key)));
    out
}

/// PT004: optimizer state is a large share of live memory and is expected retention.
pub fn detect(snap: &Snapshot, a: &Analysis, traces: &[OptimTrace], out: &mut Vec<Finding>) {
    let allocated = a.totals.overall.allocated;
    let params: Vec<&OptimSite> = traces.iter().flat_map(|t| t.parameter_sites()).collect();
    let is_param = |k: SiteKey| params.iter().any(|p| p.key == k);
    let state_sites: Vec<_> = a
        .sites
        .sites
        .iter()
        .filter(|s| s.role() == Role::OptimizerState && !is_param(s.key))
        .collect();
    let opt: u64 = state_sites.iter().map(|s| s.bytes).sum();
    if opt == 0 || allocated == 0 || opt.saturating_mul(10) < allocated {
        return;
    }
    // State kept from two or more steps grows: not the first-step pattern (PT003 looks at it).
    if traces.iter().any(|t| t.steps_kept >= 2) {
        return;
    }
    let Some(site) = state_sites.first() else {
        return;
    };
    let remade: Vec<&OptimSite> = traces
        .iter()
        .flat_map(|t| t.remade_every_step())
        .filter(|s| !is_param(s.key))
        .collect();
    let steps = traces.iter().map(|t| t.steps).max().unwrap_or(0);
    let (loc, stack) = culprit(snap, site.key, site.stack);
    let blocks: u64 = state_sites.iter().map(|s| s.blocks).sum();
    let when = if remade.is_empty() {
        "created by the first optimizer.step()"
    } else {
        "re-allocated by every optimizer.step() (an out-of-place update)"
    };
    let mut f = Finding::new(
        Code::PT004,
        Severity::Information,
        format!(
            "{} ({}) of live memory is optimizer state {when} at {} — expected retention, not a \
             leak.",
            fmt_bytes(opt),
            pct(percent(opt, allocated)),
            where_(snap, site.key),
        ),
    )
    .at(loc, stack)
    .bytes(opt, percent(opt, allocated), Label::Inferred)
    .evidence(Evidence::inferred(format!(
        "{blocks} live blocks ({opt} B) were allocated under torch/optim: optimizer state by the stack"
    )));
    for p in &params {
        f = f.evidence(Evidence::measured(format!(
            "{} live blocks ({}) from {} are parameters re-created in the step (`p.data = …`: \
             the old storage is freed through VariableHooks::set_data): not counted as state",
            p.kept,
            fmt_bytes(p.kept_bytes),
            site_string(snap, p.key),
        )));
    }
    let param_bytes = a.sites.role_total(Role::Parameter);
    if param_bytes > 0 {
        f = f.evidence(Evidence::inferred(format!(
            "optimizer state is {:.2}× the identified parameter memory ({}); Adam keeps two states \
             per parameter",
            opt as f64 / param_bytes as f64,
            fmt_bytes(param_bytes)
        )));
    }
    let traced: u64 = traces
        .iter()
        .flat_map(|t| &t.sites)
        .filter(|s| !is_param(s.key))
        .map(|s| s.allocs)
        .sum();
    let kept: u64 = traces
        .iter()
        .flat_map(|t| &t.sites)
        .filter(|s| !is_param(s.key))
        .map(|s| s.kept)
        .sum();
    let in_steps = if steps == 1 {
        "in the trace's only optimizer step".to_string()
    } else {
        format!("in {steps} optimizer steps")
    };
    f = f.evidence(Evidence::measured(if traced == 0 {
        "no optimizer allocation appears in the recorded trace: the state predates the window and \
         was not re-allocated since"
            .to_string()
    } else if kept == 0 {
        format!(
            "{traced} optimizer allocations {in_steps}, all freed again (temporaries of the \
             step): the {blocks} live state blocks predate the recorded window"
        )
    } else if !remade.is_empty() {
        format!(
            "{in_steps}, {} state lines made a new tensor each step and freed the previous one; \
             {kept} allocations of the last step are kept",
            remade.len(),
        )
    } else {
        format!(
            "{kept} optimizer allocations are kept, all made in one step ({}): allocated once, \
             then stable",
            if steps == 1 {
                "the trace's only optimizer step".to_string()
            } else {
                format!("of {steps} optimizer steps in the trace")
            }
        )
    }));
    f = f.evidence(Evidence::inferred(
        "optimizer state lives as long as the optimizer; it does not grow after the first step",
    ));
    f = f.fix(Fix::advice(
        "Not a leak. If it does not fit: a smaller model or batch, a lighter optimizer (SGD with \
         momentum, 8-bit Adam, Adafactor), or shard optimizer state (ZeRO / FSDP)",
    ));
    if !remade.is_empty() {
        f = f.fix(Fix::advice(
            "Update the state in place (`m.mul_(beta1).add_(grad, alpha=1 - beta1)`): an \
             out-of-place update holds the old and the new state at once during the step",
        ));
    }
    out.push(f);
}

fn pct(p: Option<f64>) -> String {
    p.map(|p| format!("{p:.1}%")).unwrap_or_else(|| "–".into())
}

fn where_(snap: &Snapshot, key: SiteKey) -> String {
    match key.and_then(|k| snap.frames.get(k as usize)) {
        Some(f) => format!("{}:{} ({})", f.filename, f.line, f.name),
        None => "an allocation without a Python stack".into(),
    }
}
