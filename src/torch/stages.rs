//! Training stages over a device's trace: the `record_function` spans the snapshot recorded in
//! `external_annotations` (torch 2.5+: `Optimizer.step#AdamW.step`, `Optimizer.zero_grad#…`,
//! `enumerate(DataLoader)#…`, compiled-graph calls, `dynamo_timed` spans), placed on the trace by
//! their `time_us`, and — where no recorded span covers the trace — stages inferred from the
//! trace itself: optimizer-state allocations, forward growth up to the peak, backward frees after
//! it (or autograd's own allocations).
//!
//! Each stage gets its live-memory peak, its growth (live bytes at its end minus at its start)
//! and the sites live at its peak, all measured from the reconstructed live bytes that the
//! timeline's peak uses (`timeline::DeviceTimeline::live_start` plus the running sum).

pub mod summary;

use crate::torch::model::{Action, Annotation, AnnotationStage, Snapshot, TraceEntry};
use crate::torch::release::{Cause, Releases};
use crate::torch::stacks::{Role, SiteKey, StackIndex};
use crate::torch::timeline::{DeviceTimeline, Timeline, live_at_many};

/// Where a stage's name and span come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageSource {
    /// An `external_annotations` START/END pair (read).
    Recorded,
    /// Our reading of the trace (inferred).
    Inferred,
}

impl StageSource {
    /// The label of the stage's name and span.
    pub fn label(self) -> &'static str {
        match self {
            StageSource::Recorded => "read",
            StageSource::Inferred => "inferred",
        }
    }
}

/// One stage on one device's trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    pub device: i64,
    pub name: String,
    pub source: StageSource,
    /// 1-based: the how-many-th stage of this name on this device.
    pub occurrence: u32,
    /// 1-based training step: one more than the optimizer stages (recorded `Optimizer.step#…` or
    /// inferred `optimizer`) that ended before this stage started.
    pub step: u32,
    /// Nesting depth among recorded spans (0 = outermost; inferred stages are 0).
    pub depth: u32,
    /// Recorded spans of this name over exactly these entries, folded into this one (a span
    /// that holds no trace entry, like 867 `pad_mm_benchmark` calls between two entries, is
    /// listed once); 1 otherwise.
    pub repeats: u32,
    /// Trace entries `start..end` of the device.
    pub start: u64,
    pub end: u64,
    pub start_us: Option<i64>,
    pub end_us: Option<i64>,
    /// Live bytes before the first entry of the stage, after its last one, and the highest in
    /// between (measured).
    pub start_bytes: i64,
    pub end_bytes: i64,
    pub peak_bytes: i64,
    /// Index of the entry after which the stage's peak is reached (`start` when it never rises
    /// above its start).
    pub peak_index: u64,
    /// Sites live at the stage's peak, bytes descending (at most [`TOP_SITES`]; computed for
    /// the [`SITES_FOR`] stages with the highest peaks).
    pub top_sites: Vec<(SiteKey, u64, u64)>,
}

impl Stage {
    pub fn growth(&self) -> i64 {
        self.end_bytes.saturating_sub(self.start_bytes)
    }
}

/// The stages of every traced device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stages {
    pub stages: Vec<Stage>,
    /// Per device: the stage holding the device's trace peak (innermost), as an index into
    /// `stages`.
    pub at_peak: Vec<(i64, usize)>,
    /// Recorded annotations that could not be placed: an END without START, a START without
    /// END is kept open to the end of the trace (not counted), entries without `time_us`.
    pub unplaced: u64,
    /// Whether the snapshot recorded any annotation.
    pub recorded: bool,
}

/// Sites kept per stage.
pub const TOP_SITES: usize = 3;
/// Stages that get their live sites (each costs one pass over the trace).
pub const SITES_FOR: usize = 8;
/// Inferred stages per device at most (the rest of the trace stays unstaged).
pub const MAX_INFERRED: usize = 96;
/// Entries per block of the running-maximum index.
const BLOCK: usize = 128;

/// The stages of a snapshot's traced devices.
pub fn compute(
    snap: &Snapshot,
    stacks: &StackIndex,
    timeline: &Timeline,
    releases: &Releases,
) -> Stages {
    let mut out = Stages {
        recorded: !snap.annotations.is_empty(),
        ..Stages::default()
    };
    // Each device's annotations, gathered once (a per-device filter is quadratic in devices).
    let mut by_device: rustc_hash::FxHashMap<i64, Vec<&Annotation>> = Default::default();
    for a in &snap.annotations {
        by_device.entry(a.device).or_default().push(a);
    }
    for t in &timeline.devices {
        let list = snap.trace(t.device);
        if list.is_empty() {
            continue;
        }
        let live = Live::new(list, t.live_start);
        let first = out.stages.len();
        let notes = by_device.get(&t.device).map_or(&[][..], Vec::as_slice);
        let mut spans = recorded_spans(notes, list, &mut out.unplaced);
        spans.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
        fold_repeats(&mut spans);
        nest(&mut spans);
        let gaps = uncovered(&spans, list.len() as u64);
        let trace = Trace {
            list,
            stacks,
            releases,
            requests: list.iter().any(|e| e.action == Action::FreeRequested),
        };
        // Inferred stages so far (the recorded spans are not).
        let mut inferred = 0;
        for (a, b) in gaps {
            infer(&trace, a, b, &live, &mut spans, &mut inferred);
        }
        // Empty spans first at their index, then outer before inner.
        spans.sort_by_key(|s| (s.start, s.end > s.start, s.depth, std::cmp::Reverse(s.end)));
        for s in &mut spans {
            s.device = t.device;
            live.measure(s);
            s.start_us = s.start_us.or_else(|| time_at(list, s.start));
            s.end_us = s.end_us.or_else(|| time_at(list, s.end.saturating_sub(1)));
        }
        number(&mut spans);
        // The innermost stage holding the device's peak entry.
        if let Some(p) = t.live_peak_index {
            let held = spans
                .iter()
                .enumerate()
                .filter(|(_, s)| s.start <= p && p < s.end)
                .max_by_key(|(_, s)| (s.depth, s.source == StageSource::Recorded, s.start));
            if let Some((i, _)) = held {
                out.at_peak.push((t.device, first + i));
            }
        }
        sites(snap, stacks, t, list, &mut spans);
        out.stages.extend(spans);
    }
    out
}

fn time_at(list: &[TraceEntry], i: u64) -> Option<i64> {
    list.get(usize::try_from(i).ok()?)?.time_us()
}

fn empty_stage(name: String, source: StageSource, start: u64, end: u64) -> Stage {
    Stage {
        device: 0,
        name,
        source,
        occurrence: 0,
        step: 0,
        depth: 0,
        repeats: 1,
        start,
        end,
        start_us: None,
        end_us: None,
        start_bytes: 0,
        end_bytes: 0,
        peak_bytes: 0,
        peak_index: start,
        top_sites: Vec::new(),
    }
}

/// The device's START/END pairs placed on its trace by time (an END closes the latest open START
/// of its name; a START never closed runs to the end of the trace).
fn recorded_spans(notes: &[&Annotation], list: &[TraceEntry], unplaced: &mut u64) -> Vec<Stage> {
    let n = list.len() as u64;
    // Looked at only when there are annotations to place (a pass over millions of entries).
    let timed = !notes.is_empty() && list.iter().all(|e| e.time_us().is_some());
    let at = |t: i64, inclusive: bool| -> u64 {
        list.partition_point(|e| {
            let x = e.time_us().unwrap_or(i64::MIN);
            if inclusive { x <= t } else { x < t }
        }) as u64
    };
    // Open STARTs in file order (`None` once closed), and per name the positions of its open
    // ones: an END closes its name's latest in O(1), whatever the number of names.
    let mut open: Vec<Option<(&str, i64)>> = Vec::new();
    let mut open_of: rustc_hash::FxHashMap<&str, Vec<usize>> = Default::default();
    let mut out = Vec::new();
    for a in notes {
        let (Some(t), true) = (a.time_us, timed) else {
            *unplaced += 1;
            continue;
        };
        let name = a.name.as_str();
        match a.stage {
            AnnotationStage::Start => {
                open_of.entry(name).or_default().push(open.len());
                open.push(Some((name, t)));
            }
            AnnotationStage::End => match open_of.get_mut(name).and_then(Vec::pop) {
                Some(k) => {
                    let (_, t0) = open[k].take().expect("an open START");
                    let mut s = empty_stage(
                        a.name.clone(),
                        StageSource::Recorded,
                        at(t0, false),
                        at(t, true),
                    );
                    s.start_us = Some(t0);
                    s.end_us = Some(t);
                    out.push(s);
                }
                None => *unplaced += 1,
            },
        }
    }
    for (name, t0) in open.into_iter().flatten() {
        let mut s = empty_stage(name.to_string(), StageSource::Recorded, at(t0, false), n);
        s.start_us = Some(t0);
        out.push(s);
    }
    out
}

/// Recorded spans of one name over the same entries become one (spans sorted by start, then
/// longer first, so equal spans of a name are neighbours among equal bounds).
fn fold_repeats(spans: &mut Vec<Stage>) {
    let mut out: Vec<Stage> = Vec::with_capacity(spans.len());
    for s in spans.drain(..) {
        let same = out
            .iter_mut()
            .rev()
            .take_while(|o| o.start == s.start && o.end == s.end)
            .find(|o| o.name == s.name);
        match same {
            Some(o) => o.repeats = o.repeats.saturating_add(1),
            None => out.push(s),
        }
    }
    *spans = out;
}

/// Depth of each recorded span (spans sorted by start, longer first).
fn nest(spans: &mut [Stage]) {
    let mut stack: Vec<u64> = Vec::new();
    for s in spans.iter_mut() {
        while stack.last().is_some_and(|&end| end <= s.start) {
            stack.pop();
        }
        s.depth = stack.len() as u32;
        stack.push(s.end);
    }
}

/// Parts of `0..n` no recorded span covers (spans sorted by start).
fn uncovered(spans: &[Stage], n: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for s in spans {
        if s.start > at {
            out.push((at, s.start));
        }
        at = at.max(s.end);
    }
    if at < n {
        out.push((at, n));
    }
    out
}

/// Stages of `a..b` read from the trace: runs of optimizer-state allocations are `optimizer`;
/// between them, `forward` up to the first allocation made by autograd's backward (or, without
/// one, up to the part's live peak) and `backward` after it when memory falls by at least an
/// eighth of the part's rise.
///
/// `inferred`: the inferred stages in `out`, kept up to date (counting them again at each
/// optimizer run made a trace of many steps quadratic).
fn infer(t: &Trace, a: u64, b: u64, live: &Live, out: &mut Vec<Stage>, inferred: &mut usize) {
    let (list, stacks) = (t.list, t.stacks);
    // What this call adds goes at the end of `out`, every one of it inferred.
    let (base, before) = (out.len(), *inferred);
    debug_assert!(before <= MAX_INFERRED);
    let mut part_start = a;
    let mut i = a;
    while i < b {
        let e = &list[i as usize];
        if e.action == Action::Alloc && stacks.role(e.stack()) == Role::OptimizerState {
            // The run: optimizer allocations with anything but another site's allocation between.
            let mut j = i + 1;
            let mut last = i;
            while j < b {
                let x = &list[j as usize];
                if x.action == Action::Alloc {
                    if stacks.role(x.stack()) != Role::OptimizerState {
                        break;
                    }
                    last = j;
                }
                j += 1;
            }
            *inferred += split(t, part_start, i, live, out);
            if *inferred < MAX_INFERRED {
                out.push(empty_stage(
                    "optimizer".into(),
                    StageSource::Inferred,
                    i,
                    last + 1,
                ));
                *inferred += 1;
            }
            part_start = last + 1;
            i = last + 1;
            continue;
        }
        i += 1;
    }
    *inferred += split(t, part_start, b, live, out);
    if *inferred > MAX_INFERRED {
        // Drop the latest inferred stages beyond the cap: all of them this call's, at the end
        // (a pass over the whole list at each part made a trace of many parts quadratic).
        out.truncate(base + (MAX_INFERRED - before));
        *inferred = MAX_INFERRED;
    }
}

/// `a..b` without optimizer allocations: `forward` up to the first allocation made by autograd's
/// backward, `backward` from it; without one, `forward` up to the part's live peak and, when
/// memory then falls by at least an eighth of the rise, a stage after it named by what released
/// that memory (the release classifier's reading of the frees' own stacks): `backward` only
/// where autograd freed it inside backward.
///
/// Returns how many stages it added.
fn split(t: &Trace, a: u64, b: u64, live: &Live, out: &mut Vec<Stage>) -> usize {
    if a >= b {
        return 0;
    }
    let range = &t.list[a as usize..b as usize];
    if !range
        .iter()
        .any(|e| matches!(e.action, Action::Alloc | Action::FreeCompleted))
    {
        return 0;
    }
    let backward = range
        .iter()
        .position(|e| e.action == Action::Alloc && t.stacks.role(e.stack()) == Role::Backward)
        .map(|p| a + p as u64);
    let cut = match backward {
        Some(c) => Some((c, "backward")),
        None => {
            let (peak, at) = live.max(a, b);
            let start = live.before(a);
            let end = live.before(b);
            let rise = peak.saturating_sub(start);
            let fall = peak.saturating_sub(end);
            (rise > 0 && fall > 0 && fall.saturating_mul(8) >= rise)
                .then(|| (at + 1, t.released_by(at + 1, b)))
        }
    };
    match cut {
        Some((c, name)) if c > a && c < b => {
            out.push(empty_stage("forward".into(), StageSource::Inferred, a, c));
            out.push(empty_stage(name.into(), StageSource::Inferred, c, b));
            2
        }
        Some((c, name)) if c <= a => {
            out.push(empty_stage(name.into(), StageSource::Inferred, a, b));
            1
        }
        _ => {
            out.push(empty_stage("forward".into(), StageSource::Inferred, a, b));
            1
        }
    }
}

/// One device's trace with what stage inference reads beside it.
struct Trace<'a> {
    list: &'a [TraceEntry],
    stacks: &'a StackIndex,
    releases: &'a Releases,
    /// The trace records `free_requested` (the release stacks are on those), else
    /// `free_completed` carries them.
    requests: bool,
}

impl Trace<'_> {
    /// The name of a stage of frees `a..b`: what released most of their bytes.
    fn released_by(&self, a: u64, b: u64) -> &'static str {
        let want = if self.requests {
            Action::FreeRequested
        } else {
            Action::FreeCompleted
        };
        let mut bytes = [0u64; Cause::ALL.len()];
        for e in &self.list[a as usize..(b as usize).min(self.list.len())] {
            if e.action == want {
                let c = self.releases.cause(e.stack()) as usize;
                bytes[c] = bytes[c].saturating_add(e.size);
            }
        }
        let top = Cause::ALL
            .iter()
            .copied()
            .max_by_key(|c| (bytes[*c as usize], std::cmp::Reverse(*c as usize)))
            .filter(|c| bytes[*c as usize] > 0);
        top.map_or(RELEASE, release_stage)
    }
}

/// The inferred stage of frees that no more specific cause explains (Python lines, native code,
/// frees recorded without a stack).
pub const RELEASE: &str = "release";

/// The inferred stage named by the cause of its frees.
fn release_stage(c: Cause) -> &'static str {
    match c {
        Cause::GraphInBackward | Cause::Backward => "backward",
        Cause::GraphDropped => "graph dropped",
        Cause::AutocastCache => "autocast cache clear",
        Cause::OptimizerStep => "optimizer",
        Cause::ZeroGrad => "zero_grad",
        Cause::Collector => "gc",
        Cause::OomRetry | Cause::EmptyCache | Cause::UserLine | Cause::Native | Cause::NoStack => {
            RELEASE
        }
    }
}

/// Occurrence of each name and the training step of each stage (stages sorted by start).
fn number(spans: &mut [Stage]) {
    let mut counts: Vec<(String, u32)> = Vec::new();
    let mut optimizer_ends: Vec<u64> = Vec::new();
    for s in spans.iter() {
        if is_optimizer(s) {
            optimizer_ends.push(s.end);
        }
    }
    optimizer_ends.sort_unstable();
    // Without any optimizer step (an SGD without state, a zeroth-order method), recorded
    // `zero_grad` calls mark the steps instead: each one starts the next.
    let mut zero_grads: Vec<u64> = spans
        .iter()
        .filter(|s| s.source == StageSource::Recorded && s.name.starts_with("Optimizer.zero_grad#"))
        .map(|s| s.start)
        .collect();
    zero_grads.sort_unstable();
    for s in spans.iter_mut() {
        let c = match counts.iter_mut().find(|(n, _)| *n == s.name) {
            Some((_, c)) => {
                *c += 1;
                *c
            }
            None => {
                counts.push((s.name.clone(), 1));
                1
            }
        };
        s.occurrence = c;
        // An optimizer stage belongs to the step it ends.
        s.step = if optimizer_ends.is_empty() && !zero_grads.is_empty() {
            (zero_grads.partition_point(|&z| z <= s.start) as u32).max(1)
        } else {
            optimizer_ends.partition_point(|&e| e <= s.start) as u32 + 1
        };
    }
}

/// A stage that is an optimizer step (recorded `Optimizer.step#…` or inferred `optimizer`).
fn is_optimizer(s: &Stage) -> bool {
    match s.source {
        StageSource::Recorded => s.name.starts_with("Optimizer.step#"),
        StageSource::Inferred => s.name == "optimizer",
    }
}

/// Sites live at the peaks of the stages with the highest peaks.
fn sites(
    snap: &Snapshot,
    stacks: &StackIndex,
    t: &DeviceTimeline,
    list: &[TraceEntry],
    spans: &mut [Stage],
) {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(spans[i].peak_bytes));
    order.truncate(SITES_FOR);
    let ks: Vec<usize> = order
        .iter()
        .map(|&i| {
            let s = &spans[i];
            if s.peak_index == s.start && s.peak_bytes == s.start_bytes {
                s.start as usize
            } else {
                s.peak_index as usize + 1
            }
        })
        .collect();
    // One walk for all of them.
    let sets = live_at_many(snap, stacks, t.device, list, &ks);
    for (&i, set) in order.iter().zip(sets) {
        let s = &mut spans[i];
        s.top_sites = set
            .sites
            .iter()
            .take(TOP_SITES)
            .map(|(key, bytes, blocks, _)| (*key, *bytes, *blocks))
            .collect();
    }
}

/// Live bytes after each entry, as block maxima and block starts, so that the maximum over any
/// span costs two partial blocks and a walk over block maxima.
struct Live<'a> {
    list: &'a [TraceEntry],
    /// Live bytes before each block's first entry.
    starts: Vec<i64>,
    /// Highest live bytes after an entry of each block, and that entry's index.
    maxima: Vec<(i64, u64)>,
}

fn delta(e: &TraceEntry) -> i64 {
    let size = i64::try_from(e.size).unwrap_or(i64::MAX);
    match e.action {
        Action::Alloc => size,
        Action::FreeCompleted => size.saturating_neg(),
        _ => 0,
    }
}

impl<'a> Live<'a> {
    fn new(list: &'a [TraceEntry], start: i64) -> Live<'a> {
        let mut starts = Vec::with_capacity(list.len() / BLOCK + 1);
        let mut maxima = Vec::with_capacity(list.len() / BLOCK + 1);
        let mut running = start;
        for (b, chunk) in list.chunks(BLOCK).enumerate() {
            starts.push(running);
            let mut best = (i64::MIN, 0u64);
            for (k, e) in chunk.iter().enumerate() {
                running = running.saturating_add(delta(e));
                if running > best.0 {
                    best = (running, (b * BLOCK + k) as u64);
                }
            }
            maxima.push(best);
        }
        Live {
            list,
            starts,
            maxima,
        }
    }

    /// Live bytes before entry `i` (after entries `0..i`).
    fn before(&self, i: u64) -> i64 {
        let i = (i as usize).min(self.list.len());
        let b = i / BLOCK;
        let Some(&s) = self.starts.get(b) else {
            // `i` is the end of a trace whose length is a multiple of BLOCK.
            let last = self.starts.len().saturating_sub(1);
            let base = self.starts.last().copied().unwrap_or(0);
            return self.list[last * BLOCK..i]
                .iter()
                .fold(base, |r, e| r.saturating_add(delta(e)));
        };
        self.list[b * BLOCK..i]
            .iter()
            .fold(s, |r, e| r.saturating_add(delta(e)))
    }

    /// Highest live bytes after an entry of `a..b`, and that entry (`a` and the bytes before it
    /// when nothing in the span rises above them).
    fn max(&self, a: u64, b: u64) -> (i64, u64) {
        let (a, b) = (a as usize, (b as usize).min(self.list.len()));
        let mut best = (self.before(a as u64), a as u64);
        if a >= b {
            return best;
        }
        let mut running = best.0;
        let mut i = a;
        while i < b {
            if i % BLOCK == 0 && i + BLOCK <= b {
                let blk = i / BLOCK;
                let m = self.maxima[blk];
                if m.0 > best.0 {
                    best = (m.0, m.1);
                }
                i += BLOCK;
                running = self.starts.get(blk + 1).copied().unwrap_or(running);
                if i >= b && blk + 1 >= self.starts.len() {
                    break;
                }
                continue;
            }
            running = running.saturating_add(delta(&self.list[i]));
            if running > best.0 {
                best = (running, i as u64);
            }
            i += 1;
        }
        best
    }

    /// Fill a stage's live bytes.
    fn measure(&self, s: &mut Stage) {
        s.start_bytes = self.before(s.start);
        s.end_bytes = self.before(s.end);
        let (peak, at) = self.max(s.start, s.end);
        s.peak_bytes = peak;
        s.peak_index = at;
    }
}

#[cfg(test)]
mod tests;
