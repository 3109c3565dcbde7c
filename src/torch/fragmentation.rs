//! Was an OOM caused by fragmentation? Compare each failed request with the cached free memory.
//!
//! An allocation fails when no single inactive block is large enough and the device cannot give a
//! new segment. If the inactive total (plus what the device still had free) would have covered
//! the request but the largest inactive block would not, the memory is there but split into
//! pieces: an allocator setting helps. If even the total would not cover it, live tensors fill the
//! device and only model-level changes help. Both verdicts are stated plainly.

use crate::findings::fmt_bytes;
use crate::torch::model::{BlockState, Snapshot};
use crate::torch::timeline::Timeline;
use crate::torch::totals::Totals;

/// What caused one OOM, as far as the allocator state shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Enough cached free bytes in total, but no block large enough: fragmentation.
    Fragmentation,
    /// Cached free + device free would not cover the request: live tensors fill the device.
    LiveTensorsNearCapacity,
    /// A cached block looks large enough; the state at dump time differs from the OOM state
    /// (another stream's blocks, a private pool, or frees after the OOM).
    Unclear,
}

/// The fragmentation check of one `oom` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct OomDiagnosis {
    pub device: i64,
    pub index: u64,
    pub request: u64,
    pub device_free: Option<u64>,
    pub reserved: u64,
    pub live: u64,
    pub inactive: u64,
    /// Largest inactive block the request could use: one of its pool (small or large) and
    /// stream.
    pub largest_inactive: u64,
    /// Largest inactive block of any pool or stream.
    pub largest_inactive_any: u64,
    pub segments_with_inactive: u64,
    pub segment_count: u64,
    pub expandable_already: bool,
    pub verdict: Verdict,
}

impl OomDiagnosis {
    /// `max_split_size_mb` near the failed request (MiB, rounded up).
    pub fn max_split_mb(&self) -> u64 {
        self.request.div_ceil(1 << 20).max(1)
    }

    /// The sentence a user reads.
    pub fn explain(&self) -> String {
        let free = self.device_free.map(fmt_bytes);
        match self.verdict {
            Verdict::Fragmentation => format!(
                "fragmentation: the request of {} is larger than the largest inactive block ({}), \
                 although {} sit inactive across {} of {} segments{}{}",
                fmt_bytes(self.request),
                fmt_bytes(self.largest_inactive),
                fmt_bytes(self.inactive),
                self.segments_with_inactive,
                self.segment_count,
                free.map(|f| format!(" and the device had {f} free"))
                    .unwrap_or_default(),
                if self.largest_inactive_any > self.largest_inactive {
                    format!(
                        "; a larger inactive block ({}) belongs to the other pool or another \
                         stream, which this request cannot use",
                        fmt_bytes(self.largest_inactive_any)
                    )
                } else {
                    String::new()
                },
            ),
            Verdict::LiveTensorsNearCapacity => format!(
                "not fragmentation: the request of {} exceeds all cached free memory ({}){}; live \
                 tensors hold {} of {} reserved, so allocator settings will not help — reduce what \
                 is live (batch size, activation checkpointing, sharding, lower precision)",
                fmt_bytes(self.request),
                fmt_bytes(self.inactive),
                free.map(|f| format!(" plus the device's free {f}"))
                    .unwrap_or_default(),
                fmt_bytes(self.live),
                fmt_bytes(self.reserved),
            ),
            Verdict::Unclear => format!(
                "fragmentation cannot be judged: the request of {} would fit in the {} of cached free \
                 memory, but the block layout at the OOM is not the one dumped (blocks were freed \
                 after it), or the fitting block ({} largest) belongs to another stream or pool",
                fmt_bytes(self.request),
                fmt_bytes(self.inactive),
                fmt_bytes(self.largest_inactive),
            ),
        }
    }
}

/// Diagnose every OOM event of the snapshot.
pub fn diagnose(snap: &Snapshot, totals: &Totals, timeline: &Timeline) -> Vec<OomDiagnosis> {
    let settings_expandable = snap
        .allocator_settings
        .as_ref()
        .and_then(|s| s.expandable_segments)
        .unwrap_or(false);
    let mut out = Vec::new();
    for oom in totals.oom_events() {
        let Some(dev) = totals.device(oom.device) else {
            continue;
        };
        let m = &dev.memory;
        let set = timeline
            .device(oom.device)
            .and_then(|t| t.oom_sets.iter().find(|s| s.index == oom.index));
        let live = set
            .map(|s| s.bytes)
            .unwrap_or(m.allocated.saturating_add(m.pending_free));
        // Reserved and inactive at the OOM: the dump may come after the exception freed tensors.
        let reserved = set.map_or(m.reserved, |s| {
            let r = i128::from(m.reserved) - i128::from(s.reserved_added_after);
            u64::try_from(r.max(0)).unwrap_or(m.reserved)
        });
        let changed = set.is_some_and(|s| s.changed_after);
        let inactive = if changed {
            reserved.saturating_sub(live)
        } else {
            m.inactive
        };
        let largest_any = m.largest_inactive.unwrap_or(0);
        // Only a cached block of the request's pool and stream can serve it.
        let largest = snap
            .segments_of(oom.device)
            .filter(|s| s.serves(oom.stream, oom.size))
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
            .max()
            .unwrap_or(0);
        let free = oom.device_free.unwrap_or(0);
        let verdict = if oom.size > inactive.saturating_add(free) {
            Verdict::LiveTensorsNearCapacity
        } else if changed || oom.size <= largest {
            // The block layout at the OOM is not the dumped one (or a block looks large enough).
            Verdict::Unclear
        } else {
            Verdict::Fragmentation
        };
        out.push(OomDiagnosis {
            device: oom.device,
            index: oom.index,
            request: oom.size,
            device_free: oom.device_free,
            reserved,
            live,
            inactive,
            largest_inactive: largest,
            largest_inactive_any: largest_any,
            segments_with_inactive: m.segments_with_inactive,
            segment_count: m.segment_count,
            expandable_already: settings_expandable || m.expandable_segments > 0,
            verdict,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::FrameFilter;
    use crate::torch::model::{Action, BlockState};
    use crate::torch::stacks::StackIndex;
    use crate::torch::totals::tests::{block, entry, segment};

    fn run(inactive: &[u64], request: u64, device_free: u64) -> OomDiagnosis {
        let mut snap = Snapshot::default();
        let mut segs = Vec::new();
        for (i, b) in inactive.iter().enumerate() {
            segs.push(segment(
                0,
                (i as u64 + 1) << 32,
                vec![
                    block(64 << 20, 64 << 20, BlockState::ActiveAllocated),
                    block(*b, 0, BlockState::Inactive),
                ],
            ));
        }
        snap.segments = segs;
        let mut oom = entry(Action::Oom, 0, request);
        oom.set_device_free(Some(device_free));
        snap.device_traces = Some(vec![vec![oom]]);
        let idx = StackIndex::new(&snap, &FrameFilter::default());
        let t = crate::torch::totals::compute(&snap, &idx);
        let tl = crate::torch::timeline::compute(&snap, &idx);
        let d = diagnose(&snap, &t, &tl);
        assert_eq!(d.len(), 1);
        d[0].clone()
    }

    #[test]
    fn split_inactive_memory_is_fragmentation() {
        let d = run(&[30 << 20, 30 << 20, 30 << 20], 80 << 20, 2 << 20);
        assert_eq!(d.verdict, Verdict::Fragmentation);
        assert_eq!(d.segments_with_inactive, 3);
        assert_eq!(d.max_split_mb(), 80);
        assert!(d.explain().starts_with("fragmentation"));
    }

    #[test]
    fn a_small_request_cannot_use_large_pool_pieces() {
        // 512 KiB (small pool) fails with 8 MiB cached in a large segment, 256 KiB pieces in
        // the small pool's 2 MiB segment and 1 MiB left on the device: no 2 MiB segment fits.
        let mut snap = Snapshot::default();
        let mut small = segment(
            0,
            1 << 32,
            vec![
                block(768 << 10, 768 << 10, BlockState::ActiveAllocated),
                block(256 << 10, 0, BlockState::Inactive),
                block(768 << 10, 768 << 10, BlockState::ActiveAllocated),
                block(256 << 10, 0, BlockState::Inactive),
            ],
        );
        small.segment_type = Some("small".into());
        snap.segments = vec![
            segment(
                0,
                2 << 32,
                vec![
                    block(12 << 20, 12 << 20, BlockState::ActiveAllocated),
                    block(8 << 20, 0, BlockState::Inactive),
                ],
            ),
            small,
        ];
        let mut oom = entry(Action::Oom, 0, 512 << 10);
        oom.set_device_free(Some(1 << 20));
        snap.device_traces = Some(vec![vec![oom]]);
        let idx = StackIndex::new(&snap, &FrameFilter::default());
        let t = crate::torch::totals::compute(&snap, &idx);
        let tl = crate::torch::timeline::compute(&snap, &idx);
        let d = &diagnose(&snap, &t, &tl)[0];
        assert_eq!(d.verdict, Verdict::Fragmentation);
        assert_eq!(
            (d.largest_inactive, d.largest_inactive_any),
            (256 << 10, 8 << 20)
        );
        assert!(
            d.explain()
                .ends_with("a larger inactive block (8.00 MiB) belongs to the other pool or another stream, which this request cannot use"),
            "{}",
            d.explain()
        );
    }

    #[test]
    fn live_tensors_near_capacity_is_not_fragmentation() {
        let d = run(&[2 << 20], 512 << 20, 10 << 20);
        assert_eq!(d.verdict, Verdict::LiveTensorsNearCapacity);
        assert!(d.explain().starts_with("not fragmentation"));
        assert_eq!(d.live, 64 << 20);
    }
}
