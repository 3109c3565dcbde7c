//! A device's capacity read from its refusals, where no OOM is recorded.
//!
//! A validation replay that runs a malloc through the OOM path (the device refused a new
//! segment, the allocator released cached segments and retried) shows the device refused
//! reserved + that segment; every segment it granted shows reserved after it fit. With the
//! device's memory for this process constant, its capacity lies in
//! `[highest reserved, least refused reserved + segment − 1]`. Where that range is not empty
//! and the request-order replay, unchanged, reproduces the recorded segment events at both of
//! its ends, the fixes are replayed at both ends (see [`super::what_if`]); else none is.

use super::Prepared;
use super::addr_of::AddrOf;
use super::model::{Model, SegKind};
use super::run::{self, Done, Observer, Op, OpKind};
use crate::findings::fmt_bytes;
use crate::torch::model::TraceEntry;

/// Wraps the validation's observer and notes, of every probe whose malloc went through the
/// OOM path, the reserved bytes it asked the device for (reserved before it + the segment).
pub(super) struct Demands<'a, O: Observer> {
    pub inner: &'a mut O,
    reserved_before: u64,
    /// The least refused reserved + segment.
    pub least: Option<u64>,
    /// Each refusal: (first release's position, segments released, bytes released, the
    /// malloc's trace entry).
    pub episodes: Vec<(usize, u64, u64, usize)>,
}

impl<'a, O: Observer> Demands<'a, O> {
    pub fn new(inner: &'a mut O) -> Self {
        Demands {
            inner,
            reserved_before: 0,
            least: None,
            episodes: Vec::new(),
        }
    }
}

impl<O: Observer> Observer for Demands<'_, O> {
    fn before(&mut self, op: &Op, m: &Model, addr_of: &AddrOf) -> bool {
        if matches!(op.kind, OpKind::Probe { .. }) {
            self.reserved_before = m.reserved;
        }
        self.inner.before(op, m, addr_of)
    }

    fn after(&mut self, op: &Op, done: Done, m: &Model, addr_of: &AddrOf) -> bool {
        if let (OpKind::Probe { .. }, Done::Malloc { events, entry, .. }) = (op.kind, done) {
            let new = m.events.get(events..).unwrap_or_default();
            let (segments, bytes) = new
                .iter()
                .filter(|e| matches!(e.kind, SegKind::SegmentFree | SegKind::SegmentUnmap))
                .fold((0u64, 0u64), |(n, b), e| (n + 1, b.saturating_add(e.size)));
            self.episodes.push((op.pos, segments, bytes, entry));
            // The retry asks for the segment the refused attempt asked for.
            let grown = new
                .iter()
                .find(|e| matches!(e.kind, SegKind::SegmentAlloc | SegKind::SegmentMap));
            if let Some(g) = grown {
                let demand = self.reserved_before.saturating_add(g.size);
                self.least = Some(self.least.map_or(demand, |l| l.min(demand)));
            }
        }
        self.inner.after(op, done, m, addr_of)
    }

    fn end(&mut self, m: &Model, addr_of: &AddrOf) {
        self.inner.end(m, addr_of);
    }
}

/// A capacity range read from refusals and checked by replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Inferred {
    /// The highest reserved the device granted.
    pub low: u64,
    /// The least it refused, less one byte.
    pub high: u64,
    pub refusals: u64,
}

/// Why the capacity could not be read from the refusals, or the range it lies in.
pub(crate) enum Read {
    Range(Inferred),
    /// The words for the device's note.
    No(String),
}

/// The capacity range of a validated device whose validation `out` ran `least` as its least
/// refused demand, checked by replaying its requests unchanged at both ends: each must give the
/// recorded segment events (kind, address, size, in order) and peaks, with no OOM.
pub(super) fn read(
    trace: &[TraceEntry],
    p: &Prepared,
    out: &run::Outcome,
    least: Option<u64>,
) -> Read {
    let n = out.refused_probes;
    let Some(least) = least else {
        return Read::No(
            "its capacity, and when a changed run would be refused, is unknown".into(),
        );
    };
    let low = out.peak_reserved;
    let high = least.saturating_sub(1);
    if low > high {
        return Read::No(format!(
            "it granted {} reserved but refused {}, so its capacity was not constant and when a \
             changed run would be refused is unknown",
            fmt_bytes(low),
            fmt_bytes(least)
        ));
    }
    for c in [low, high] {
        if let Some(why) = differs_at(trace, p, out, c) {
            return Read::No(format!(
                "by those refusals its capacity is between {} and {}, but at {} the unchanged \
                 requests {why}, so when a changed run would be refused is unknown",
                fmt_bytes(low),
                fmt_bytes(high),
                fmt_bytes(c)
            ));
        }
    }
    Read::Range(Inferred {
        low,
        high,
        refusals: n,
    })
}

/// How the unchanged request-order replay at `capacity` differs from the validation, if it does.
fn differs_at(
    trace: &[TraceEntry],
    p: &Prepared,
    out: &run::Outcome,
    capacity: u64,
) -> Option<String> {
    let r = super::state::requests_at(trace, p, capacity, &out.empty_cache_probes, &mut NoWatch);
    let same = |a: &[super::model::SegEvent], b: &[super::model::SegEvent]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x.kind, x.addr, x.size) == (y.kind, y.addr, y.size))
    };
    if r.unexpected_ooms > 0 {
        Some(format!(
            "run out of memory at trace entry {}",
            r.first_unexpected_oom.unwrap_or(0)
        ))
    } else if !same(&r.events, &out.events) {
        Some("make other segment events than the recorded ones".into())
    } else if (r.peak_allocated, r.peak_reserved) != (out.peak_allocated, out.peak_reserved) {
        Some("peak elsewhere than recorded".into())
    } else {
        None
    }
}

struct NoWatch;
impl Observer for NoWatch {}

/// The refusals a validation replay ran (see [`Demands::episodes`]), as OOM-retry episodes.
pub(super) fn episodes(
    trace: &[TraceEntry],
    episodes: &[(usize, u64, u64, usize)],
) -> Vec<crate::torch::release::OomRetry> {
    episodes
        .iter()
        .map(
            |&(at, segments, bytes, entry)| crate::torch::release::OomRetry {
                index: at as u64,
                segments,
                bytes,
                request: trace.get(entry).map(|e| (entry as u64, e.size, e.stack())),
            },
        )
        .collect()
}
