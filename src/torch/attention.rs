//! PT018: materialised attention — the B×H×L×L scores and probabilities of a hand-written
//! attention are a large share of the peak.
//!
//! One attention is split over several lines (the `q·kᵀ` matmul, the mask, a softmax in a helper
//! file, the cast before `probs·v`), so no single line tops the site list and a projection line is
//! blamed instead. The sites are grouped here by the function that runs the softmax: every block
//! live at the trace peak whose stack passes through a `softmax` frame names its enclosing user
//! function (the attention, e.g. `scaled_dot_product_attention`; its name or file must say
//! `attention`/`attn`, so a softmax over a model's output is not taken for one); the group is every live block
//! whose stack passes through that function and whose size lies between half the largest softmax
//! block and that block (scores kept in fp32 and their bf16 casts are both B·H·L·L). Fused attention
//! (`F.scaled_dot_product_attention`) never writes these to memory: the fix is replayed with the
//! group's allocations never made, else bounded ("at most", inferred).
//!
//! Where no attention named as one holds enough of a peak, one written inline in a module's
//! `forward` of a `modeling_*.py` file (transformers' eager attention) is grouped the same way,
//! that `forward` told from the file's others by the line that calls it. The group's free
//! stacks after the peak say whether autograd kept the scores for a backward or the running
//! call dropped them.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::findings::{
    Code, Evidence, Finding, Fix, FixKind, Label, Severity, Simulated, fmt_bytes,
};
use crate::frames::{FrameFilter, FrameKind};
use crate::torch::Analysis;
use crate::torch::memo::Memo;
use crate::torch::model::{Action, FrameId, Snapshot, StackId, TraceEntry};
use crate::torch::release::{Cause, GraphSeen};
use crate::torch::replay::Change;
use crate::torch::sites::percent;
use crate::torch::stacks::culprit;

/// The grouped scores must hold at least this share of the peak (percent).
const MIN_SHARE: u64 = 10;

/// The attention function of a stack: (file, function) of the first user frame outside the
/// softmax, and the frame index (in the stack) of that frame.
type Scope = (String, String);

/// PT018 on the device whose peak the grouped attention scores hold the most of.
pub fn detect(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    if let Some(g) = a.attention.clone() {
        out.push(finding(snap, a, g));
    }
}

/// PT018's numbers (`torch.attention` in the JSON): the attention whose score-sized blocks hold
/// the most of a device's peak, when they hold at least [`MIN_SHARE`] percent of it.
pub fn scores(
    snap: &Snapshot,
    timeline: &crate::torch::timeline::Timeline,
    peak_live: &PeakLive,
) -> Option<Attention> {
    // Only blocks of stacks through a softmax can name an attention: without one, there is no
    // live set to walk.
    let softmax: Vec<bool> = snap.frames.iter().map(|f| is_softmax(&f.name)).collect();
    if !snap.any_stack_through(&softmax) {
        return None;
    }
    let flags = FrameFlags::of(snap, &FrameFilter::default(), softmax);
    type Grouping = fn(&Snapshot, &PeakLive, &FrameFlags, i64, usize, u64) -> Option<Attention>;
    // The group of the device whose peak it holds the most of, if it holds enough of it.
    let best = |group: Grouping| {
        let mut best: Option<Attention> = None;
        for t in &timeline.devices {
            let Some(set) = &t.peak_set else {
                continue;
            };
            let k = set.index as usize;
            if let Some(g) = group(snap, peak_live, &flags, t.device, k, set.bytes)
                && best.as_ref().is_none_or(|b| g.bytes > b.bytes)
            {
                best = Some(g);
            }
        }
        best.filter(|g| g.bytes.saturating_mul(100) >= g.peak_bytes.saturating_mul(MIN_SHARE))
    };
    // Without an attention named as one, one written inline in a module's `forward` (only
    // where such a function is on some stack: no walk over a trace that has none).
    let forwards = || {
        snap.frames
            .iter()
            .any(|f| module_forward(&f.filename, &f.name))
    };
    best(group_at_peak).or_else(|| forwards().then(|| best(forward_group_at_peak)).flatten())
}

/// One attention's score-sized blocks live at a device's peak (all measured from the trace).
#[derive(Clone, Debug, Serialize)]
pub struct Attention {
    pub device: i64,
    /// The trace index of the peak (live after entries `0..index`).
    pub peak_index: u64,
    pub peak_bytes: u64,
    /// The attention function (the enclosing user function of the softmax) and its file.
    pub function: String,
    pub file: String,
    /// The largest softmax block (B·H·L·L at the softmax's dtype).
    pub largest_softmax_bytes: u64,
    /// The score-sized blocks live at the peak.
    pub bytes: u64,
    pub blocks: u64,
    /// Per line of the function and innermost user line, bytes descending.
    pub lines: Vec<AttentionLine>,
    /// Score-sized allocations of the function over the whole trace.
    pub trace_allocs: u64,
    pub trace_alloc_bytes: u64,
    /// The attention is written inline in the `forward` of a module in a `modeling_*.py` file
    /// (transformers' eager attention), told from the file's other `forward`s by its caller.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub module_forward: bool,
    #[serde(skip)]
    caller: Option<(FrameId, Option<StackId>)>,
    #[serde(skip)]
    allocs: Vec<usize>,
    /// The `alloc` entries of the blocks live at the peak.
    #[serde(skip)]
    held: Vec<usize>,
}

impl Attention {
    /// Every score-sized allocation the attention makes in the trace (the forward of every
    /// step), `through` it by its stack: what the fused replacement never makes.
    fn take_trace_allocs(
        &mut self,
        trace: &[TraceEntry],
        mut through: impl FnMut(StackId) -> bool,
    ) {
        for (i, e) in trace.iter().enumerate() {
            if e.action == Action::Alloc
                && score_sized(e.size, self.largest_softmax_bytes)
                && e.stack().is_some_and(&mut through)
            {
                self.allocs.push(i);
                self.trace_alloc_bytes = self.trace_alloc_bytes.saturating_add(e.size);
            }
        }
        self.trace_allocs = self.allocs.len() as u64;
    }
}

/// One line of an attention's score-sized blocks at the peak.
#[derive(Clone, Debug, Serialize)]
pub struct AttentionLine {
    /// The line in the attention function.
    pub line: u64,
    /// The innermost user frame (`nn_utils.py:6`), shortened to its last two path parts.
    pub via: String,
    pub bytes: u64,
    pub blocks: u64,
}

/// Between half the largest softmax block (a bf16 copy of fp32 scores) and that block: the
/// softmax output is the largest block an attention makes, so anything larger is something else
/// (a graph network's edge softmax is tiny next to its node features).
fn score_sized(size: u64, largest: u64) -> bool {
    size <= largest && size.saturating_mul(2) >= largest
}

/// The function (or its file) is named as an attention: a softmax elsewhere (of a model's output,
/// of a classifier's logits) is not one.
fn names_attention(scope: &Scope) -> bool {
    let file = scope.0.rsplit(['/', '\\']).next().unwrap_or("");
    [scope.1.as_str(), file].iter().any(|n| {
        let n = n.to_ascii_lowercase();
        n.contains("attention") || n.contains("attn")
    })
}

fn is_softmax(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("softmax") && !n.contains("log_softmax") && !n.contains("logsoftmax")
}

fn user(filter: &FrameFilter, snap: &Snapshot, fid: FrameId) -> bool {
    snap.frames
        .get(fid as usize)
        .is_some_and(|f| filter.classify(&f.filename) == FrameKind::User)
}

/// [`live_in_window`] at a device's peak, by (device, index): computed once for PT018 and PT019
/// (both group the blocks live there) and cleared once the detectors ran.
pub type PeakLive = Memo<(i64, usize), FxHashMap<u64, usize>>;

/// [`live_in_window`] from `memo`.
pub(crate) fn peak_live(
    memo: &PeakLive,
    trace: &[TraceEntry],
    device: i64,
    k: usize,
) -> Arc<FxHashMap<u64, usize>> {
    let k = k.min(trace.len());
    memo.get_or((device, k), || live_in_window(trace, k))
}

/// [`peak_live`] at each `(device, k)` of `peaks`, made ahead (while another thread walks the
/// timeline) when PT018 will group the blocks there (a stack through a softmax) or `also`
/// (PT019 will: a stack through a loss).
pub(crate) fn warm_peak_live(snap: &Snapshot, memo: &PeakLive, peaks: &[(i64, u64)], also: bool) {
    let softmax: Vec<bool> = snap.frames.iter().map(|f| is_softmax(&f.name)).collect();
    if !also && !snap.any_stack_through(&softmax) {
        return;
    }
    for &(device, k) in peaks {
        peak_live(memo, snap.trace(device), device, k as usize);
    }
}

/// Blocks allocated in the window and live just before entry `k`: address → `alloc` index (the
/// activations a forward makes are all in the window; blocks from before it are not needed here).
fn live_in_window(trace: &[TraceEntry], k: usize) -> FxHashMap<u64, usize> {
    let mut live: FxHashMap<u64, usize> = FxHashMap::default();
    for (i, e) in trace[..k.min(trace.len())].iter().enumerate() {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, i);
            }
            Action::FreeCompleted => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    live
}

fn group_at_peak(
    snap: &Snapshot,
    memo: &PeakLive,
    flags: &FrameFlags,
    device: i64,
    k: usize,
    peak: u64,
) -> Option<Attention> {
    let trace = snap.trace(device);
    let k = k.min(trace.len());
    let live = peak_live(memo, trace, device, k);
    let candidates = candidates(snap, trace, &live, flags);
    if candidates.is_empty() {
        return None;
    }
    // A frame is in at most one candidate function (its file and name); a stack passes
    // through a candidate at its first frame there.
    let by_scope: FxHashMap<(&str, &str), usize> = candidates
        .iter()
        .enumerate()
        .map(|(c, (scope, _))| ((scope.0.as_str(), scope.1.as_str()), c))
        .collect();
    let cand_of: Vec<Option<usize>> = snap
        .frames
        .iter()
        .map(|f| {
            by_scope
                .get(&(f.filename.as_str(), f.name.as_str()))
                .copied()
        })
        .collect();
    let mut passes: FxHashMap<StackId, Vec<(usize, usize)>> = FxHashMap::default();
    // Every candidate's blocks from one pass over the live set (in its order, so each group
    // sees its blocks in the order a pass of its own would).
    let mut groups: Vec<Group> = candidates.iter().map(|_| Group::default()).collect();
    for &i in live.values() {
        let e = &trace[i];
        let Some(st) = e.stack() else { continue };
        let Some(ids) = snap.stacks.get(st as usize) else {
            continue;
        };
        for &(c, at) in passes_of(&mut passes, snap, &cand_of, st) {
            if score_sized(e.size, candidates[c].1) {
                groups[c].add(snap, flags, ids, at, (i, e));
            }
        }
    }
    // The largest group; of equal ones the first candidate.
    let mut best: Option<(usize, Attention)> = None;
    for (c, ((scope, s), group)) in candidates.iter().zip(groups).enumerate() {
        let g = group.attention(snap, device, k, peak, scope, *s);
        if best.as_ref().is_none_or(|(_, b)| g.bytes > b.bytes) {
            best = Some((c, g));
        }
    }
    let (c, mut g) = best?;
    g.take_trace_allocs(trace, |st| {
        passes_of(&mut passes, snap, &cand_of, st)
            .iter()
            .any(|h| h.0 == c)
    });
    Some(g)
}

/// What each frame is for the grouping, tested once per frame rather than once per block.
struct FrameFlags {
    softmax: Vec<bool>,
    user: Vec<bool>,
}

impl FrameFlags {
    fn of(snap: &Snapshot, filter: &FrameFilter, softmax: Vec<bool>) -> FrameFlags {
        FrameFlags {
            softmax,
            user: (0..snap.frames.len())
                .map(|f| user(filter, snap, f as FrameId))
                .collect(),
        }
    }
    fn softmax(&self, f: FrameId) -> bool {
        self.softmax.get(f as usize) == Some(&true)
    }
    fn user(&self, f: FrameId) -> bool {
        self.user.get(f as usize) == Some(&true)
    }
}

/// The attention functions of the live blocks' softmaxes (the first user frame outside the
/// softmax, named as an attention) with their largest softmax block, in the order of the map
/// they are gathered in (the first of equal groups wins, as it always has).
fn candidates(
    snap: &Snapshot,
    trace: &[TraceEntry],
    live: &FxHashMap<u64, usize>,
    flags: &FrameFlags,
) -> Vec<(Scope, u64)> {
    let mut scopes: FxHashMap<StackId, Option<Scope>> = FxHashMap::default();
    let mut largest: FxHashMap<Scope, u64> = FxHashMap::default();
    for &i in live.values() {
        let e = &trace[i];
        let Some(st) = e.stack() else { continue };
        let sc = scopes.entry(st).or_insert_with(|| {
            let ids = snap.stacks.get(st as usize)?;
            let at = ids.iter().position(|&f| flags.softmax(f))?;
            ids[at + 1..].iter().find_map(|&f| {
                let fr = snap.frames.get(f as usize)?;
                (flags.user(f) && !flags.softmax(f)).then(|| (fr.filename.clone(), fr.name.clone()))
            })
        });
        if let Some(sc) = sc {
            let m = largest.entry(sc.clone()).or_default();
            *m = (*m).max(e.size);
        }
    }
    largest
        .into_iter()
        .filter(|(scope, s)| *s != 0 && names_attention(scope))
        .collect()
}

/// One candidate's score-sized blocks live at the peak: bytes, per line of the function and
/// innermost user line, and per user caller of the function.
#[derive(Default)]
struct Group {
    bytes: u64,
    blocks: u64,
    /// By (line in the function, innermost user frame): the frame's `file:line` is written
    /// once per frame when the group is done, not once per block.
    lines: FxHashMap<(u64, Option<FrameId>), (u64, u64)>,
    callers: FxHashMap<FrameId, (u64, Option<StackId>)>,
    /// The blocks' `alloc` entries.
    held: Vec<usize>,
}

impl Group {
    /// Block `e` (allocated at entry `i`), whose stack `ids` passes through the function at
    /// position `at`.
    fn add(
        &mut self,
        snap: &Snapshot,
        flags: &FrameFlags,
        ids: &[FrameId],
        at: usize,
        (i, e): (usize, &TraceEntry),
    ) {
        self.held.push(i);
        self.bytes = self.bytes.saturating_add(e.size);
        self.blocks += 1;
        let line = snap.frames.get(ids[at] as usize).map_or(0, |f| f.line);
        let inner = ids.iter().copied().find(|&f| flags.user(f));
        let l = self.lines.entry((line, inner)).or_default();
        l.0 = l.0.saturating_add(e.size);
        l.1 += 1;
        if let Some(&cf) = ids[at + 1..].iter().find(|&&f| flags.user(f)) {
            let v = self.callers.entry(cf).or_insert((0, e.stack()));
            v.0 = v.0.saturating_add(e.size);
        }
    }

    /// The group as PT018's numbers (its trace allocations are added by the caller).
    fn attention(
        self,
        snap: &Snapshot,
        device: i64,
        k: usize,
        peak: u64,
        scope: &Scope,
        largest: u64,
    ) -> Attention {
        // Frames that read the same (`file:line` of two functions on one line) are one line.
        let mut merged: FxHashMap<(u64, String), (u64, u64)> = FxHashMap::default();
        for ((line, inner), (bytes, blocks)) in self.lines {
            let via = inner
                .and_then(|f| snap.frames.get(f as usize))
                .map(|f| format!("{}:{}", short(&f.filename), f.line))
                .unwrap_or_default();
            let m = merged.entry((line, via)).or_default();
            m.0 = m.0.saturating_add(bytes);
            m.1 += blocks;
        }
        let mut lines: Vec<AttentionLine> = merged
            .into_iter()
            .map(|((line, via), (bytes, blocks))| AttentionLine {
                line,
                via,
                bytes,
                blocks,
            })
            .collect();
        lines.sort_by(|x, y| {
            y.bytes
                .cmp(&x.bytes)
                .then(x.line.cmp(&y.line))
                .then(x.via.cmp(&y.via))
        });
        Attention {
            device,
            peak_index: k as u64,
            peak_bytes: peak,
            function: scope.1.clone(),
            file: scope.0.clone(),
            largest_softmax_bytes: largest,
            bytes: self.bytes,
            blocks: self.blocks,
            lines,
            trace_allocs: 0,
            trace_alloc_bytes: 0,
            module_forward: false,
            caller: self
                .callers
                .into_iter()
                .max_by_key(|(f, (b, _))| (*b, std::cmp::Reverse(*f)))
                .map(|(f, (_, st))| (f, st)),
            allocs: Vec::new(),
            held: self.held,
        }
    }
}

/// A module's `forward` in a transformers-style modeling file (`modeling_llama.py`), where the
/// eager attention of transformers before 4.48 runs its softmax inline (later versions name it
/// `eager_attention_forward`, which [`names_attention`] takes).
fn module_forward(path: &str, name: &str) -> bool {
    let file = path.rsplit(['/', '\\']).next().unwrap_or("");
    name == "forward" && file.starts_with("modeling_") && file.ends_with(".py")
}

/// A frame's file and line, to compare callers by.
type Caller = (String, u64);

/// The softmax of stack `ids` in a [`module_forward`]: that function, the first Python frame
/// outside the softmax that is one, before the first user frame that is not (a vendored modeling
/// file is the user's; transformers installed in `site-packages` is not), and the line that
/// called it ([`caller_of`]).
fn forward_softmax(
    snap: &Snapshot,
    flags: &FrameFlags,
    ids: &[FrameId],
) -> Option<(Scope, Caller)> {
    let at = ids.iter().position(|&f| flags.softmax(f))?;
    for (j, &f) in ids.iter().enumerate().skip(at + 1) {
        if flags.softmax(f) {
            continue;
        }
        let fr = snap.frames.get(f as usize)?;
        if module_forward(&fr.filename, &fr.name) {
            let caller = caller_of(snap, flags, ids, j, &fr.filename)?;
            return Some(((fr.filename.clone(), fr.name.clone()), caller));
        }
        if flags.user(f) {
            return None;
        }
    }
    None
}

/// The line that called the frame at `j` of `ids`: the first frame after it that is the user's
/// or in its own `file` (a decoder layer's `self.self_attn(...)`; nn.Module's call machinery
/// between them is neither).
fn caller_of(
    snap: &Snapshot,
    flags: &FrameFlags,
    ids: &[FrameId],
    j: usize,
    file: &str,
) -> Option<Caller> {
    ids[j + 1..].iter().find_map(|&f| {
        let fr = snap.frames.get(f as usize)?;
        (flags.user(f) || fr.filename == file).then(|| (fr.filename.clone(), fr.line))
    })
}

/// Where stack `ids` passes through the function `scope` called from `caller` (the first such
/// frame): the file's other `forward`s are called from other lines.
fn forward_at(
    snap: &Snapshot,
    flags: &FrameFlags,
    ids: &[FrameId],
    scope: &Scope,
    caller: &Caller,
) -> Option<usize> {
    (0..ids.len()).find(|&j| {
        snap.frames
            .get(ids[j] as usize)
            .is_some_and(|fr| fr.filename == scope.0 && fr.name == scope.1)
            && caller_of(snap, flags, ids, j, &scope.0).as_ref() == Some(caller)
    })
}

/// PT018 for an attention written inline in a module's `forward` ([`module_forward`]), which
/// its name does not tell from the file's other `forward`s. From the softmax allocated nearest
/// the peak (the last before it and the first after it: a peak between the scores' matmul and
/// the softmax holds no softmax block), the group is every score-sized block live at the peak
/// made in that file's `forward` called from the softmax's calling line.
fn forward_group_at_peak(
    snap: &Snapshot,
    memo: &PeakLive,
    flags: &FrameFlags,
    device: i64,
    k: usize,
    peak: u64,
) -> Option<Attention> {
    let trace = snap.trace(device);
    let k = k.min(trace.len());
    let mut sites: FxHashMap<StackId, Option<(Scope, Caller)>> = FxHashMap::default();
    let mut site = |e: &TraceEntry| -> Option<(Scope, Caller)> {
        if e.action != Action::Alloc {
            return None;
        }
        let st = e.stack()?;
        sites
            .entry(st)
            .or_insert_with(|| forward_softmax(snap, flags, snap.stacks.get(st as usize)?))
            .clone()
    };
    let mut softmaxes: Vec<(Scope, Caller, u64)> = Vec::new();
    let before = trace[..k]
        .iter()
        .rev()
        .find_map(|e| Some((site(e)?, e.size)));
    let after = trace[k..].iter().find_map(|e| Some((site(e)?, e.size)));
    for ((scope, caller), size) in before.into_iter().chain(after) {
        if size != 0
            && !softmaxes
                .iter()
                .any(|s| s.0 == scope && s.1 == caller && s.2 == size)
        {
            softmaxes.push((scope, caller, size));
        }
    }
    let live = peak_live(memo, trace, device, k);
    let mut best: Option<Attention> = None;
    for (scope, caller, largest) in softmaxes {
        let mut at: FxHashMap<StackId, Option<usize>> = FxHashMap::default();
        let mut at_of = |st: StackId| -> Option<usize> {
            *at.entry(st).or_insert_with(|| {
                forward_at(snap, flags, snap.stacks.get(st as usize)?, &scope, &caller)
            })
        };
        let mut group = Group::default();
        for &i in live.values() {
            let e = &trace[i];
            let Some(st) = e.stack().filter(|_| score_sized(e.size, largest)) else {
                continue;
            };
            if let (Some(j), Some(ids)) = (at_of(st), snap.stacks.get(st as usize)) {
                group.add(snap, flags, ids, j, (i, e));
            }
        }
        let mut g = group.attention(snap, device, k, peak, &scope, largest);
        g.module_forward = true;
        g.take_trace_allocs(trace, |st| at_of(st).is_some());
        if best.as_ref().is_none_or(|b| g.bytes > b.bytes) {
            best = Some(g);
        }
    }
    best
}

/// The candidates a stack passes through (`cand_of`: a frame's candidate), each with the
/// position of its first frame there; computed once per stack.
fn passes_of<'m>(
    passes: &'m mut FxHashMap<StackId, Vec<(usize, usize)>>,
    snap: &Snapshot,
    cand_of: &[Option<usize>],
    st: StackId,
) -> &'m [(usize, usize)] {
    passes.entry(st).or_insert_with(|| {
        let mut hits: Vec<(usize, usize)> = Vec::new();
        for (at, &f) in snap
            .stacks
            .get(st as usize)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(c) = cand_of.get(f as usize).copied().flatten()
                && !hits.iter().any(|h| h.0 == c)
            {
                hits.push((c, at));
            }
        }
        hits
    })
}

/// The last two path components (`cs336_basics/model.py`), for evidence lines.
fn short(path: &str) -> String {
    let parts: Vec<&str> = path.rsplit(['/', '\\']).take(2).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

fn finding(snap: &Snapshot, a: &Analysis, g: Attention) -> Finding {
    let share = percent(g.bytes, g.peak_bytes);
    let (key, stack) = g.caller.map_or((None, None), |(f, st)| (Some(f), st));
    let (loc, st) = culprit(snap, key, stack);
    let lines = g
        .lines
        .iter()
        .take(6)
        .map(|l| {
            format!(
                "line {} via {}: {} in {} block(s)",
                l.line,
                l.via,
                fmt_bytes(l.bytes),
                l.blocks
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    // An inline attention is named by its file: `forward` alone names every module.
    let named = if g.module_forward {
        format!("the attention in `forward` of {}", short(&g.file))
    } else {
        format!("`{}`", g.function)
    };
    let mut f = Finding::new(
        Code::PT018,
        Severity::Warning,
        format!(
            "Attention scores are materialised: {named} holds {} of the {} live at the peak ({}) in \
             B×H×L×L score and probability tensors, spread over {} line(s) of one attention.",
            fmt_bytes(g.bytes),
            fmt_bytes(g.peak_bytes),
            pct(share),
            g.lines.len(),
        ),
    )
    .at(loc, st)
    .bytes(g.bytes, share, Label::Measured)
    .evidence(Evidence::measured(format!(
        "at the trace peak (before entry #{} of device {}): {} live",
        g.peak_index,
        g.device,
        fmt_bytes(g.peak_bytes)
    )))
    .evidence(Evidence::measured(format!(
        "{} blocks ({}) live at the peak were made inside `{}` ({}) at score size (between half of \
         its largest softmax block, {}, and that block): {lines}",
        g.blocks,
        fmt_bytes(g.bytes),
        g.function,
        short(&g.file),
        fmt_bytes(g.largest_softmax_bytes),
    )));
    // Why they went away, from their free stacks: a graph kept them for the backward, or the
    // running call dropped them (inference, or a forward without autograd).
    let freed = a
        .releases
        .released_after(snap, g.device, g.peak_index, &g.held);
    let graph: u64 = Cause::ALL
        .iter()
        .filter(|c| c.is_graph() || **c == Cause::Backward)
        .map(|&c| freed.get(c).count)
        .sum();
    let line = freed.get(Cause::UserLine).count;
    let temporaries = graph == 0 && line > 0 && line == g.blocks;
    // No free in the whole trace went through the autograd engine and graphs were released by
    // dropping outputs (PT005's forward-only shape): the graph kept the scores for nothing.
    let no_backward = a.releases.graph() == GraphSeen::DroppedWithoutBackward;
    if graph > 0 && no_backward {
        f = f.evidence(Evidence::measured(format!(
            "freed after the peak when their graph was released without a backward (its output \
             dropped; their free stacks): {graph} of {} block(s)",
            g.blocks
        )));
    } else if graph > 0 {
        f = f.evidence(Evidence::measured(format!(
            "freed after the peak by autograd (a graph released, or inside backward; their free \
             stacks): {graph} of {} block(s)",
            g.blocks
        )));
    } else if temporaries {
        f = f.evidence(Evidence::measured(format!(
            "freed after the peak by Python lines, none by autograd (their free stacks): {line} \
             of {line} block(s), the running call's temporaries"
        )));
    }
    let kept = if temporaries {
        ""
    } else if no_backward {
        ", kept by the graph for a backward that never ran"
    } else {
        ", kept for the backward of each layer"
    };
    f = f.evidence(Evidence::inferred(format!(
        "the softmax's output is the largest block the attention makes: B·H·L·L scores and \
         probabilities, quadratic in the context length{kept}"
    )));
    if g.module_forward {
        f = f.evidence(Evidence::inferred(
            "the softmax runs inline in a module's `forward` of a `modeling_*.py` file (the \
             eager attention of transformers); the group is that file's `forward` called from \
             the softmax's calling line, so its other modules are not counted",
        ));
    }
    let sim = replay_fused(snap, a, &g, temporaries || no_backward);
    let library = FrameFilter::default().classify(&g.file) != FrameKind::User;
    let mut fix = if g.module_forward && library {
        // Installed library code: the model is loaded with another attention, not edited.
        Fix::new(
            format!(
                "Load the transformers model with `attn_implementation=\"sdpa\"` (transformers \
                 ≥ 4.36): its eager attention (`forward` of {}) writes the L×L scores to memory, \
                 the fused kernel never does",
                short(&g.file)
            ),
            FixKind::Advice,
        )
    } else if g.module_forward {
        // The call is a module call (`self.self_attn(...)`): no callee to rename on its line.
        Fix::new(
            format!(
                "Compute the attention in `forward` of {} with \
                 `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=…)`; for a \
                 transformers model, load it with `attn_implementation=\"sdpa\"` (transformers \
                 ≥ 4.36): the fused kernel never writes the L×L scores to memory",
                short(&g.file)
            ),
            FixKind::Advice,
        )
    } else {
        Fix::new(
            format!(
                "Replace the hand-written attention (`{}`) with \
                 `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=…, \
                 is_causal=…)`: the fused kernel never writes the L×L scores to memory",
                g.function
            ),
            FixKind::ScaledDotProductAttention {
                callee: g.function.clone(),
            },
        )
    }
    .cost("check the mask convention (a boolean mask is True where attention is allowed) and the scale");
    match sim {
        Some(sim) => {
            // The replay's numbers go on the fix (`[simulated]` where the fix is shown).
            fix = fix.saving(
                sim.peak_allocated_before
                    .saturating_sub(sim.peak_allocated_after),
            );
            fix.simulated = Some(sim);
        }
        None => match live_peak_without(snap, a, &g) {
            // The live bytes without the scores: where the peak moves, not the bound.
            Some((before, after)) => {
                let saving = before.saturating_sub(after);
                f = f.evidence(Evidence::inferred(format!(
                    "without the allocator replay: the trace's live bytes without the \
                     attention's {} score-sized allocations peak at {} ({} now), a saving of \
                     ~{} (segments and the cache not modelled)",
                    g.allocs.len(),
                    fmt_bytes(after),
                    fmt_bytes(before),
                    fmt_bytes(saving)
                )));
                fix = fix.saving(saving);
            }
            None => {
                f = f.evidence(Evidence::inferred(format!(
                    "without the allocator replay: at most the {} of scores live at the peak \
                     are saved (the peak may move elsewhere)",
                    fmt_bytes(g.bytes)
                )));
                fix = fix.saving(g.bytes);
            }
        },
    }
    f = f.fix(fix);
    f.scope = Some(format!("device {}", g.device));
    f
}

/// The fused attention replayed: the group's allocations never made. `no_gradients`: the free
/// stacks show no backward used the scores (the running call dropped them, or the trace has no
/// backward at all), so no score gradients are left replayed as recorded.
fn replay_fused(
    snap: &Snapshot,
    a: &Analysis,
    g: &Attention,
    no_gradients: bool,
) -> Option<Simulated> {
    if g.allocs.is_empty() {
        return None;
    }
    let w = a.replays.what_if(
        snap,
        g.device,
        &[Change::FreeEarly {
            allocs: g.allocs.clone(),
            at: 0,
        }],
    );
    let backward = if no_gradients {
        ""
    } else {
        "; the backward's score gradients replayed as recorded, so the peak after is at most this"
    };
    crate::torch::replay::whatif::simulated(
        &w,
        &format!(
            "the attention's {} score-sized allocations ({}) never made (fused attention){backward}",
            g.allocs.len(),
            fmt_bytes(g.trace_alloc_bytes)
        ),
    )
}

/// Without the replay: the device's live bytes over the trace (counted as the timeline counts
/// them, from its reconstructed start) at their highest, now and with the group's allocations
/// never made (their frees skipped too). `None` without the device's timeline.
fn live_peak_without(snap: &Snapshot, a: &Analysis, g: &Attention) -> Option<(u64, u64)> {
    let t = a.timeline.device(g.device)?;
    let removed: rustc_hash::FxHashSet<usize> = g.allocs.iter().copied().collect();
    let mut gone: rustc_hash::FxHashSet<u64> = rustc_hash::FxHashSet::default();
    let size = |e: &TraceEntry| i64::try_from(e.size).unwrap_or(i64::MAX);
    let (mut live, mut peak) = (t.live_start, t.live_start);
    for (i, e) in snap.trace(g.device).iter().enumerate() {
        match e.action {
            Action::Alloc if removed.contains(&i) => {
                gone.insert(e.addr);
            }
            Action::Alloc => {
                gone.remove(&e.addr);
                live = live.saturating_add(size(e));
                peak = peak.max(live);
            }
            Action::FreeCompleted if gone.remove(&e.addr) => {}
            Action::FreeCompleted => live = live.saturating_sub(size(e)),
            _ => {}
        }
    }
    Some((u64::try_from(t.live_peak).ok()?, u64::try_from(peak).ok()?))
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

    /// An attention (`attention_outer`) whose softmax runs partly in a helper attention it calls
    /// (`attn_inner`): the helper's score blocks pass through both functions and belong to both
    /// groups; the outer one, which also holds its own softmax and its matmul's scores, is the
    /// larger and is the one named.
    #[test]
    fn blocks_under_two_nested_attentions_count_in_both_groups() {
        let mut snap = Snapshot::default();
        let softmax = ("/v/site-packages/torch/nn/functional.py", 2140, "softmax");
        let train = ("/u/train.py", 5, "train");
        let inner = intern(
            &mut snap,
            &[
                softmax,
                ("/u/attn.py", 10, "attn_inner"),
                ("/u/model.py", 20, "attention_outer"),
                train,
            ],
        );
        let matmul = intern(&mut snap, &[("/u/model.py", 21, "attention_outer"), train]);
        let outer = intern(
            &mut snap,
            &[softmax, ("/u/model.py", 22, "attention_outer"), train],
        );
        let other = intern(&mut snap, &[("/u/model.py", 30, "forward"), train]);
        const MIB: u64 = 1 << 20;
        let mut list = Vec::new();
        let mut made = Vec::new();
        for (n, st) in [(3, inner), (2, matmul), (1, outer), (4, other)] {
            for _ in 0..n {
                let addr = 0x10_0000 * (made.len() as u64 + 1);
                let mut e = entry(Action::Alloc, addr, 4 * MIB);
                e.set_stack(Some(st));
                list.push(e);
                made.push(addr);
            }
        }
        for addr in made {
            list.push(entry(Action::FreeRequested, addr, 4 * MIB));
            list.push(entry(Action::FreeCompleted, addr, 4 * MIB));
        }
        snap.device_traces = Some(vec![list]);
        snap.segments = vec![segment(
            0,
            1 << 30,
            vec![block(1 << 30, 1 << 30, BlockState::Inactive)],
        )];
        let a = analyse(&snap, &AnalysisOptions::default());
        let g = a.attention.expect("an attention group");
        assert_eq!(
            (g.function.as_str(), g.file.as_str()),
            ("attention_outer", "/u/model.py")
        );
        assert_eq!((g.blocks, g.bytes), (6, 24 * MIB));
        let lines: Vec<(u64, &str, u64)> = g
            .lines
            .iter()
            .map(|l| (l.line, l.via.as_str(), l.blocks))
            .collect();
        assert_eq!(
            lines,
            vec![
                (20, "u/attn.py:10", 3),
                (21, "u/model.py:21", 2),
                (22, "u/model.py:22", 1)
            ]
        );
        assert_eq!((g.trace_allocs, g.trace_alloc_bytes), (6, 24 * MIB));
        assert_eq!(g.peak_bytes, 40 * MIB);
    }

    /// Two innermost user frames that read the same (`file:line`: a lambda and the function
    /// it sits in, on one line) are one line of the group, their blocks added.
    #[test]
    fn frames_that_read_the_same_are_one_line() {
        let mut snap = Snapshot::default();
        let softmax = ("/v/site-packages/torch/nn/functional.py", 2140, "softmax");
        let outer = ("/u/model.py", 21, "attention_outer");
        let train = ("/u/train.py", 5, "train");
        let via_lambda = intern(
            &mut snap,
            &[softmax, ("/u/model.py", 21, "<lambda>"), outer, train],
        );
        let direct = intern(&mut snap, &[softmax, outer, train]);
        const MIB: u64 = 1 << 20;
        let mut list = Vec::new();
        for (i, st) in [via_lambda, via_lambda, direct].into_iter().enumerate() {
            let mut e = entry(Action::Alloc, 0x10_0000 * (i as u64 + 1), 4 * MIB);
            e.set_stack(Some(st));
            list.push(e);
        }
        snap.device_traces = Some(vec![list]);
        snap.segments = vec![segment(
            0,
            1 << 30,
            vec![block(1 << 30, 1 << 30, BlockState::Inactive)],
        )];
        let g = analyse(&snap, &AnalysisOptions::default())
            .attention
            .expect("an attention group");
        let lines: Vec<(u64, &str, u64, u64)> = g
            .lines
            .iter()
            .map(|l| (l.line, l.via.as_str(), l.blocks, l.bytes))
            .collect();
        assert_eq!(lines, vec![(21, "u/model.py:21", 3, 12 * MIB)]);
    }

    /// An eager attention written inline in a module's `forward` of a modeling file (as
    /// transformers' `LlamaAttention.forward` before 4.48), with the peak between the scores'
    /// matmul and the softmax (so no softmax block is live there; as in the real
    /// `Maphsge4__ec5be110` trace). The file's other `forward`s are every module's: a score-sized
    /// block of its MLP, called from another line, is not counted. The same code in a file not
    /// named `modeling_*.py` is not taken for an attention.
    #[test]
    fn an_attention_inline_in_a_modeling_files_forward_is_told_by_its_caller() {
        const MIB: u64 = 1 << 20;
        let make = |file: &str| {
            let mut snap = Snapshot::default();
            let call = (
                "/v/site-packages/torch/nn/modules/module.py",
                1527,
                "_call_impl",
            );
            let main = ("/u/run.py", 5, "main");
            let layer = (file, 408, "forward");
            let scores = intern(&mut snap, &[(file, 330, "forward"), call, layer, main]);
            let softmax = intern(
                &mut snap,
                &[
                    ("/v/site-packages/torch/nn/functional.py", 1858, "softmax"),
                    (file, 346, "forward"),
                    call,
                    layer,
                    main,
                ],
            );
            let mlp = intern(
                &mut snap,
                &[(file, 89, "forward"), call, (file, 416, "forward"), main],
            );
            let mut list = Vec::new();
            let mut push = |a: Action, addr: u64, st: Option<u32>| {
                let mut e = entry(a, addr, 4 * MIB);
                e.set_stack(st);
                list.push(e);
            };
            push(Action::Alloc, 0x100_0000, Some(mlp));
            push(Action::Alloc, 0x200_0000, Some(scores));
            push(Action::Alloc, 0x300_0000, Some(scores));
            for addr in [0x200_0000, 0x300_0000] {
                push(Action::FreeRequested, addr, None);
                push(Action::FreeCompleted, addr, None);
            }
            push(Action::Alloc, 0x400_0000, Some(softmax));
            for addr in [0x100_0000, 0x400_0000] {
                push(Action::FreeRequested, addr, None);
                push(Action::FreeCompleted, addr, None);
            }
            snap.device_traces = Some(vec![list]);
            snap.segments = vec![segment(
                0,
                1 << 30,
                vec![block(1 << 30, 1 << 30, BlockState::Inactive)],
            )];
            analyse(&snap, &AnalysisOptions::default())
        };
        // Vendored (the user's file), then installed (library code under `site-packages`,
        // where the first user frame is the same for every module: the caller is the line in
        // the modeling file that calls the module).
        for (file, short, at, fix) in [
            (
                "/u/lib/modeling_toy.py",
                "lib/modeling_toy.py",
                408,
                "Compute the attention in `forward` of lib/modeling_toy.py",
            ),
            (
                "/v/site-packages/transformers/models/toy/modeling_toy.py",
                "toy/modeling_toy.py",
                5,
                "Load the transformers model with `attn_implementation=\"sdpa\"`",
            ),
        ] {
            let a = make(file);
            let g = a.attention.as_ref().expect("an attention group");
            assert!(g.module_forward);
            assert_eq!(
                (g.blocks, g.bytes, g.peak_bytes),
                (2, 8 * MIB, 12 * MIB),
                "{file}"
            );
            assert_eq!(
                g.lines
                    .iter()
                    .map(|l| (l.line, l.blocks))
                    .collect::<Vec<_>>(),
                [(330, 2)]
            );
            // The two score tensors and the softmax, not the MLP's block.
            assert_eq!((g.trace_allocs, g.trace_alloc_bytes), (3, 12 * MIB));
            let f = a
                .findings
                .iter()
                .find(|f| f.code == crate::findings::Code::PT018)
                .expect("a PT018 finding");
            let head = format!(
                "Attention scores are materialised: the attention in `forward` of {short} holds \
                 8.00 MiB of the 12.00 MiB live at the peak"
            );
            assert!(f.message.starts_with(&head), "{}", f.message);
            assert_eq!(f.location.as_ref().map(|l| l.line), Some(at));
            assert!(f.fixes[0].title.starts_with(fix), "{}", f.fixes[0].title);
            assert_eq!(f.fixes[0].kind, crate::findings::FixKind::Advice);
        }
        assert!(make("/u/lib/toy.py").attention.is_none());
    }
}
