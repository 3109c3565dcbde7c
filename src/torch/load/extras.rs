//! The snapshot keys beside segments and traces: `external_annotations` (2.5+), the ring
//! buffer's `trace_alloc_overflowed` / `trace_alloc_max_entries` (2026), and the pinned host
//! allocator's `host_segments` / `host_traces` (2.14). None of them can fail a load: a value of
//! an unexpected shape is skipped.

use super::{BLOCK_KEYS, Builder};
use crate::pickle::Val;
use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::torch::model::{Annotation, AnnotationStage, RingBuffer};

const ANNOTATION_KEYS: &[&str; 4] = &["name", "stage", "device", "time_us"];
const HOST_SEGMENT_KEYS: &[&str; 4] = &["total_size", "size", "allocated_size", "blocks"];

impl Builder<'_, '_> {
    /// `external_annotations` (FORMAT.md §8): entries that are not dicts with a `START`/`END`
    /// stage are skipped (an annotation only names a span; nothing else depends on it).
    pub(super) fn annotations(&mut self, list: Val) {
        let t = self.t;
        if !t.is_seq(list) {
            return;
        }
        for &a in t.items(list) {
            if !t.is_dict(a) {
                continue;
            }
            let [name, stage, device, time_us] = self.fields(a, ANNOTATION_KEYS);
            let stage = match stage.and_then(|s| t.str(s)) {
                Some("START") => AnnotationStage::Start,
                Some("END") => AnnotationStage::End,
                _ => continue,
            };
            self.snap.annotations.push(Annotation {
                name: name
                    .and_then(|n| t.str(n))
                    .unwrap_or("<unnamed>")
                    .to_string(),
                stage,
                device: self.int(device).unwrap_or(0),
                time_us: self.int(time_us),
            });
        }
    }

    /// Values by device of a per-device key: a list indexed by device, a dict keyed by device,
    /// or one value for every device of the trace.
    fn per_device(&self, v: Val) -> Vec<(i64, Val)> {
        let t = self.t;
        if t.is_seq(v) {
            return t
                .items(v)
                .iter()
                .enumerate()
                .map(|(d, x)| (d as i64, *x))
                .collect();
        }
        if t.is_dict(v) {
            return t
                .pairs(v)
                .filter_map(|(k, x)| {
                    let d = t
                        .int128(k)
                        .or_else(|| t.str(k).and_then(|s| s.parse().ok()))?;
                    Some((i64::try_from(d).ok()?, x))
                })
                .collect();
        }
        let devices = self
            .snap
            .device_traces
            .as_ref()
            .map_or(1, |d| d.len().max(1));
        (0..devices as i64).map(|d| (d, v)).collect()
    }

    /// `trace_alloc_overflowed` / `trace_alloc_max_entries` (FORMAT.md §9).
    pub(super) fn ring_buffers(&mut self, overflowed: Option<Val>, max_entries: Option<Val>) {
        let t = self.t;
        // By device (a list of 10^6 devices was quadratic with a search per entry).
        let mut out: BTreeMap<i64, RingBuffer> = BTreeMap::new();
        if let Some(v) = overflowed {
            for (d, x) in self.per_device(v) {
                slot(&mut out, d).overflowed = t.bool(x).or_else(|| t.int128(x).map(|i| i != 0));
            }
        }
        if let Some(v) = max_entries {
            for (d, x) in self.per_device(v) {
                slot(&mut out, d).max_entries = t.int128(x).and_then(|i| u64::try_from(i).ok());
            }
        }
        self.snap.ring_buffers = out.into_values().collect();
    }

    /// `host_segments` / `host_traces` (torch 2.14): totals only, never mixed into the device's.
    pub(super) fn host(&mut self, segments: Option<Val>, traces: Option<Val>) {
        let t = self.t;
        let mut h = crate::torch::model::HostMemory::default();
        // A dict referenced many times through the memo is read once (10^6 references to one
        // segment of 1,000 blocks would otherwise walk 10^9 blocks).
        let mut seen: FxHashMap<crate::pickle::Val, (u64, u64)> = FxHashMap::default();
        if let Some(list) = segments.filter(|v| t.is_seq(*v)) {
            for &seg in t.items(list) {
                if !t.is_dict(seg) {
                    continue;
                }
                let (reserved, alloc) = match seen.get(&seg) {
                    Some(&x) => x,
                    None => {
                        let [total, size, allocated, blocks] = self.fields(seg, HOST_SEGMENT_KEYS);
                        let reserved = self.uint(total.or(size));
                        let alloc = match (allocated, blocks) {
                            (Some(a), _) => self.uint(Some(a)),
                            (None, Some(b)) if t.is_seq(b) => self.active_block_bytes(b),
                            _ => 0,
                        };
                        seen.insert(seg, (reserved, alloc));
                        (reserved, alloc)
                    }
                };
                h.segments += 1;
                h.reserved_bytes = h.reserved_bytes.saturating_add(reserved);
                h.allocated_bytes = h.allocated_bytes.saturating_add(alloc);
            }
        }
        if let Some(tr) = traces.filter(|v| t.is_seq(*v)) {
            h.trace_entries = t.items(tr).len() as u64;
        }
        self.snap.host = Some(h);
    }

    fn active_block_bytes(&mut self, blocks: Val) -> u64 {
        let t = self.t;
        let mut sum = 0u64;
        for &b in t.items(blocks) {
            if !t.is_dict(b) {
                continue;
            }
            let [_, size, _, state, _, _] = self.fields(b, BLOCK_KEYS);
            if state.and_then(|s| t.str(s)) == Some("active_allocated") {
                sum = sum.saturating_add(self.uint(size));
            }
        }
        sum
    }
}

fn slot(out: &mut BTreeMap<i64, RingBuffer>, d: i64) -> &mut RingBuffer {
    out.entry(d).or_insert_with(|| RingBuffer {
        device: d,
        ..Default::default()
    })
}
