//! PT020: model states (parameters, gradients, optimizer state) as a share of the peak, with
//! what the expert's size fixes would take off: an 8-bit optimizer, sharding across ranks
//! (ZeRO / FSDP), bf16 model states.
//!
//! The bytes at the peak are measured (the live blocks at the trace's peak, by the role their
//! stack gives: `stacks::Role`, inferred). Parameters are rarely allocated inside the recorded
//! window (they are loaded before recording starts and have no stack), so their size is also
//! inferred from the optimizer: a state with two equal slots per parameter (Adam's `exp_avg` and
//! `exp_avg_sq`, which PyTorch keeps in the parameters' dtype) says one slot ≈ the parameters.
//! Every saving is an arithmetic bound on bytes, labelled inferred — never replayed.
//!
//! PT004 (`optim_state.rs`) says the optimizer state is expected retention; where PT020 fires it
//! owns the size advice, and PT004's first fix points here instead of repeating it.

use crate::findings::{Code, Evidence, Finding, Fix, Label, Location, Severity, fmt_bytes};
use crate::frames::FrameFilter;
use crate::torch::Analysis;
use crate::torch::model::Snapshot;
use crate::torch::optim_state;
use crate::torch::release::Cause;
use crate::torch::sites::percent;
use crate::torch::stacks::{Role, SiteKey, culprit, stack_locations};

/// Model states must be at least this share of the device's peak (percent). On the shared real
/// snapshots the optimizer-dominated training steps sit at 68–100 % (sidsoc12, kkaitlyn111
/// fullstep, notHanmin, bcrafton) and the activation-dominated ones at 27–45 % (Wedsonlin 1024,
/// NiuHuangxiaozi), where PT005 is the finding.
pub const MIN_SHARE_PERCENT: u64 = 50;

/// …and at least this many bytes: below a GiB no size fix is worth its cost (JasperSolt's
/// 0.1 GiB optimizer over one input tensor).
pub const MIN_BYTES: u64 = 1 << 30;

/// The model states of one device at its trace peak.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelStates {
    pub device: i64,
    /// Live bytes at the peak (measured).
    pub peak: u64,
    /// Optimizer-state role at the peak (measured bytes, role inferred).
    pub optimizer: u64,
    /// Gradient / backward role at the peak (measured bytes, role inferred).
    pub gradients: u64,
    /// Of `gradients`: blocks of other roles that `zero_grad` frees later (measured).
    pub gradients_by_zero_grad: u64,
    /// Parameter role at the peak (measured bytes, role inferred).
    pub parameters_seen: u64,
    /// Live at the peak without a role (mostly `<no stack>`: allocated before recording).
    pub unknown: u64,
    /// The optimizer state live at the dump, parameters re-created in the step left out.
    pub state_kept: u64,
    /// State slots per parameter read from the optimizer's sites (2 for Adam), when it shows.
    pub slots: Option<u64>,
    /// How the slots were seen, in words.
    pub slots_from: String,
    /// Where the state is allocated.
    pub site: SiteKey,
    pub stack: Option<crate::torch::model::StackId>,
}

impl ModelStates {
    /// Parameters: the identified ones, or one state slot when the optimizer shows its slots
    /// (bounded by the memory at the peak not otherwise attributed).
    pub fn parameters(&self) -> u64 {
        let per_slot = self.slots.map_or(0, |k| self.state_kept / k.max(1));
        let room = self
            .parameters_seen
            .saturating_add(self.optimizer_other())
            .saturating_add(self.unknown);
        self.parameters_seen.max(per_slot.min(room))
    }
    /// The optimizer's state at the peak: its role's bytes, at most the state kept at the dump.
    pub fn state(&self) -> u64 {
        self.optimizer.min(self.state_kept)
    }
    /// Blocks at the peak the optimizer made that are not its kept state (parameters rewritten
    /// by an earlier step, the step's temporaries).
    pub fn optimizer_other(&self) -> u64 {
        self.optimizer - self.state()
    }
    /// Whether the parameter bytes come from the optimizer's slots (inferred) rather than
    /// identified parameter blocks.
    pub fn parameters_inferred(&self) -> bool {
        self.parameters() > self.parameters_seen
    }
    pub fn total(&self) -> u64 {
        self.state()
            .saturating_add(self.gradients)
            .saturating_add(self.parameters())
    }
    pub fn fires(&self) -> bool {
        let t = self.total();
        self.optimizer > 0
            && self.state_kept > 0
            && t >= MIN_BYTES
            && t.saturating_mul(100) >= self.peak.saturating_mul(MIN_SHARE_PERCENT)
    }
}

/// The model states of every traced device, largest first.
/// `optim`: [`optim_state::compute_all`].
pub fn compute(
    snap: &Snapshot,
    a: &Analysis,
    optim: &[optim_state::OptimTrace],
) -> Vec<ModelStates> {
    let params: Vec<SiteKey> = optim
        .iter()
        .flat_map(|t| t.parameter_sites().map(|s| s.key))
        .collect();
    let mut out = Vec::new();
    for (t, ds) in a.timeline.devices.iter().zip(device_sites(a)) {
        let Some(set) = t.peak_set.as_ref() else {
            continue;
        };
        let state: Vec<_> = ds
            .iter()
            .filter(|s| s.role() == Role::OptimizerState && !params.contains(&s.key))
            .collect();
        let state_kept: u64 = state.iter().map(|s| s.bytes).sum();
        let (slots, slots_from) = slots(snap, &state);
        let first = state.first();
        // Blocks live at the peak that `zero_grad` frees later are gradients, whatever stack
        // made them (an optimizer that rewrites `p.grad`, gradients from before the window).
        let (grads_all, grads_backward, grads_opt) = match set.role(Role::OptimizerState) {
            0 => (0, 0, 0),
            _ => {
                let roles = [None, Some(Role::Backward), Some(Role::OptimizerState)];
                let held = a
                    .releases
                    .held_at_roles(snap, &a.stacks, t.device, set.index, &roles);
                let zero_grad = |i: usize| held[i].released.get(Cause::ZeroGrad).bytes;
                (zero_grad(0), zero_grad(1), zero_grad(2))
            }
        };
        let extra = grads_all.saturating_sub(grads_backward);
        out.push(ModelStates {
            device: t.device,
            peak: set.bytes,
            optimizer: set.role(Role::OptimizerState).saturating_sub(grads_opt),
            gradients: set.role(Role::Backward).saturating_add(extra),
            gradients_by_zero_grad: extra,
            parameters_seen: set.role(Role::Parameter),
            unknown: set
                .role(Role::Unknown)
                .saturating_sub(extra.saturating_sub(grads_opt)),
            state_kept,
            slots,
            slots_from,
            site: first.and_then(|s| s.key),
            stack: first.and_then(|s| s.stack),
        });
    }
    out.sort_by_key(|m| std::cmp::Reverse(m.total()));
    out
}

/// Each traced device's sites (the snapshot's per-device sites, in the timeline's order).
fn device_sites(a: &Analysis) -> Vec<&[crate::torch::sites::SiteStat]> {
    a.timeline
        .devices
        .iter()
        .map(|t| {
            a.totals
                .devices
                .iter()
                .position(|d| d.device == t.device)
                .and_then(|i| a.device_sites.get(i))
                .map_or(&[][..], |s| s.sites.as_slice())
        })
        .collect()
}

/// State slots per parameter: two or more state lines with the same number of blocks and about
/// the same bytes (one tensor per parameter each: Adam's `exp_avg` / `exp_avg_sq`), or an
/// optimizer named Adam on the stack of one line holding both.
fn slots(snap: &Snapshot, state: &[&crate::torch::sites::SiteStat]) -> (Option<u64>, String) {
    if let Some(top) = state.first() {
        let same: Vec<_> = state
            .iter()
            .filter(|s| {
                s.blocks == top.blocks
                    && s.bytes.abs_diff(top.bytes) <= top.bytes / 50
                    && s.blocks >= 2
            })
            .collect();
        if same.len() >= 2 {
            return (
                Some(same.len() as u64),
                format!(
                    "{} optimizer lines keep {} tensors each of about {} (one per parameter)",
                    same.len(),
                    top.blocks,
                    fmt_bytes(top.bytes)
                ),
            );
        }
        let adam = snap.stack_frames(top.stack).any(|f| {
            let (file, name) = (f.filename.to_ascii_lowercase(), f.name.to_ascii_lowercase());
            file.ends_with("adam.py") || file.ends_with("adamw.py") || name.contains("adam")
        });
        if adam && top.blocks >= 2 && top.blocks % 2 == 0 {
            return (
                Some(2),
                format!(
                    "Adam on the state's stack: {} tensors = exp_avg and exp_avg_sq per parameter",
                    top.blocks
                ),
            );
        }
    }
    (None, String::new())
}

/// Several devices or a distributed run: how many ranks the state could be sharded over.
fn ranks(a: &Analysis) -> Option<u64> {
    let traced = a.timeline.devices.len() as u64;
    (traced >= 2).then_some(traced)
}

fn pct(part: u64, whole: u64) -> String {
    percent(part, whole).map_or_else(|| "–".into(), |p| format!("{p:.1}%"))
}

/// The line PT020 is pinned to: the user's `optimizer.step()` call (the caller of the state
/// line when that line is inside a `step` of the user's own optimizer).
fn anchor(snap: &Snapshot, m: &ModelStates) -> (Option<Location>, Vec<Location>) {
    let (loc, stack) = culprit(snap, m.site, m.stack);
    let in_step = loc
        .as_ref()
        .is_some_and(|l| matches!(l.function.as_str(), "step" | "_init_group" | "update"));
    if !in_step {
        return (loc, stack);
    }
    let filter = FrameFilter::default();
    let caller = stack
        .iter()
        .skip(1)
        .position(|l| filter.is_user(&l.file) && l.function != "step");
    match caller {
        Some(i) => {
            let rest = stack_locations(snap, m.stack, m.site)
                .into_iter()
                .skip(i + 1)
                .collect::<Vec<_>>();
            (rest.first().cloned(), rest)
        }
        None => (loc, stack),
    }
}

/// PT020: model states are most of the peak; the size fixes and what each takes off at most.
pub fn detect(
    snap: &Snapshot,
    a: &Analysis,
    optim: &[optim_state::OptimTrace],
    out: &mut Vec<Finding>,
) {
    let Some(m) = compute(snap, a, optim).into_iter().find(ModelStates::fires) else {
        return;
    };
    let total = m.total();
    let params = m.parameters();
    let (loc, stack) = anchor(snap, &m);
    let mut f = Finding::new(
        Code::PT020,
        Severity::Information,
        format!(
            "Model states are {} of the {} peak on device {}: optimizer state {}{}, \
             parameters {}{} — their size, not a leak, sets the peak.",
            pct(total, m.peak),
            fmt_bytes(m.peak),
            m.device,
            fmt_bytes(m.state()),
            if m.gradients > 0 {
                format!(", gradients {}", fmt_bytes(m.gradients))
            } else {
                String::new()
            },
            if m.parameters_inferred() { "≈ " } else { "" },
            fmt_bytes(params),
        ),
    )
    .at(loc, stack)
    .bytes(total, percent(total, m.peak), Label::Inferred)
    .evidence(Evidence::inferred(format!(
        "live at the peak by role (bytes measured, roles from the stacks): optimizer state {} · \
         gradients {} · parameter {} · no role (mostly without a stack) {} of {}",
        fmt_bytes(m.optimizer),
        fmt_bytes(m.gradients),
        fmt_bytes(m.parameters_seen),
        fmt_bytes(m.unknown),
        fmt_bytes(m.peak),
    )));
    if m.gradients_by_zero_grad > 0 {
        f = f.evidence(Evidence::measured(format!(
            "{} of it is freed later by zero_grad (free stacks): counted as gradients",
            fmt_bytes(m.gradients_by_zero_grad)
        )));
    }
    if m.gradients == 0 {
        f = f.evidence(Evidence::measured(
            "no block live at the peak is a gradient by its stack or freed by zero_grad: \
             gradients made before recording started would be among the memory without a stack",
        ));
    }
    if !m.slots_from.is_empty() {
        f = f.evidence(Evidence::measured(m.slots_from.clone()));
    }
    if m.optimizer_other() > 0 {
        f = f.evidence(Evidence::inferred(format!(
            "{} of the optimizer's blocks at the peak are not the state it keeps to the end \
             (parameters an earlier step rewrote, or the step's temporaries)",
            fmt_bytes(m.optimizer_other())
        )));
    }
    if m.parameters_inferred() {
        f = f.evidence(Evidence::inferred(format!(
            "parameters ≈ one state slot ({}): the optimizer keeps {} tensors the size of each \
             parameter in its dtype; at most the {} at the peak with no role or made by the \
             optimizer outside its state",
            fmt_bytes(params),
            m.slots.unwrap_or(1),
            fmt_bytes(m.unknown.saturating_add(m.optimizer_other())),
        )));
    }
    f = f.evidence(Evidence::inferred(
        "model states stay for the whole run; activations and temporaries are the rest of the \
         peak",
    ));
    f.fixes = fixes(&m, ranks(a));
    // PT004 says the state is expected; the size advice is this finding's.
    for p in out.iter_mut().filter(|p| p.code == Code::PT004) {
        if let Some(first) = p.fixes.first_mut() {
            *first = Fix::advice(
                "Not a leak: the state stays as long as the optimizer. To make model states \
                 smaller see PT020 (8-bit optimizer, sharding, bf16)",
            );
        }
    }
    out.push(f);
}

/// The expert's size fixes, the largest safe one first, each with an arithmetic bound.
fn fixes(m: &ModelStates, ranks: Option<u64>) -> Vec<Fix> {
    let mut fixes = Vec::new();
    let params = m.parameters();
    if m.slots == Some(2) {
        let save = m.state_kept / 4 * 3;
        fixes.push(
            Fix::advice(format!(
                "Use an 8-bit optimizer (bitsandbytes `bnb.optim.AdamW8bit`): m and v at 1 byte \
                 per parameter each instead of 4 — at most {} less (¾ of the {} state if it is \
                 fp32, half if it is bf16)",
                fmt_bytes(save),
                fmt_bytes(m.state_kept)
            ))
            .saving(save)
            .cost("block-wise quantized moments; usually the same loss curve")
            .preferred(),
        );
    }
    match ranks {
        Some(n) => {
            let save_opt = m.state_kept - m.state_kept / n;
            fixes.push(
                Fix::advice(format!(
                    "Shard over the {n} devices: ZeRO-1 (`ZeroRedundancyOptimizer`) keeps \
                     optimizer state/{n} per rank ({} → {}, about {} less); ZeRO-2 also \
                     gradients/{n}, FSDP (`fully_shard`) also parameters/{n}",
                    fmt_bytes(m.state_kept),
                    fmt_bytes(m.state_kept / n),
                    fmt_bytes(save_opt),
                ))
                .saving(save_opt)
                .cost("communication each step"),
            );
        }
        None => fixes.push(Fix::advice(format!(
            "On N data-parallel GPUs: ZeRO-1 (`ZeroRedundancyOptimizer`) keeps optimizer state/N \
             per rank ({}/N), ZeRO-2 also gradients/N ({}/N), FSDP (`fully_shard`) also \
             parameters/N ({}/N)",
            fmt_bytes(m.state_kept),
            fmt_bytes(m.gradients),
            fmt_bytes(params),
        ))),
    }
    let half = m.total() / 2;
    fixes.push(
        Fix::advice(format!(
            "Keep parameters, gradients and optimizer state in bf16 (`model.to(torch.bfloat16)`; \
             PyTorch's optimizers keep their state in the parameters' dtype): at most {} less, \
             if they are fp32 now (the snapshot records no dtype); autocast alone does not \
             shrink them",
            fmt_bytes(half)
        ))
        .saving(half)
        .cost("bf16 updates lose small steps: use stochastic rounding or Kahan summation"),
    );
    fixes
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn adam(peak: u64, opt: u64, grads: u64, unknown: u64, kept: u64) -> ModelStates {
        ModelStates {
            peak,
            optimizer: opt,
            gradients: grads,
            unknown,
            state_kept: kept,
            slots: Some(2),
            ..ModelStates::default()
        }
    }

    #[test]
    fn parameters_are_one_adam_slot_bounded_by_the_memory_no_role_claims() {
        // sidsoc12's shape: m/v 25.38 GiB kept, 12.85 GiB without a stack.
        let m = adam(51 * GIB, 26 * GIB, 13 * GIB, 13 * GIB, 26 * GIB);
        assert_eq!(m.parameters(), 13 * GIB);
        assert!(m.parameters_inferred());
        assert_eq!(m.total(), 52 * GIB);
        // No room for them at the peak: never more than what no role claims.
        let m = adam(40 * GIB, 26 * GIB, 13 * GIB, GIB, 26 * GIB);
        assert_eq!(m.parameters(), GIB);
        // Without slots only identified parameter blocks count.
        let m = ModelStates {
            slots: None,
            parameters_seen: 2 * GIB,
            ..adam(40 * GIB, 26 * GIB, 13 * GIB, GIB, 26 * GIB)
        };
        assert_eq!(m.parameters(), 2 * GIB);
        assert!(!m.parameters_inferred());
    }

    #[test]
    fn fires_only_on_a_large_share_of_a_large_peak_with_optimizer_state() {
        // Optimizer-dominated step.
        assert!(adam(51 * GIB, 26 * GIB, 13 * GIB, 13 * GIB, 26 * GIB).fires());
        // Activation-dominated (Wedsonlin 1024: ~27 % of 22.55 GiB).
        assert!(!adam(22 * GIB, 3 * GIB, GIB, GIB, 3 * GIB).fires());
        // Too small to matter (JasperSolt: 0.1 GiB).
        assert!(!adam(100 << 20, 60 << 20, 0, 40 << 20, 60 << 20).fires());
        // No optimizer: gradients alone are a backward, not model states to shrink.
        assert!(!adam(3 * GIB, 0, 3 * GIB, 0, 0).fires());
    }

    #[test]
    fn the_fixes_are_bounds_and_sharding_says_per_rank_sizes() {
        let m = adam(51 * GIB, 24 * GIB, 12 * GIB, 12 * GIB, 24 * GIB);
        let one = fixes(&m, None);
        assert!(one[0].title.contains("AdamW8bit"), "{}", one[0].title);
        assert_eq!(one[0].saving_bytes, Some(18 * GIB));
        assert!(one[1].title.contains("state/N"), "{}", one[1].title);
        assert_eq!(one[1].saving_bytes, None);
        assert_eq!(one[2].saving_bytes, Some(24 * GIB));
        assert!(one.iter().all(|f| f.simulated.is_none()));
        let four = fixes(&m, Some(4));
        assert!(four[1].title.contains("state/4"), "{}", four[1].title);
        assert_eq!(four[1].saving_bytes, Some(18 * GIB));
    }
}
