//! What a decoded snapshot will hold in memory, counted before the model is built, and the
//! budget it must stay under (`--max-model-bytes`; by default tied to the file's size:
//! `DecodeOptions::model_budget`).
//!
//! The pickle graph is bounded by the file (docs/LIMITS.md), but the model built from it is
//! not: a pickle memo reference to a segment dict costs a few bytes in the file and a whole
//! `Segment` with its blocks in the model (one dict referenced 10^6 times: a 2.0 MB file, 464 MiB
//! resident), and each device the file names gets its own totals, sites and summary (400,000
//! empty device traces: a 0.8 MB file, 0.9 GiB). So every reference counts as its container's
//! size again, every device its per-device analysis; an empty trace list itself adds nothing.

use std::mem::size_of;
use std::path::Path;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::error::{CaptureError, ErrorKind};
use crate::findings::fmt_bytes;
use crate::options::DecodeOptions;
use crate::pickle::{Tree, Val};
use crate::torch::model::{Annotation, Block, RingBuffer, Segment, TraceEntry};

/// What the analysis keeps per device (totals, sites, timeline and summary of a device with one
/// small segment: about 2.2 KB measured at 400,000 devices, rounded up).
pub const DEVICE_BYTES: u64 = 4096;

/// What the model of a snapshot will hold, by part.
#[derive(Debug, Default, PartialEq)]
pub struct ModelCount {
    pub segments: u64,
    pub blocks: u64,
    pub trace_entries: u64,
    pub devices: u64,
    /// `external_annotations` entries, and their names' bytes (each entry owns its name, so
    /// one dict referenced 10^6 times through the memo is 10^6 names).
    pub annotations: u64,
    pub annotation_name_bytes: u64,
    /// Devices named by `trace_alloc_overflowed` / `trace_alloc_max_entries`.
    pub ring_buffers: u64,
}

impl ModelCount {
    /// Estimated bytes: the model's records plus the analysis kept per device.
    pub fn bytes(&self) -> u64 {
        let s = self.segments.saturating_mul(size_of::<Segment>() as u64);
        let b = self.blocks.saturating_mul(size_of::<Block>() as u64);
        let e = self
            .trace_entries
            .saturating_mul(size_of::<TraceEntry>() as u64);
        let d = self.devices.saturating_mul(DEVICE_BYTES);
        let a = self
            .annotations
            .saturating_mul(size_of::<Annotation>() as u64)
            .saturating_add(self.annotation_name_bytes);
        let r = self
            .ring_buffers
            .saturating_mul(size_of::<RingBuffer>() as u64);
        s.saturating_add(b)
            .saturating_add(e)
            .saturating_add(d)
            .saturating_add(a)
            .saturating_add(r)
    }

    /// Count the keys beside segments and traces into `self`: `annotations`
    /// (`external_annotations`), and `ring` (`trace_alloc_overflowed`, `trace_alloc_max_entries`:
    /// each device they name is a device of the analysis, `torch::recording`). The pinned host
    /// allocator's keys are reduced to totals while read and cost nothing here.
    pub fn add_extras(&mut self, t: &Tree<'_>, annotations: Option<Val>, ring: [Option<Val>; 2]) {
        if let Some(list) = annotations.filter(|v| t.is_seq(*v)) {
            // A dict referenced many times is read once.
            let mut seen: FxHashMap<Val, u64> = FxHashMap::default();
            for &a in t.items(list) {
                let name = *seen.entry(a).or_insert_with(|| annotation_name(t, a));
                self.annotations += 1;
                self.annotation_name_bytes = self.annotation_name_bytes.saturating_add(name);
            }
        }
        for v in ring.into_iter().flatten() {
            let named = if t.is_seq(v) {
                t.items(v).len() as u64
            } else if t.is_dict(v) {
                t.pairs(v).count() as u64
            } else {
                0
            };
            self.ring_buffers = self.ring_buffers.max(named);
        }
        self.devices = self.devices.max(self.ring_buffers);
    }
}

/// An annotation dict's name length (0 for anything else: the builder skips it).
fn annotation_name(t: &Tree<'_>, a: Val) -> u64 {
    if !t.is_dict(a) {
        return 0;
    }
    t.pairs(a)
        .find(|(k, _)| t.str(*k) == Some("name"))
        .and_then(|(_, v)| t.str(v))
        .map_or(0, |s| s.len() as u64)
}

/// Count what the model of the decoded tree will hold: `segments` (the list, or `None`),
/// `traces` (the `device_traces` list, or `None`), `streamed` entries already decoded, and
/// `keep` (the newest entries kept per device list, `--max-trace-events`).
pub fn count(
    t: &Tree<'_>,
    segments: Option<Val>,
    traces: Option<Val>,
    streamed: &[u64],
    keep: Option<usize>,
) -> ModelCount {
    let mut c = ModelCount::default();
    let mut devices: FxHashSet<i64> = FxHashSet::default();
    let trace_lists = traces
        .filter(|v| t.is_seq(*v))
        .map_or(0, |v| t.items(v).len());
    if let Some(list) = segments.filter(|v| t.is_seq(*v)) {
        // A dict referenced many times is read once: (device, blocks).
        let mut seen: FxHashMap<Val, (i64, u64)> = FxHashMap::default();
        for &seg in t.items(list) {
            let (device, blocks) = *seen.entry(seg).or_insert_with(|| segment(t, seg));
            c.segments += 1;
            c.blocks = c.blocks.saturating_add(blocks);
            if usize::try_from(device).map_or(true, |d| d >= trace_lists) {
                devices.insert(device);
            }
        }
    }
    c.devices = devices.len() as u64 + trace_lists as u64;
    if let Some(list) = traces.filter(|v| t.is_seq(*v)) {
        for &dev in t.items(list) {
            if t.streamed_ordinal(dev).is_some() || !t.is_seq(dev) {
                continue;
            }
            let n = t.items(dev).len();
            let n = keep.map_or(n, |k| n.min(k));
            c.trace_entries = c.trace_entries.saturating_add(n as u64);
        }
    }
    c.trace_entries = streamed
        .iter()
        .fold(c.trace_entries, |a, n| a.saturating_add(*n));
    c
}

/// A segment dict's device and number of blocks (0, 0 for anything else: the builder reports it).
fn segment(t: &Tree<'_>, seg: Val) -> (i64, u64) {
    if !t.is_dict(seg) {
        return (0, 0);
    }
    let mut out = (0, 0);
    for (k, v) in t.pairs(seg) {
        match t.str(k) {
            Some("device") => out.0 = t.int(v).unwrap_or(0),
            Some("blocks") => out.1 = t.items(v).len() as u64,
            _ => {}
        }
    }
    out
}

/// `Err` when the count is over the budget for a file of `file_len` bytes.
pub fn check(
    path: &Path,
    c: &ModelCount,
    file_len: u64,
    opts: &DecodeOptions,
) -> Result<(), CaptureError> {
    let limit = opts.model_budget(file_len);
    let need = c.bytes();
    if need <= limit {
        return Ok(());
    }
    Err(CaptureError::new(
        path,
        ErrorKind::Limit,
        None,
        format!(
            "the snapshot would hold about {} in memory ({} segments, {} blocks, {} trace entries, \
             {} devices, {} annotations), over the budget of {} ({})",
            fmt_bytes(need),
            c.segments,
            c.blocks,
            c.trace_entries,
            c.devices,
            c.annotations,
            fmt_bytes(limit),
            opts.model_budget_rule(file_len),
        ),
        "a small file asks for this much only when it references its parts many times or names \
         many devices; if you trust it, raise --max-model-bytes (server: maxModelBytes)",
    ))
}
