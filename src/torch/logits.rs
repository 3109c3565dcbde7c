//! PT019: the loss over a large vocabulary — the B×T×V logits and the copies the loss makes of
//! them (log-softmax, the cross-entropy's intermediates) — holds a large share of the peak.
//!
//! The loss's own blocks are found by their stacks: a frame named `cross_entropy`,
//! `log_softmax`, `nll_loss` or `logsumexp` (Python or C++). The largest of them, S, is B×T×V at
//! the loss's dtype; the group is every block live at the trace peak of size S or S/2 (the same
//! logits in bf16), wherever it was made — the logits themselves come from the model's head, not
//! the loss; of those made elsewhere, only the last two before the loss's first block (fp32
//! logits and a bf16 copy) count. Sizes near S are not taken: activations of similar size are
//! common. That those equal-sized blocks are logits is inferred from their size; their bytes
//! are counted. The saving is bounded, not replayed: a chunked loss keeps one chunk of each copy.
//! The finding goes on the user's call of the loss (see [`loss_call`]).

use rustc_hash::FxHashMap;

use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};
use crate::frames::{FrameFilter, FrameKind};
use crate::torch::Analysis;
use crate::torch::model::{FrameId, Snapshot, StackId};
use crate::torch::sites::percent;
use crate::torch::stacks::culprit;

/// The group must hold at least this share of the peak (percent).
const MIN_SHARE: u64 = 10;

pub(crate) fn is_loss(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["cross_entropy", "log_softmax", "nll_loss", "logsumexp"]
        .iter()
        .any(|w| n.contains(w))
}

struct Group {
    device: i64,
    index: u64,
    peak: u64,
    /// The largest loss block (B×T×V at the loss's dtype).
    largest: u64,
    /// Blocks made under a loss frame: (bytes, count).
    loss: (u64, u64),
    /// Blocks of logits size made elsewhere (the logits): (bytes, count).
    logits: (u64, u64),
    /// The largest loss block's stack, for the location.
    stack: Option<StackId>,
}

impl Group {
    fn bytes(&self) -> u64 {
        self.loss.0.saturating_add(self.logits.0)
    }
}

/// PT019 on the device whose peak the loss group holds the most of.
pub fn detect(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    // The group starts from the largest block made under a loss: without a loss frame on any
    // stack there is none, and no live set to walk.
    if !snap.any_stack_has(|f| is_loss(&f.name)) {
        return;
    }
    let mut best: Option<Group> = None;
    for t in &a.timeline.devices {
        let Some(set) = &t.peak_set else {
            continue;
        };
        if let Some(g) = group(snap, a, t.device, set.index as usize, set.bytes)
            && best.as_ref().is_none_or(|b| g.bytes() > b.bytes())
        {
            best = Some(g);
        }
    }
    let Some(g) = best else {
        return;
    };
    if g.bytes().saturating_mul(100) < g.peak.saturating_mul(MIN_SHARE) {
        return;
    }
    out.push(finding(snap, a, &g));
}

fn group(snap: &Snapshot, a: &Analysis, device: i64, k: usize, peak: u64) -> Option<Group> {
    let trace = snap.trace(device);
    let live = crate::torch::attention::peak_live(&a.peak_live, trace, device, k);
    let mut is: FxHashMap<StackId, bool> = FxHashMap::default();
    let mut under_loss = |st: Option<StackId>| -> bool {
        st.is_some_and(|st| {
            *is.entry(st)
                .or_insert_with(|| snap.stack_frames(Some(st)).any(|f| is_loss(&f.name)))
        })
    };
    // The largest loss block; of equal ones the first made (the map's order is the hash's).
    let mut largest = 0;
    let mut first = usize::MAX;
    let mut stack = None;
    for &i in live.values() {
        let e = &trace[i];
        if (e.size > largest || (e.size == largest && i < first)) && under_loss(e.stack()) {
            largest = e.size;
            first = i;
            stack = e.stack();
        }
    }
    if largest == 0 {
        return None;
    }
    let mut g = Group {
        device,
        index: k as u64,
        peak,
        largest,
        loss: (0, 0),
        logits: (0, 0),
        stack,
    };
    // The loss's blocks, and the candidates for the logits: made elsewhere before the loss ran.
    let mut first_loss = usize::MAX;
    let mut elsewhere = Vec::new();
    for &i in live.values() {
        let e = &trace[i];
        if e.size != largest && e.size.saturating_mul(2) != largest {
            continue;
        }
        if under_loss(e.stack()) {
            g.loss.0 = g.loss.0.saturating_add(e.size);
            g.loss.1 += 1;
            first_loss = first_loss.min(i);
        } else {
            elsewhere.push(i);
        }
    }
    // The logits are the last one or two (fp32 and a bf16 copy) made before the loss: other
    // blocks of the same size are activations that happen to match.
    elsewhere.retain(|&i| i < first_loss);
    elsewhere.sort_unstable_by(|a, b| b.cmp(a));
    for &i in elsewhere.iter().take(2) {
        g.logits.0 = g.logits.0.saturating_add(trace[i].size);
        g.logits.1 += 1;
    }
    Some(g)
}

fn finding(snap: &Snapshot, a: &Analysis, g: &Group) -> Finding {
    let bytes = g.bytes();
    let share = percent(bytes, g.peak);
    let key = loss_call(snap, g.stack).or(a.stacks.site(g.stack).0);
    let (loc, st) = culprit(snap, key, g.stack);
    let mut f = Finding::new(
        Code::PT019,
        Severity::Warning,
        format!(
            "The loss over the vocabulary holds {} of the {} live at the peak ({}): the B×T×V \
             logits and the loss's copies of them are alive at once.",
            fmt_bytes(bytes),
            fmt_bytes(g.peak),
            pct(share)
        ),
    )
    .at(loc, st)
    .bytes(bytes, share, Label::Measured)
    .evidence(Evidence::measured(format!(
        "at the trace peak (before entry #{} of device {}): {} live",
        g.index,
        g.device,
        fmt_bytes(g.peak)
    )))
    .evidence(Evidence::measured(format!(
        "{} blocks ({}) live at the peak were made by the loss (cross_entropy / log_softmax / \
         nll_loss / logsumexp frames on their stacks); the largest is {}",
        g.loss.1,
        fmt_bytes(g.loss.0),
        fmt_bytes(g.largest)
    )))
    .evidence(Evidence::measured(format!(
        "{} more blocks ({}) of the same size were made elsewhere just before the loss",
        g.logits.1,
        fmt_bytes(g.logits.0)
    )))
    .evidence(Evidence::inferred(
        "blocks of the loss's largest size are B×T×V tensors: the logits (made by the model's \
         head) and their copies; a chunked loss keeps one chunk of each copy at a time",
    ));
    f = f.fix(
        Fix::advice(
            "Compute the loss in chunks of tokens (or use a fused linear + cross-entropy loss, or \
             `torch.compile` the loss) so the full B×T×V log-probabilities are never alive; keep \
             the logits in bf16 and upcast per chunk",
        )
        .saving(g.loss.0)
        .cost("a loop over chunks, or a fused-loss dependency"),
    );
    f = f.evidence(Evidence::inferred(format!(
        "at most the loss's copies at the peak ({}) are saved by chunking; the logits ({}) only \
         by a fused head and loss",
        fmt_bytes(g.loss.0),
        fmt_bytes(g.logits.0)
    )));
    f.scope = Some(format!("device {}", g.device));
    f
}

/// The user's line that calls the loss: the first user frame outside the outermost loss frame.
/// A hand-written `log_softmax` (MAGMA27's `nn_utils.py`) would otherwise be blamed at one of
/// its own lines, not at the `cross_entropy(logits, …)` call where the loss is chunked.
fn loss_call(snap: &Snapshot, stack: Option<StackId>) -> Option<FrameId> {
    let ids = snap.stacks.get(stack? as usize)?;
    let frame = |f: FrameId| snap.frames.get(f as usize);
    let outer = ids
        .iter()
        .rposition(|&f| frame(f).is_some_and(|fr| is_loss(&fr.name)))?;
    let filter = FrameFilter::default();
    ids[outer + 1..]
        .iter()
        .copied()
        .find(|&f| frame(f).is_some_and(|fr| filter.classify(&fr.filename) == FrameKind::User))
}

fn pct(p: Option<f64>) -> String {
    p.map(|p| format!("{p:.1}%")).unwrap_or_else(|| "–".into())
}

#[cfg(test)]
mod tests {
    use crate::options::AnalysisOptions;
    use crate::torch::analyse;
    use crate::torch::model::{Action, BlockState, Snapshot};
    use crate::torch::stacks::tests::intern;
    use crate::torch::totals::tests::{block, entry, segment};

    /// One forward: `acts` activations of 1 MiB, then the logits (`v` bytes, at the head) and
    /// the loss's log-softmax (`v` bytes), all freed after the peak.
    fn step(acts: u64, v: u64) -> Vec<crate::findings::Finding> {
        let mut snap = Snapshot::default();
        let act = intern(&mut snap, &[("/u/model.py", 30, "forward")]);
        let head = intern(&mut snap, &[("/u/model.py", 40, "forward")]);
        let loss = intern(
            &mut snap,
            &[
                (
                    "/v/site-packages/torch/nn/functional.py",
                    3053,
                    "cross_entropy",
                ),
                ("/u/train.py", 12, "train"),
            ],
        );
        let mut list = Vec::new();
        let mut push = |addr: u64, size: u64, st| {
            let mut e = entry(Action::Alloc, addr, size);
            e.set_stack(Some(st));
            list.push(e);
        };
        for k in 0..acts {
            push(0x1000 + k, 1 << 20, act);
        }
        push(0x9000, v, head);
        push(0x9001, v, loss);
        // A near-size activation is not taken for the logits.
        push(0x9002, v - 4096, act);
        let mut frees = Vec::new();
        for addr in (0x1000..0x1000 + acts).chain([0x9000, 0x9001, 0x9002]) {
            let size = match addr {
                0x9000 | 0x9001 => v,
                0x9002 => v - 4096,
                _ => 1 << 20,
            };
            frees.push(entry(Action::FreeRequested, addr, size));
            frees.push(entry(Action::FreeCompleted, addr, size));
        }
        list.extend(frees);
        snap.device_traces = Some(vec![list]);
        snap.segments = vec![segment(
            0,
            1 << 30,
            vec![block(1 << 30, 1 << 30, BlockState::Inactive)],
        )];
        analyse(&snap, &AnalysisOptions::default()).findings
    }

    #[test]
    fn logits_and_their_loss_copy_fire_only_as_a_large_share_of_the_peak() {
        // 2 × 8 MiB of 8 + 16 + 8 MiB live (≈ 50 %): PT019, the loss copy as the saving.
        let f = step(8, 8 << 20);
        let p = f
            .iter()
            .find(|f| f.code.as_str() == "PT019")
            .expect("PT019");
        assert_eq!(p.bytes, Some(16 << 20));
        assert_eq!(p.fixes[0].saving_bytes, Some(8 << 20));
        assert!(p.evidence.iter().any(|e| {
            e.text
                .starts_with("1 more blocks (8.00 MiB) of the same size")
        }));
        // 2 × 1 MiB of 200 + 2 + 1 MiB live (1 %): nothing, though 200 activations have the
        // logits' size (only the last block made before the loss counts as the logits).
        let f = step(200, 1 << 20);
        assert!(f.iter().all(|f| f.code.as_str() != "PT019"));
    }
}
