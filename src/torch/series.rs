//! Active memory over the trace, stacked by site, downsampled for a picture: per pixel column the
//! sample where the column's total is highest (so no peak is lost), the lowest total, and the
//! reserved bytes. What a chart draws, computed here so a page receives only what it draws.
//!
//! Bands: the sites holding most at the trace's peak (first user frame), "other sites", and
//! "allocated before the recorded window" (the live bytes the trace starts with, which only
//! shrink as those blocks are freed). Three linear passes over the trace.

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::findings::{Location, Stack};
use crate::torch::model::{Action, BlockState, SMALL_SIZE, Segment, Snapshot, TraceEntry};
use crate::torch::replay::{self, At};
use crate::torch::stacks::{SiteKey, StackIndex, location, stack_locations};

/// Columns a series is downsampled to.
pub const COLUMNS: usize = 800;
/// Sites drawn as their own band.
pub const BANDS: usize = 8;

/// What a band is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BandKind {
    Site,
    Other,
    BeforeWindow,
}

/// One band of the stacked chart.
#[derive(Clone, Debug, Serialize)]
pub struct Band {
    pub kind: BandKind,
    /// The site's first user frame (sites only).
    pub location: Option<Location>,
    /// The allocation stack of one of its blocks, innermost first (sites only, a few frames).
    pub stack: Stack,
    /// Bytes this band holds at the trace's peak.
    pub bytes_at_peak: u64,
}

/// One pixel column.
#[derive(Clone, Debug, Serialize)]
pub struct Column {
    /// Trace entries the column covers.
    pub first: u64,
    pub last: u64,
    /// The entry where the total is highest in the column; `values` are taken there.
    pub at: u64,
    pub values: Vec<u64>,
    pub total_min: u64,
    pub total_max: u64,
    /// Highest reserved bytes in the column.
    pub reserved: u64,
    pub time_us: Option<i64>,
}

/// An `oom` entry on the chart.
#[derive(Clone, Debug, Serialize)]
pub struct OomMark {
    pub index: u64,
    pub size: u64,
    /// Reserved + `device_free` at the OOM, when recorded.
    pub capacity: Option<u64>,
}

/// One device's series.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    pub device: i64,
    pub entries: u64,
    pub bands: Vec<Band>,
    pub columns: Vec<Column>,
    /// Entry and bytes of the highest total.
    pub peak: Option<(u64, u64)>,
    pub ooms: Vec<OomMark>,
}

/// A segment of the allocator state, blocks merged where adjacent ones share a state and are
/// too small to see.
#[derive(Clone, Debug, Serialize)]
pub struct SegmentBar {
    pub address: u64,
    pub total_size: u64,
    /// `(size, state)`: `allocated`, `pending` or `free`.
    pub blocks: Vec<(u64, &'static str)>,
}

fn state_name(s: &BlockState) -> &'static str {
    match s {
        BlockState::ActiveAllocated => "allocated",
        BlockState::ActivePendingFree => "pending",
        BlockState::Inactive => "free",
        BlockState::Other(_) => "other",
    }
}

/// The allocator state at the snapshot: segments of `device`, at most `max_segments`, largest
/// first, blocks below 1/500 of the largest segment merged into their neighbour of that state.
pub fn segments(snap: &Snapshot, device: i64, max_segments: usize) -> Vec<SegmentBar> {
    segment_bars(snap.segments_of(device).collect(), max_segments)
}

/// Bars of the segments `segs` (one device's), as [`segments`] draws them. Where that would
/// still leave more than [`MAX_BLOCK_ENTRIES`] blocks, blocks below 1/4000 of the segments'
/// total are merged instead, so a picture stays small whatever the input.
pub fn segment_bars(mut segs: Vec<&Segment>, max_segments: usize) -> Vec<SegmentBar> {
    segs.sort_by(|a, b| {
        b.total_size
            .cmp(&a.total_size)
            .then(a.address.cmp(&b.address))
    });
    segs.truncate(max_segments);
    let largest = segs.first().map(|s| s.total_size).unwrap_or(0);
    let mut out = bars(&segs, largest / 500);
    if out.iter().map(|s| s.blocks.len()).sum::<usize>() > MAX_BLOCK_ENTRIES {
        let total = segs
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.total_size));
        out = bars(&segs, (total / 4000).max(largest / 500));
    }
    out.sort_by_key(|s| s.address);
    out
}

/// Block entries above which [`segment_bars`] merges more.
pub const MAX_BLOCK_ENTRIES: usize = 8000;

/// Each segment's blocks, those below `small` merged into their neighbour.
fn bars(segs: &[&Segment], small: u64) -> Vec<SegmentBar> {
    segs.iter()
        .map(|s| {
            let mut blocks: Vec<(u64, &'static str)> = Vec::new();
            for b in &s.blocks {
                let st = state_name(&b.state);
                match blocks.last_mut() {
                    Some(last) if last.1 == st || (b.size < small && last.0 < small) => {
                        last.0 = last.0.saturating_add(b.size);
                    }
                    _ => blocks.push((b.size, st)),
                }
            }
            SegmentBar {
                address: s.address,
                total_size: s.total_size,
                blocks,
            }
        })
        .collect()
}

/// Which moment of the trace a [`StatePanel`] shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Moment {
    /// Just after the entry where active memory is highest (the series' peak).
    Peak,
    /// Just before the request of the first `oom` entry began (before its OOM path released
    /// anything).
    Oom,
}

/// The request that failed at an OOM, against what its pool had free.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedRequest {
    /// The rounded request (the `oom` entry's size).
    pub bytes: u64,
    /// `small` (≤ 1 MiB) or `large`: the pool the allocator served it from.
    pub pool: &'static str,
    pub stream: u64,
    /// The largest free (inactive) block of that pool and stream, 0 when none.
    pub largest_free_bytes: u64,
    /// Every free byte of that pool and stream.
    pub pool_free_bytes: u64,
    /// What the device had left, as recorded in the `oom` entry.
    pub device_free: Option<u64>,
}

/// The allocator state at one moment of a device's trace, replayed from the trace (only where
/// the unchanged replay reproduces every recorded segment event).
#[derive(Clone, Debug, Serialize)]
pub struct StatePanel {
    pub device: i64,
    pub moment: Moment,
    /// The trace entry: the peak's, or the `oom` entry's.
    pub entry: u64,
    /// Segments in that state (at most `max_segments` of them are in `segments`).
    pub segment_count: u64,
    pub reserved_bytes: u64,
    /// Allocated or freed but awaiting another stream.
    pub active_bytes: u64,
    pub segments: Vec<SegmentBar>,
    /// At an OOM: the request that failed.
    pub request: Option<FailedRequest>,
}

/// The allocator state at the peak and at the first OOM of each device in `series` whose
/// replay validated (`validated`), one replay per device.
pub fn state_panels(
    snap: &Snapshot,
    replays: &replay::Replays,
    series: &[Series],
    validated: &[i64],
    max_segments: usize,
) -> Vec<StatePanel> {
    let mut out = Vec::new();
    let validated: rustc_hash::FxHashSet<i64> = validated.iter().copied().collect();
    for s in series.iter().filter(|s| validated.contains(&s.device)) {
        let trace = snap.trace(s.device);
        let oom = trace.iter().position(|e| e.action == Action::Oom);
        let mut want: Vec<(Moment, usize, At)> = Vec::new();
        if let Some((i, _)) = s.peak {
            want.push((Moment::Peak, i as usize, At::After(i as usize)));
        }
        if let Some(i) = oom {
            want.push((Moment::Oom, i, At::BeforeRequest(i)));
        }
        if want.is_empty() {
            continue;
        }
        let at: Vec<At> = want.iter().map(|w| w.2).collect();
        let Some(states) = replays.recorded_states(snap, s.device, &at) else {
            continue;
        };
        for ((moment, entry, _), segs) in want.into_iter().zip(states) {
            let request = (moment == Moment::Oom)
                .then(|| trace.get(entry))
                .flatten()
                .map(|e| failed_request(&segs, e));
            let blocks = || segs.iter().flat_map(|g| g.blocks.iter());
            out.push(StatePanel {
                device: s.device,
                moment,
                entry: entry as u64,
                segment_count: segs.len() as u64,
                reserved_bytes: segs.iter().map(|g| g.total_size).sum(),
                active_bytes: blocks()
                    .filter(|b| b.state != BlockState::Inactive)
                    .map(|b| b.size)
                    .sum(),
                segments: segment_bars(segs.iter().collect(), max_segments),
                request,
            });
        }
    }
    out
}

/// The failed request of `oom` against the free blocks of its pool and stream in `segs`.
fn failed_request(segs: &[Segment], oom: &TraceEntry) -> FailedRequest {
    let free: Vec<u64> = segs
        .iter()
        .filter(|g| g.serves(oom.stream, oom.size))
        .flat_map(|g| g.blocks.iter())
        .filter(|b| b.state == BlockState::Inactive)
        .map(|b| b.size)
        .collect();
    FailedRequest {
        bytes: oom.size,
        pool: if oom.size <= SMALL_SIZE {
            "small"
        } else {
            "large"
        },
        stream: oom.stream,
        largest_free_bytes: free.iter().copied().max().unwrap_or(0),
        pool_free_bytes: free.iter().sum(),
        device_free: oom.device_free(),
    }
}

/// The series of every device with a trace.
pub fn compute(snap: &Snapshot, stacks: &StackIndex, live_start: &[(i64, i64)]) -> Vec<Series> {
    let Some(traces) = &snap.device_traces else {
        return Vec::new();
    };
    let mut starts: rustc_hash::FxHashMap<i64, i64> = rustc_hash::FxHashMap::default();
    for (dev, b) in live_start {
        starts.entry(*dev).or_insert(*b);
    }
    traces
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .map(|(d, list)| {
            let device = d as i64;
            let start = starts.get(&device).map_or(0, |b| (*b).max(0) as u64);
            device_series(snap, stacks, device, list, start)
        })
        .collect()
}

fn signed_add(a: u64, d: i64) -> u64 {
    if d >= 0 {
        a.saturating_add(d as u64)
    } else {
        a.saturating_sub(d.unsigned_abs())
    }
}

/// Running live bytes per site: each entry's change as (site or before-window, delta).
struct Walk<'a> {
    stacks: &'a StackIndex,
    live: FxHashMap<u64, (SiteKey, u64)>,
}

impl Walk<'_> {
    /// `Some((Some(site), delta))` for a block of the window, `Some((None, delta))` for one
    /// allocated before it.
    fn step(&mut self, e: &TraceEntry) -> Option<(Option<SiteKey>, i64)> {
        match e.action {
            Action::Alloc => {
                let key = self.stacks.site(e.stack()).0;
                self.live.insert(e.addr, (key, e.size));
                Some((Some(key), i64::try_from(e.size).unwrap_or(i64::MAX)))
            }
            Action::FreeCompleted => {
                let (key, size) = match self.live.remove(&e.addr) {
                    Some((k, s)) => (Some(k), s),
                    None => (None, e.size),
                };
                Some((key, -i64::try_from(size).unwrap_or(i64::MAX)))
            }
            _ => None,
        }
    }
}

fn device_series(
    snap: &Snapshot,
    stacks: &StackIndex,
    device: i64,
    list: &[TraceEntry],
    live_start: u64,
) -> Series {
    let n = list.len();
    // Pass 1: the peak of the total.
    let mut walk = Walk {
        stacks,
        live: FxHashMap::default(),
    };
    let mut total = live_start;
    let mut peak: Option<(usize, u64)> = None;
    for (i, e) in list.iter().enumerate() {
        if let Some((_, d)) = walk.step(e) {
            total = signed_add(total, d);
            if peak.is_none_or(|(_, b)| total > b) {
                peak = Some((i, total));
            }
        }
    }
    // Pass 2: bytes per site at the peak; the largest become bands.
    let mut walk = Walk {
        stacks,
        live: FxHashMap::default(),
    };
    let mut at_peak: FxHashMap<SiteKey, u64> = FxHashMap::default();
    let mut before = live_start;
    if let Some((pi, _)) = peak {
        for e in &list[..=pi] {
            match walk.step(e) {
                Some((Some(k), d)) => {
                    let v = at_peak.entry(k).or_default();
                    *v = signed_add(*v, d);
                }
                Some((None, d)) => before = signed_add(before, d),
                None => {}
            }
        }
    }
    let mut ranked: Vec<(SiteKey, u64)> = at_peak.into_iter().filter(|(_, b)| *b > 0).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let chosen: Vec<(SiteKey, u64)> = ranked.iter().take(BANDS).copied().collect();
    let other_at_peak: u64 = ranked.iter().skip(BANDS).map(|r| r.1).sum();
    let band_of: FxHashMap<SiteKey, usize> = chosen
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (*k, i))
        .collect();
    // A representative stack per chosen site: its first allocation in the trace.
    let mut stack_of: FxHashMap<SiteKey, Option<u32>> = FxHashMap::default();
    for e in list.iter().filter(|e| e.action == Action::Alloc) {
        let k = stacks.site(e.stack()).0;
        if band_of.contains_key(&k) {
            stack_of.entry(k).or_insert(e.stack());
        }
    }
    let mut bands: Vec<Band> = chosen
        .iter()
        .map(|(k, b)| Band {
            kind: BandKind::Site,
            location: k.and_then(|f| location(snap, f)),
            stack: stack_locations(snap, stack_of.get(k).copied().flatten(), *k)
                .into_iter()
                .take(6)
                .collect(),
            bytes_at_peak: *b,
        })
        .collect();
    let other = bands.len();
    bands.push(Band {
        kind: BandKind::Other,
        location: None,
        stack: Stack::default(),
        bytes_at_peak: other_at_peak,
    });
    let before_band = bands.len();
    bands.push(Band {
        kind: BandKind::BeforeWindow,
        location: None,
        stack: Stack::default(),
        bytes_at_peak: before,
    });

    // Reserved at the first entry: the dump's reserved bytes minus the trace's net segment
    // traffic.
    let reserved_end: u64 = snap
        .segments_of(device)
        .fold(0u64, |a, s| a.saturating_add(s.total_size));
    let net: i64 = list
        .iter()
        .map(|e| match e.action {
            Action::SegmentAlloc | Action::SegmentMap => i64::try_from(e.size).unwrap_or(0),
            Action::SegmentFree | Action::SegmentUnmap => -i64::try_from(e.size).unwrap_or(0),
            _ => 0,
        })
        .fold(0i64, i64::saturating_add);
    let mut reserved = signed_add(reserved_end, net.saturating_neg());

    // Pass 3: the columns.
    let cols = n.clamp(1, COLUMNS);
    let mut walk = Walk {
        stacks,
        live: FxHashMap::default(),
    };
    let mut values = vec![0u64; bands.len()];
    values[before_band] = live_start;
    let mut total = live_start;
    let mut columns: Vec<Column> = Vec::with_capacity(cols);
    let mut ooms = Vec::new();
    for c in 0..cols {
        let (lo, hi) = (c * n / cols, ((c + 1) * n / cols).max(c * n / cols + 1));
        let mut col = Column {
            first: lo as u64,
            last: (hi - 1) as u64,
            at: lo as u64,
            values: values.clone(),
            total_min: total,
            total_max: total,
            reserved,
            time_us: None,
        };
        for (i, e) in list.iter().enumerate().take(hi.min(n)).skip(lo) {
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    reserved = reserved.saturating_add(e.size)
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    reserved = reserved.saturating_sub(e.size)
                }
                Action::Oom => ooms.push(OomMark {
                    index: i as u64,
                    size: e.size,
                    capacity: e.device_free().map(|f| reserved.saturating_add(f)),
                }),
                _ => {}
            }
            col.reserved = col.reserved.max(reserved);
            if let Some((key, d)) = walk.step(e) {
                let b = match key {
                    Some(k) => band_of.get(&k).copied().unwrap_or(other),
                    None => before_band,
                };
                values[b] = signed_add(values[b], d);
                total = signed_add(total, d);
                if i == lo {
                    // The column starts after its first entry: what it held before belongs to
                    // the previous column.
                    col.total_min = total;
                    col.total_max = total;
                }
                col.total_min = col.total_min.min(total);
                if total > col.total_max || i == lo {
                    col.total_max = total;
                    col.at = i as u64;
                    col.values.clone_from(&values);
                    col.time_us = e.time_us();
                }
            }
        }
        columns.push(col);
    }
    Series {
        device,
        entries: n as u64,
        bands,
        columns,
        peak: peak.map(|(i, b)| (i as u64, b)),
        ooms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch::model::{Block, TraceEntry};

    const MB: u64 = 1 << 20;

    fn seg(addr: u64, blocks: &[(u64, BlockState)]) -> Segment {
        let mut at = addr;
        Segment {
            device: 0,
            address: addr,
            total_size: blocks.iter().map(|b| b.0).sum(),
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: Some("large".into()),
            is_expandable: false,
            pool_id: None,
            stack: None,
            blocks: blocks
                .iter()
                .map(|(size, state)| {
                    let b = Block {
                        address: at,
                        size: *size,
                        requested_size: *size,
                        state: state.clone(),
                        stack: None,
                        history_len: 0,
                    };
                    at += size;
                    b
                })
                .collect(),
        }
    }

    #[test]
    fn state_panels_show_the_peak_and_the_oom_with_the_largest_free_block_of_the_pool() {
        use BlockState::*;
        const S: u64 = 0x7f00_0000_0000;
        let e = |a: Action, addr: u64, size: u64| TraceEntry::new(a, addr, size, 0);
        // A 20 MiB segment filled by four 5 MiB tensors, two of them freed, then a 10 MiB
        // request fails with 4 MiB left on the device.
        let mut t = vec![e(Action::SegmentAlloc, S, 20 * MB)];
        for k in 0..4 {
            t.push(e(Action::Alloc, S + k * 5 * MB, 5 * MB));
        }
        for k in [0, 2] {
            t.push(e(Action::FreeRequested, S + k * 5 * MB, 5 * MB));
            t.push(e(Action::FreeCompleted, S + k * 5 * MB, 5 * MB));
        }
        t.push(e(Action::Oom, 0, 10 * MB).with_device_free(Some(4 * MB)));
        let half = [
            (5 * MB, Inactive),
            (5 * MB, ActiveAllocated),
            (5 * MB, Inactive),
            (5 * MB, ActiveAllocated),
        ];
        let snap = Snapshot {
            segments: vec![seg(S, &half)],
            device_traces: Some(vec![t]),
            ..Snapshot::default()
        };
        let series = Series {
            device: 0,
            entries: 10,
            bands: Vec::new(),
            columns: Vec::new(),
            peak: Some((4, 20 * MB)),
            ooms: Vec::new(),
        };
        let replays = replay::Replays::new();
        let p = state_panels(&snap, &replays, std::slice::from_ref(&series), &[0], 400);
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!((p[0].moment, p[0].entry), (Moment::Peak, 4));
        assert_eq!((p[0].reserved_bytes, p[0].active_bytes), (20 * MB, 20 * MB));
        assert_eq!(p[0].segments[0].blocks, vec![(20 * MB, "allocated")]);
        assert_eq!((p[1].moment, p[1].entry), (Moment::Oom, 9));
        assert_eq!(p[1].active_bytes, 10 * MB);
        assert_eq!(
            p[1].request,
            Some(FailedRequest {
                bytes: 10 * MB,
                pool: "large",
                stream: 0,
                largest_free_bytes: 5 * MB,
                pool_free_bytes: 10 * MB,
                device_free: Some(4 * MB),
            })
        );
        // Only devices whose replay validated get a state.
        assert!(state_panels(&snap, &replay::Replays::new(), &[series], &[], 400).is_empty());
    }

    #[test]
    fn segment_bars_stay_small_whatever_the_blocks() {
        // 400 segments of 1,000 alternating blocks: merged down to a few thousand entries, the
        // bytes kept.
        let blocks: Vec<(u64, BlockState)> = (0..1000)
            .map(|i| {
                let st = if i % 2 == 0 {
                    BlockState::ActiveAllocated
                } else {
                    BlockState::Inactive
                };
                (MB, st)
            })
            .collect();
        let segs: Vec<Segment> = (0..400u64).map(|i| seg(i << 40, &blocks)).collect();
        let bars = segment_bars(segs.iter().collect(), 400);
        let entries: usize = bars.iter().map(|b| b.blocks.len()).sum();
        assert!(entries <= 2 * MAX_BLOCK_ENTRIES, "{entries} entries");
        assert!(
            bars.iter()
                .all(|b| b.blocks.iter().map(|x| x.0).sum::<u64>() == 1000 * MB)
        );
        // Fewer blocks, each above 1/500 of the largest segment: each one drawn.
        let segs: Vec<Segment> = (0..2u64).map(|i| seg(i << 40, &blocks[..400])).collect();
        let few = segment_bars(segs.iter().collect(), 400);
        assert_eq!(few.iter().map(|b| b.blocks.len()).sum::<usize>(), 2 * 400);
    }
}
