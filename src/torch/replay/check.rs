//! The validation's check, made while the replay runs: the model's segment events are compared
//! with the recorded ones step by step (a step: the trace entry whose request caused them), and
//! the replay stops at the first step that differs. A trace that does not fit its segments
//! then costs the replay up to its first difference, not a replay of the whole trace on a
//! state that has stopped meaning anything.
//!
//! A step is compared once no later op can add events to it: every op has `step >= pos` and
//! ops come in `pos` order, so before the op at `pos` every step below `pos` is complete. The
//! steps are compared in increasing order, each as [`compare_step`] does, so a replay that runs
//! to its end gets the counts and the first difference a comparison after the run would.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use super::addr_of::AddrOf;
use super::model::{Model, SegEvent, SegKind};
use super::run::{Done, Observer, Op};

/// Compares a validation replay's segment events with the recorded ones as it runs; raises
/// `invalid` at the first difference.
pub(crate) struct Checker<'a> {
    invalid: &'a AtomicBool,
    /// Recorded events by step (trace order within a step).
    recorded: Vec<SegEvent>,
    /// Recorded events before this index are compared.
    rec_at: usize,
    /// Model events before this index were taken into `pending`.
    seen: usize,
    /// Model events of steps not yet compared, by step.
    pending: BTreeMap<usize, Vec<SegEvent>>,
    /// Model events taken so far.
    pub replayed: u64,
    pub matched: u64,
    /// The first step that differs, and how.
    pub first: Option<(usize, String)>,
    /// Events compared (recorded and model): the check's share of the operation count.
    pub visits: u64,
}

impl Checker<'_> {
    pub fn new<'a>(recorded: &[SegEvent], invalid: &'a AtomicBool) -> Checker<'a> {
        let mut recorded = recorded.to_vec();
        // Stable: trace order within a step, as the recorded events were grouped before.
        recorded.sort_by_key(|e| e.step);
        Checker {
            invalid,
            recorded,
            rec_at: 0,
            seen: 0,
            pending: BTreeMap::new(),
            replayed: 0,
            matched: 0,
            first: None,
            visits: 0,
        }
    }

    /// Take the model's new events.
    fn take(&mut self, m: &Model) {
        for e in m.events.get(self.seen..).unwrap_or(&[]) {
            self.pending.entry(e.step).or_default().push(*e);
        }
        self.replayed += (m.events.len().saturating_sub(self.seen)) as u64;
        self.seen = m.events.len();
    }

    /// Compare every step below `upto`; `false` at the first that differs.
    fn close(&mut self, upto: usize) -> bool {
        loop {
            let rec_step = self
                .recorded
                .get(self.rec_at)
                .map(|e| e.step)
                .filter(|&s| s < upto);
            let pred_step = self
                .pending
                .first_key_value()
                .map(|(&s, _)| s)
                .filter(|&s| s < upto);
            let step = match (rec_step, pred_step) {
                (None, None) => return true,
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
            };
            let from = self.rec_at;
            while self
                .recorded
                .get(self.rec_at)
                .is_some_and(|e| e.step == step)
            {
                self.rec_at += 1;
            }
            let pred = match self.pending.first_key_value() {
                Some((&s, _)) if s == step => self.pending.pop_first().map(|p| p.1),
                _ => None,
            }
            .unwrap_or_default();
            let rec = &self.recorded[from..self.rec_at];
            self.visits += (rec.len() + pred.len()) as u64;
            let (matched, differs) = compare_step(step, rec, &pred);
            self.matched += matched;
            if let Some(what) = differs {
                self.first = Some((step, what));
                self.invalid.store(true, Ordering::Relaxed);
                return false;
            }
        }
    }
}

impl Observer for Checker<'_> {
    fn before(&mut self, op: &Op, m: &Model, _addr_of: &AddrOf) -> bool {
        // Most ops find nothing to compare: no new model event, none pending, and the next
        // recorded one in a later step (what `take` and `close` would conclude, sooner).
        if m.events.len() == self.seen
            && self.pending.is_empty()
            && self
                .recorded
                .get(self.rec_at)
                .is_none_or(|e| e.step >= op.pos)
        {
            return true;
        }
        self.take(m);
        self.close(op.pos)
    }

    fn after(&mut self, _op: &Op, _done: Done, _m: &Model, _addr_of: &AddrOf) -> bool {
        true
    }

    fn end(&mut self, m: &Model, _addr_of: &AddrOf) {
        self.take(m);
        self.close(usize::MAX);
    }
}

/// Compare one step's predicted events with its recorded ones, in order (a predicted event
/// matches the first recorded one of the same kind and size, and address where the model
/// decides it, within 64 events): (matched, how they differ).
pub(crate) fn compare_step(
    step: usize,
    rec: &[SegEvent],
    pred: &[SegEvent],
) -> (u64, Option<String>) {
    let same = |r: &SegEvent, p: &SegEvent| {
        r.kind == p.kind
            && r.size == p.size
            && (r.kind == SegKind::SegmentAlloc || r.addr == p.addr)
    };
    let mut j = 0usize;
    let mut matched = 0u64;
    for r in rec {
        let window = pred.len().min(j + 64);
        if let Some(k) = (j..window).find(|&k| same(r, &pred[k])) {
            matched += 1;
            j = k + 1;
        }
    }
    if matched as usize == rec.len() && pred.len() == rec.len() {
        return (matched, None);
    }
    let show = |v: &[SegEvent]| {
        v.iter()
            .take(3)
            .map(|e| format!("{} {} B", e.kind.as_str(), e.size))
            .collect::<Vec<_>>()
            .join(", ")
    };
    (
        matched,
        Some(format!(
            "at trace entry {step}: recorded {} event(s) [{}], model {} [{}]",
            rec.len(),
            show(rec),
            pred.len(),
            show(pred)
        )),
    )
}
