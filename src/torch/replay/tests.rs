//! Rules of the allocator on small hand-made traces.

use super::model::{Device, Malloc, Model, SegKind};
use super::run::Capacity;
use super::*;
use crate::torch::model::Action::{
    Alloc, FreeCompleted, FreeRequested, Oom, SegmentAlloc, SegmentFree, SegmentMap, SegmentUnmap,
};
use crate::torch::model::{Action, Block, BlockState, Segment, Snapshot, TraceEntry};

const MB: u64 = 1 << 20;

/// A device that always grants, at model-chosen addresses.
struct Grant;
impl Device for Grant {
    fn grant(&mut self, _: u64, _: u64, _: u8, _: u64) -> bool {
        true
    }
    fn segment_address(&mut self, _: u64, _: bool) -> Option<u64> {
        None
    }
}

fn alloc(m: &mut Model, size: u64) -> (u64, u64) {
    match m.malloc(size, 0, &mut Grant) {
        Malloc::Ok { addr, block } => (addr, block),
        Malloc::Oom => panic!("unexpected OOM"),
    }
}

fn free(m: &mut Model, addr: u64) {
    assert!(m.free_requested(addr));
    assert!(m.free_completed(addr));
}

fn kinds(m: &Model) -> Vec<(SegKind, u64)> {
    m.events.iter().map(|e| (e.kind, e.size)).collect()
}

#[test]
fn segment_sizes_small_2mib_large_20mib_then_rounded_to_2mib() {
    for (req, seg) in [
        (1000, 2 * MB),
        (MB, 2 * MB),
        (MB + 1, 20 * MB),
        (10 * MB - 512, 20 * MB),
        (10 * MB, 10 * MB),
        (12 * MB + 1, 14 * MB),
    ] {
        let mut m = Model::new(Settings::default());
        alloc(&mut m, req);
        assert_eq!(
            kinds(&m),
            vec![(SegKind::SegmentAlloc, seg)],
            "request {req}"
        );
        assert_eq!(m.reserved, seg);
    }
}

#[test]
fn small_pool_splits_down_to_512_bytes() {
    let mut m = Model::new(Settings::default());
    let (a, b) = alloc(&mut m, MB);
    assert_eq!(b, MB);
    let (a2, b2) = alloc(&mut m, MB - 512);
    assert_eq!(
        (a2, b2),
        (a + MB, MB - 512),
        "1 MiB left: split, 512 B stay free"
    );
    let (a3, b3) = alloc(&mut m, 1);
    assert_eq!((a3, b3), (a + 2 * MB - 512, 512));
    assert_eq!(m.events.len(), 1, "all in one 2 MiB segment");
}

#[test]
fn large_pool_keeps_remainders_of_1mib_or_less() {
    let mut m = Model::new(Settings::default());
    let (_, b) = alloc(&mut m, 19 * MB);
    assert_eq!(
        b,
        20 * MB,
        "1 MiB left in the 20 MiB segment is not split off"
    );
    let (a, b) = alloc(&mut m, 5 * MB);
    assert_eq!(b, 5 * MB, "15 MiB left: split");
    let (a2, b2) = alloc(&mut m, 14 * MB);
    assert_eq!(
        (a2, b2),
        (a + 5 * MB, 15 * MB),
        "best fit takes the 15 MiB rest whole"
    );
    assert_eq!(m.allocated, 40 * MB);
}

#[test]
fn best_fit_prefers_smaller_block_then_lower_address() {
    let mut m = Model::new(Settings::default());
    let (a, _) = alloc(&mut m, 5 * MB); // segment 1: 5 + 15 free
    let (b, _) = alloc(&mut m, 15 * MB); // takes the 15 MiB rest
    let (c, _) = alloc(&mut m, 8 * MB); // segment 2: 8 + 12 free
    free(&mut m, a); // 5 MiB free at a
    free(&mut m, c); // segment 2 whole free (20 MiB)
    let (d, _) = alloc(&mut m, 4 * MB);
    assert_eq!(d, a, "the 5 MiB block fits best");
    let _ = b;
}

#[test]
fn pending_free_is_not_reused_until_free_completed() {
    let mut m = Model::new(Settings::default());
    let (a, _) = alloc(&mut m, 3 * MB);
    let (rest, _) = alloc(&mut m, 17 * MB);
    assert!(m.free_requested(a));
    let (b, _) = alloc(&mut m, 3 * MB);
    assert_ne!(b, a, "awaiting free_completed");
    assert_eq!(m.events.len(), 2);
    assert!(m.free_completed(a));
    let (c, _) = alloc(&mut m, 3 * MB);
    assert_eq!(c, a);
    let _ = rest;
}

#[test]
fn freed_neighbours_merge_and_empty_cache_releases_whole_segments() {
    let mut m = Model::new(Settings::default());
    let (a, _) = alloc(&mut m, 5 * MB);
    let (b, _) = alloc(&mut m, 5 * MB);
    let (c, _) = alloc(&mut m, 10 * MB);
    let (d, _) = alloc(&mut m, 5 * MB); // second segment
    free(&mut m, b);
    m.release_cached_blocks();
    assert_eq!(m.events.len(), 2, "a split segment is not released");
    free(&mut m, a);
    free(&mut m, c);
    let (e, blk) = alloc(&mut m, 19 * MB);
    assert_eq!(
        (e, blk),
        (a, 20 * MB),
        "a, b, c merged back into one 20 MiB block"
    );
    free(&mut m, e);
    free(&mut m, d);
    m.release_cached_blocks();
    assert_eq!(
        kinds(&m)[2..],
        [
            (SegKind::SegmentFree, 20 * MB),
            (SegKind::SegmentFree, 20 * MB)
        ]
    );
    assert_eq!(m.reserved, 0);
}

#[test]
fn oom_path_releases_cached_segments_then_fails() {
    let mut m = Model::new(Settings::default());
    let mut dev = Capacity(Some(40 * MB));
    let Malloc::Ok { addr: a, .. } = m.malloc(5 * MB, 0, &mut dev) else {
        panic!()
    };
    free(&mut m, a);
    // 20 MiB cached + 30 MiB new > 40 MiB: the cached segment goes, then it fits.
    let Malloc::Ok { .. } = m.malloc(30 * MB, 0, &mut dev) else {
        panic!()
    };
    assert_eq!(
        kinds(&m),
        vec![
            (SegKind::SegmentAlloc, 20 * MB),
            (SegKind::SegmentFree, 20 * MB),
            (SegKind::SegmentAlloc, 30 * MB)
        ]
    );
    assert_eq!(m.malloc(30 * MB, 0, &mut dev), Malloc::Oom);
    assert_eq!(m.reserved, 30 * MB);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let mut s = Settings::default();
    assert!(s.apply("max_split_size_mb", "64"));
    let mut m = Model::new(s);
    let (a, _) = alloc(&mut m, 100 * MB);
    free(&mut m, a);
    let (b, _) = alloc(&mut m, 30 * MB);
    assert_ne!(b, a, "a small request never takes an oversize block");
    free(&mut m, b);
    let (c, blk) = alloc(&mut m, 90 * MB);
    assert_eq!(
        (c, blk),
        (a, 100 * MB),
        "within 20 MiB: handed out whole, unsplit"
    );
    free(&mut m, c);
    let (d, _) = alloc(&mut m, 70 * MB);
    assert_ne!(d, a, "100 MiB is 20 MiB or more above 70 MiB");
}

#[test]
fn expandable_segments_map_pages_and_unmap_free_ones() {
    let mut s = Settings::default();
    assert!(s.apply("expandable_segments", "True"));
    let mut m = Model::new(s);
    let (a, _) = alloc(&mut m, 5 * MB);
    let (b, blk) = alloc(&mut m, 30 * MB);
    assert_eq!((b, blk), (a + 5 * MB, 30 * MB), "grows the same segment");
    assert_eq!(
        kinds(&m),
        vec![
            (SegKind::SegmentMap, 20 * MB),
            (SegKind::SegmentMap, 20 * MB)
        ]
    );
    assert_eq!(m.events[1].addr, a + 20 * MB);
    let (c, _) = alloc(&mut m, 1000);
    assert_ne!(
        m.events.last().map(|e| e.size),
        Some(20 * MB),
        "{c:#x}: small pool, 2 MiB pages"
    );
    free(&mut m, b);
    free(&mut m, a);
    m.release_cached_blocks();
    let unmaps: Vec<_> = m
        .events
        .iter()
        .filter(|e| e.kind == SegKind::SegmentUnmap)
        .collect();
    assert_eq!(unmaps.len(), 1);
    assert_eq!((unmaps[0].addr, unmaps[0].size), (a, 40 * MB));
    assert_eq!(m.reserved, 2 * MB, "the small page holding c stays");
}

// ---- whole replays of hand-made snapshots ----

fn seg(addr: u64, size: u64, blocks: &[(u64, BlockState)]) -> Segment {
    let mut at = addr;
    let blocks = blocks
        .iter()
        .map(|(s, st)| {
            let b = Block {
                address: at,
                size: *s,
                requested_size: *s,
                state: st.clone(),
                stack: None,
                history_len: 0,
            };
            at = at.saturating_add(*s);
            b
        })
        .collect();
    Segment {
        device: 0,
        address: addr,
        total_size: size,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: Some(if size == 2 * MB { "small" } else { "large" }.into()),
        is_expandable: false,
        pool_id: Some((0, 0)),
        stack: None,
        blocks,
    }
}

fn e(action: Action, addr: u64, size: u64) -> TraceEntry {
    TraceEntry::new(action, addr, size, 0)
}

const S1: u64 = 0x7f00_0000_0000;
const S2: u64 = 0x7f00_1000_0000;

/// Two 20 MiB segments, four 5 MiB tensors each, every other one freed, then a 20 MiB request
/// fails with 10 MiB free on the device.
fn fragmented() -> Snapshot {
    use BlockState::*;
    let mut t = vec![e(SegmentAlloc, S1, 20 * MB)];
    for k in 0..4 {
        t.push(e(Alloc, S1 + k * 5 * MB, 5 * MB));
    }
    t.push(e(SegmentAlloc, S2, 20 * MB));
    for k in 0..4 {
        t.push(e(Alloc, S2 + k * 5 * MB, 5 * MB));
    }
    for a in [S1, S1 + 10 * MB, S2, S2 + 10 * MB] {
        t.push(e(FreeRequested, a, 5 * MB));
        t.push(e(FreeCompleted, a, 5 * MB));
    }
    t.push(e(Oom, 0, 20 * MB).with_device_free(Some(10 * MB)));
    let blocks = [
        (5 * MB, Inactive),
        (5 * MB, ActiveAllocated),
        (5 * MB, Inactive),
        (5 * MB, ActiveAllocated),
    ];
    Snapshot {
        segments: vec![seg(S1, 20 * MB, &blocks), seg(S2, 20 * MB, &blocks)],
        device_traces: Some(vec![t]),
        ..Snapshot::default()
    }
}

#[test]
fn hand_made_trace_validates_and_what_if_reports_the_oom() {
    let snap = fragmented();
    let r = replay_snapshot(&snap);
    assert!(r.validated, "{r:?}");
    assert_eq!(
        (r.segment_events_recorded, r.segment_events_matched),
        (2, 2)
    );
    let d = &r.devices[0];
    assert_eq!((d.allocations, d.allocation_addresses_matched), (8, 8));
    assert!(d.live_blocks_end_matched);

    // Freeing the two tensors of S1 before the OOM frees a whole segment: the request fits.
    let w = what_if(
        &snap,
        0,
        &[Change::FreeEarly {
            allocs: vec![2, 4],
            at: 18,
        }],
    );
    assert!(w.simulated, "{w:?}");
    assert_eq!(w.capacity_bytes, Some(50 * MB));
    assert_eq!(w.ooms.len(), 1);
    assert!(w.ooms[0].fits_after);
    assert_eq!(w.ooms[0].capacity_bytes, Some(50 * MB));
    assert_eq!(w.peak_reserved_before, 40 * MB);
    assert_eq!(w.peak_allocated_before, 40 * MB);
    assert_eq!(
        w.peak_allocated_after,
        40 * MB,
        "peak came before the early free"
    );

    // Never making them lowers the peak.
    let w = what_if(
        &snap,
        0,
        &[Change::FreeEarly {
            allocs: vec![2, 4],
            at: 0,
        }],
    );
    assert_eq!(w.peak_allocated_after, 30 * MB);
    assert_eq!(
        w.peak_reserved_after,
        40 * MB,
        "later tensors fill the room instead"
    );

    // Unchanged: still fails.
    let w = what_if(&snap, 0, &[]);
    assert!(!w.ooms[0].fits_after);
    assert_eq!(w.peak_reserved_after, w.peak_reserved_before);

    let a = advise_settings_for_oom(&snap, 0);
    assert!(a.simulated);
    assert_eq!(a.trials.len(), 1 + MAX_SPLIT_TRIALS_MB.len());
    assert_eq!(a.expandable_segments_avoids, Some(false), "{a:?}");
    assert_eq!(a.smallest_max_split_size_mb, None);
}

/// Activation checkpointing: tensors dropped after their forward use and made again just before
/// their backward use are never all live together.
#[test]
fn rematerialised_allocations_lower_the_peak_and_come_back_for_their_use() {
    use BlockState::*;
    // "Forward": four 5 MiB activations; "backward": freed in reverse order.
    let mut t = vec![e(SegmentAlloc, S1, 20 * MB)];
    for k in 0..4 {
        t.push(e(Alloc, S1 + k * 5 * MB, 5 * MB));
    }
    for k in (0..4).rev() {
        t.push(e(FreeRequested, S1 + k * 5 * MB, 5 * MB));
        t.push(e(FreeCompleted, S1 + k * 5 * MB, 5 * MB));
    }
    let snap = Snapshot {
        segments: vec![seg(S1, 20 * MB, &[(20 * MB, Inactive)])],
        device_traces: Some(vec![t]),
        ..Snapshot::default()
    };
    assert!(replay_snapshot(&snap).validated);
    // The first three activations (alloc entries 1, 2, 3) are dropped as the next one is made
    // and made again just before their free_requested (entries 11, 9, 7): one at a time.
    let w = what_if(
        &snap,
        0,
        &[Change::Rematerialize {
            allocs: vec![(1, 2, 11), (2, 3, 9), (3, 4, 7)],
        }],
    );
    assert!(w.simulated, "{w:?}");
    assert_eq!(w.peak_allocated_before, 20 * MB);
    assert_eq!(w.peak_allocated_after, 5 * MB, "{w:?}");
    assert_eq!(w.new_ooms, 0);
}

#[test]
fn what_if_is_not_offered_when_the_replay_does_not_validate() {
    let mut snap = fragmented();
    // The recorded state now holds a segment the trace never explains.
    snap.segments.push(seg(
        S2 + 0x1000_0000,
        2 * MB,
        &[(2 * MB, BlockState::Inactive)],
    ));
    if let Some(t) = snap.device_traces.as_mut() {
        t[0].insert(1, e(Action::SegmentAlloc, S2 + 0x1000_0000, 2 * MB));
    }
    let r = replay_device(&snap, 0);
    assert!(!r.validated);
    assert!(
        r.note.as_deref().unwrap_or("").contains("first difference"),
        "{r:?}"
    );
    let w = what_if(&snap, 0, &[Change::ExpandableSegments(true)]);
    assert!(!w.simulated);
    assert!(w.note.as_deref().unwrap_or("").starts_with("not simulated"));
    assert_eq!(w.peak_reserved_after, 0);
}

/// `fragmented()` on a device large enough: the 20 MiB request gets a third segment.
fn served() -> Snapshot {
    use BlockState::*;
    let mut snap = fragmented();
    let t = &mut snap.device_traces.as_mut().expect("a trace")[0];
    t.pop();
    let s3 = S2 + 0x1000_0000;
    t.push(e(SegmentAlloc, s3, 20 * MB));
    t.push(e(Alloc, s3, 20 * MB));
    snap.segments
        .push(seg(s3, 20 * MB, &[(20 * MB, ActiveAllocated)]));
    snap
}

#[test]
fn state_at_capacity_stops_at_the_first_request_the_device_cannot_serve() {
    let snap = served();
    assert!(replay_device(&snap, 0).validated);
    assert_eq!(
        state_at_capacity(&snap, 0, 60 * MB),
        None,
        "everything fits"
    );

    // 50 MiB: two segments of 20 MiB, half of each cached in 5 MiB pieces, 10 MiB left on the
    // device: the 20 MiB request fails.
    let s = state_at_capacity(&snap, 0, 50 * MB).expect("an OOM");
    let t = &s.device_traces.as_ref().expect("a trace")[0];
    assert_eq!(
        t.len(),
        19,
        "the recorded trace up to the request, then its oom"
    );
    let oom = t.last().expect("an entry");
    assert_eq!((oom.action, oom.size), (Action::Oom, 20 * MB));
    assert_eq!(oom.device_free(), Some(10 * MB));
    let segs: Vec<(u64, Vec<(u64, BlockState)>)> = s
        .segments
        .iter()
        .map(|g| {
            (
                g.total_size,
                g.blocks.iter().map(|b| (b.size, b.state.clone())).collect(),
            )
        })
        .collect();
    let half = vec![
        (5 * MB, BlockState::Inactive),
        (5 * MB, BlockState::ActiveAllocated),
        (5 * MB, BlockState::Inactive),
        (5 * MB, BlockState::ActiveAllocated),
    ];
    assert_eq!(segs, vec![(20 * MB, half.clone()), (20 * MB, half)]);
    // The trace names the model's addresses: replayed back from these segments it explains
    // itself, and the replay of the new snapshot validates.
    let r = replay_device(&s, 0);
    assert!(r.validated && r.live_blocks_end_matched, "{r:?}");
    let a = crate::torch::analyse(&s, &crate::options::AnalysisOptions::default());
    let d = &a.fragmentation[0];
    assert_eq!(
        (d.verdict, d.request, d.largest_inactive, d.inactive),
        (
            crate::torch::fragmentation::Verdict::Fragmentation,
            20 * MB,
            5 * MB,
            20 * MB
        )
    );

    // A replay that does not validate is no model of this device.
    let mut odd = snap.clone();
    odd.segments[0].pool_id = Some((1, 7));
    assert_eq!(state_at_capacity(&odd, 0, 50 * MB), None);
    // A device of no bytes fails at the first request, with nothing reserved.
    let s = state_at_capacity(&snap, 0, 0).expect("an OOM");
    assert!(s.segments.is_empty());
    let t = &s.device_traces.as_ref().expect("a trace")[0];
    assert_eq!(
        t.iter()
            .map(|e| (e.action, e.size, e.device_free()))
            .collect::<Vec<_>>(),
        vec![(Action::Oom, 5 * MB, Some(0))]
    );
}

#[test]
fn pre_trace_blocks_and_empty_cache_are_rebuilt() {
    use BlockState::*;
    // Before the trace: S1 held a 3 MiB tensor at S1 and one at S1+3 MiB whose request (2 MiB)
    // left 1 MiB unsplit; both are freed in the trace, then empty_cache() releases S1.
    let t = vec![
        e(Alloc, S2, 512),
        e(Alloc, S1 + 6 * MB, 4 * MB),
        e(FreeRequested, S1 + 3 * MB, 2 * MB),
        e(FreeCompleted, S1 + 3 * MB, 2 * MB),
        e(FreeRequested, S1, 3 * MB),
        e(FreeCompleted, S1, 3 * MB),
        e(FreeRequested, S1 + 6 * MB, 4 * MB),
        e(FreeCompleted, S1 + 6 * MB, 4 * MB),
        e(SegmentFree, S1, 20 * MB),
    ];
    let snap = Snapshot {
        segments: vec![seg(
            S2,
            2 * MB,
            &[(512, ActiveAllocated), (2 * MB - 512, Inactive)],
        )],
        device_traces: Some(vec![t]),
        ..Snapshot::default()
    };
    let r = replay_device(&snap, 0);
    assert!(r.validated, "{r:?}");
    assert_eq!(r.allocation_addresses_matched, 2);
    assert_eq!(r.peak_reserved_bytes, 20 * MB + 2 * MB);
}

#[test]
fn hostile_sizes_never_panic() {
    let t = vec![
        e(Alloc, u64::MAX, u64::MAX),
        e(FreeRequested, 0, u64::MAX),
        e(FreeCompleted, 1, 0),
        e(SegmentAlloc, u64::MAX - 5, u64::MAX),
        e(SegmentFree, u64::MAX, u64::MAX),
        e(SegmentMap, u64::MAX - 1, u64::MAX),
        e(SegmentUnmap, 0, u64::MAX),
        e(Oom, 0, u64::MAX).with_device_free(Some(u64::MAX)),
        e(Alloc, 0, 0),
    ];
    let mut s = seg(
        u64::MAX - 10,
        u64::MAX,
        &[(u64::MAX, BlockState::ActiveAllocated)],
    );
    s.is_expandable = true;
    let snap = Snapshot {
        segments: vec![s, seg(0, u64::MAX, &[(7, BlockState::Other("x".into()))])],
        device_traces: Some(vec![t]),
        ..Snapshot::default()
    };
    let r = replay_snapshot(&snap);
    assert!(!r.validated);
    let _ = what_if(
        &snap,
        0,
        &[
            Change::MaxSplitSizeMb(u64::MAX),
            Change::ExpandableSegments(true),
        ],
    );
    let _ = advise_settings_for_oom(&snap, 0);
    let _ = replay_device(&snap, -1);
    let _ = replay_device(&snap, 7);
    for cap in [0, 1, u64::MAX] {
        for d in [-1, 0, 7] {
            let _ = state_at_capacity(&snap, d, cap);
        }
    }
    let mut m = Model::new(Settings::default());
    assert!(matches!(
        m.malloc(u64::MAX, 0, &mut Grant),
        Malloc::Ok { .. }
    ));
    assert!(matches!(
        m.malloc(u64::MAX, u64::MAX, &mut Grant),
        Malloc::Ok { .. }
    ));
}

#[test]
fn captures_without_trace_say_why() {
    let r = replay_snapshot(&Snapshot::default());
    assert!(!r.validated);
    assert!(r.note.as_deref().unwrap_or("").contains("no trace"));
    let r = replay_snapshot(&Snapshot {
        device_traces: Some(vec![vec![], vec![]]),
        ..Snapshot::default()
    });
    assert!(!r.validated);
    assert!(r.devices.is_empty());
}

/// A segment as the tests compare them: address, size, blocks (address, size, state).
type Shape = (u64, u64, Vec<(u64, u64, BlockState)>);

fn shapes(segs: &[Segment]) -> Vec<Shape> {
    let mut v: Vec<Shape> = segs
        .iter()
        .map(|s| {
            (
                s.address,
                s.total_size,
                s.blocks
                    .iter()
                    .map(|b| (b.address, b.size, b.state.clone()))
                    .collect(),
            )
        })
        .collect();
    v.sort_by_key(|s| s.0);
    v
}

#[test]
fn recorded_states_are_the_recorded_allocator_after_any_entry() {
    use BlockState::*;
    // `fragmented()` with a 10 MiB segment cached on another stream, which the failing
    // request's OOM path releases.
    let mut snap = fragmented();
    let s3 = S2 + 0x1000_0000;
    let t = &mut snap.device_traces.as_mut().expect("a trace")[0];
    let oom = t.len() - 1;
    t.insert(oom, TraceEntry::new(SegmentFree, s3, 10 * MB, 1));
    let oom = oom + 1;
    let r = replay_device(&snap, 0);
    assert!(r.validated, "{r:?}");

    let states = recorded_states(
        &snap,
        0,
        &[
            At::After(oom),
            At::After(4),
            At::BeforeRequest(oom),
            At::After(oom - 1),
            At::BeforeRequest(4),
        ],
    )
    .expect("the replay validates");
    // After the last entry: the snapshot's own segments.
    assert_eq!(shapes(&states[0]), shapes(&snap.segments));
    let five = |a: u64, st: BlockState| (a, 5 * MB, st);
    let cached = (s3, 10 * MB, vec![(s3, 10 * MB, Inactive)]);
    // After entry 4: S1 holds four tensors; S3 was cached from before the trace.
    assert_eq!(
        shapes(&states[1]),
        vec![
            (
                S1,
                20 * MB,
                (0..4)
                    .map(|k| five(S1 + k * 5 * MB, ActiveAllocated))
                    .collect()
            ),
            cached.clone()
        ]
    );
    // Just before the failing request, S3 is still cached (its OOM path releases it); after
    // entry oom − 1 (the release) it is gone.
    let mut before = shapes(&snap.segments);
    before.push(cached);
    assert_eq!(shapes(&states[2]), before);
    assert_eq!(shapes(&states[3]), shapes(&snap.segments));
    // Before the fourth alloc: three tensors and the free rest of S1.
    assert_eq!(shapes(&states[4])[0].2.len(), 4);
    assert_eq!(shapes(&states[4])[0].2[3], five(S1 + 15 * MB, Inactive));
    // Requested sizes come from the trace.
    assert!(
        states[1][0]
            .blocks
            .iter()
            .all(|b| b.requested_size == 5 * MB)
    );
    assert_eq!(
        state_after(&snap, 0, oom).map(|s| shapes(&s)),
        Some(shapes(&snap.segments))
    );

    // No state where the replay does not validate.
    let mut odd = snap.clone();
    odd.segments[0].pool_id = Some((1, 7));
    assert_eq!(recorded_states(&odd, 0, &[At::After(4)]), None);
}

/// A device of a capacity that proposes addresses for new segments.
struct Suggest {
    cap: Option<u64>,
    addrs: [u64; 3],
    k: usize,
}

impl Device for Suggest {
    fn grant(&mut self, reserved: u64, bytes: u64, attempt: u8, released: u64) -> bool {
        Capacity(self.cap).grant(reserved, bytes, attempt, released)
    }
    fn segment_address(&mut self, _: u64, _: bool) -> Option<u64> {
        let a = self.addrs.get(self.k).copied().filter(|&a| a != 0);
        self.k += 1;
        a
    }
}

/// The model answers neighbour and address questions from hash maps (blocks tile disjoint
/// segments); kept ordered, it answers them as an ordered map of blocks does. Both must make
/// the same allocator, request for request, over random requests on every setting, with OOM
/// paths (a capacity), pending frees, cache releases and a carved initial state.
#[test]
fn linked_blocks_answer_as_ordered_blocks_do() {
    let mut rng = crate::test_rng::XorShift::new(0x9e37_79b9_7f4a_7c15);
    let mut rnd = move |n: u64| rng.below(n);
    let settings = [
        vec![],
        vec![("max_split_size_mb", "64")],
        vec![("expandable_segments", "True")],
        vec![("roundup_power2_divisions", "4")],
        vec![("expandable_segments", "True"), ("max_split_size_mb", "40")],
    ];
    for (case, conf) in settings.iter().cycle().take(40).enumerate() {
        let mut s = Settings::default();
        for (k, v) in conf {
            assert!(s.apply(k, v));
        }
        let mut fast = Model::new(s.clone());
        let mut exact = Model::new(s);
        exact.keep_ordered();
        // An initial state: a few segments with blocks carved out of them.
        let base = 0x7f00_0000_0000u64 + (case as u64) * (1 << 36);
        for m in [&mut fast, &mut exact] {
            for k in 0..4u64 {
                let a = base + k * (64 * MB);
                m.add_segment(a, 20 * MB * (k + 1), k % 2, false);
                assert!(m.init_alloc(a + 2 * MB, 3 * MB, k == 3));
            }
            m.add_segment(base + 0x4000_0000, 2 * MB, 0, true);
            m.finish_init();
        }
        let cap = Some(400 * MB + rnd(400) * MB);
        // (address, the fast model's slot hint); frees of the fast model go through the hints,
        // sometimes wrong ones (a slot since reused or vacated, a freed block freed again).
        let mut live: Vec<(u64, u32)> = Vec::new();
        let mut pending: Vec<(u64, u32)> = Vec::new();
        let mut gone: Vec<(u64, u32)> = Vec::new();
        for step in 0..600 {
            let what = rnd(100);
            if what < 50 || live.is_empty() {
                let size = match rnd(4) {
                    0 => 1 + rnd(MB),
                    1 => MB + rnd(9 * MB),
                    2 => 10 * MB + rnd(40 * MB),
                    _ => 512 * (1 + rnd(64)),
                };
                let stream = rnd(3);
                // Addresses the device proposes for new segments (as the recorded run does):
                // often next to or inside what the model holds, so it must check for overlap.
                let near = base + rnd(80) * 2 * MB;
                let addrs = [near, near + 20 * MB, 0];
                let a = fast.malloc(size, stream, &mut Suggest { cap, addrs, k: 0 });
                let b = exact.malloc(size, stream, &mut Suggest { cap, addrs, k: 0 });
                assert_eq!(a, b, "case {case} step {step}: malloc {size} on {stream}");
                if let Malloc::Ok { addr, .. } = a {
                    live.push((addr, fast.handed));
                }
            } else if what < 80 {
                let (addr, h) = live.swap_remove(rnd(live.len() as u64) as usize);
                let h = if rnd(8) == 0 { rnd(64) as u32 } else { h };
                assert_eq!(fast.free_requested_at(addr, h), exact.free_requested(addr));
                if rnd(3) == 0 {
                    pending.push((addr, h));
                } else {
                    let h = if rnd(8) == 0 { rnd(64) as u32 } else { h };
                    assert_eq!(fast.free_completed_at(addr, h), exact.free_completed(addr));
                    gone.push((addr, h));
                }
            } else if what < 95 && !pending.is_empty() {
                let (addr, h) = pending.swap_remove(rnd(pending.len() as u64) as usize);
                let h = if rnd(8) == 0 { rnd(64) as u32 } else { h };
                assert_eq!(fast.free_completed_at(addr, h), exact.free_completed(addr));
                gone.push((addr, h));
            } else if what < 97 && !gone.is_empty() {
                let (addr, h) = gone[rnd(gone.len() as u64) as usize];
                assert_eq!(fast.free_requested_at(addr, h), exact.free_requested(addr));
                assert_eq!(fast.free_completed_at(addr, h), exact.free_completed(addr));
            } else {
                fast.release_cached_blocks();
                exact.release_cached_blocks();
            }
            assert_eq!(fast.events, exact.events, "case {case} step {step}");
            assert_eq!(
                (
                    fast.reserved,
                    fast.allocated,
                    fast.peak_reserved,
                    fast.peak_allocated
                ),
                (
                    exact.reserved,
                    exact.allocated,
                    exact.peak_reserved,
                    exact.peak_allocated
                ),
                "case {case} step {step}"
            );
            let shape = |m: &Model| -> Vec<(u64, u64, u32, bool)> {
                m.blocks
                    .sorted()
                    .iter()
                    .map(|(a, b)| (*a, b.size, b.seg, b.state == model::St::Free))
                    .collect()
            };
            assert_eq!(shape(&fast), shape(&exact), "case {case} step {step}");
        }
        assert!(
            fast.events.len() > 3,
            "case {case}: the requests reach the device"
        );
    }
}

/// A device that refused memory once with no OOM recorded: a 60 MiB segment is cached when an
/// 80 MiB request comes, the allocator releases it and retries. The refusal says the capacity
/// is below 60 + 80 MiB, the grants that it is at least 80 MiB. `then`: trace entries after it.
fn refused_once(then: &[(u64, u64)]) -> Snapshot {
    use BlockState::*;
    let s3 = 0x7f00_2000_0000;
    let mut t = vec![
        e(SegmentAlloc, S1, 60 * MB),
        e(Alloc, S1, 60 * MB),
        e(FreeRequested, S1, 60 * MB),
        e(FreeCompleted, S1, 60 * MB),
        e(SegmentFree, S1, 60 * MB),
        e(SegmentAlloc, S2, 80 * MB),
        e(Alloc, S2, 80 * MB),
    ];
    let mut segments = vec![seg(S2, 80 * MB, &[(80 * MB, ActiveAllocated)])];
    let mut at = s3;
    for &(size, _) in then {
        t.push(e(SegmentAlloc, at, size));
        t.push(e(Alloc, at, size));
        segments.push(seg(at, size, &[(size, ActiveAllocated)]));
        at += 0x1000_0000;
    }
    Snapshot {
        segments,
        device_traces: Some(vec![t]),
        ..Snapshot::default()
    }
}

#[test]
fn a_refusal_without_an_oom_bounds_the_capacity_the_fixes_are_replayed_at() {
    let snap = refused_once(&[(40 * MB, 0)]);
    let r = replay_snapshot(&snap);
    let d = &r.devices[0];
    assert!(d.validated && d.fixes_replayed, "{r:?}");
    // Granted 80 + 40 MiB; refused 60 + 80 MiB.
    assert_eq!(d.capacity_read, Some((120 * MB, 140 * MB - 1)), "{d:?}");
    assert!(
        d.note.as_deref().unwrap_or_default().contains(
            "refused memory 1 time(s) and no OOM is recorded: by those refusals and what it \
             granted, its capacity is between 120.00 MiB and 140.00 MiB"
        ),
        "{d:?}"
    );
    // Unchanged: the recorded run, at either end.
    let w = what_if(&snap, 0, &[]);
    assert!(w.simulated, "{w:?}");
    assert_eq!(
        (w.peak_allocated_after, w.peak_reserved_after),
        (d.peak_allocated_bytes, d.peak_reserved_bytes)
    );
    assert_eq!((w.retries_before, w.retries_after), (1, 1));
    // The 60 MiB tensor never made: no refusal, and 60 MiB less at the peak.
    let w = what_if(
        &snap,
        0,
        &[Change::FreeEarly {
            allocs: vec![1],
            at: 0,
        }],
    );
    assert!(w.simulated, "{w:?}");
    assert_eq!(w.peak_allocated_after, 120 * MB);
    assert_eq!(w.new_ooms, 0);
    assert_eq!((w.retries_before, w.retries_after), (1, 0));
}

#[test]
fn a_capacity_that_changed_during_the_run_replays_no_fix() {
    // After the refusal at 140 MiB the device grants 180 MiB: something else on it let go of
    // memory (another process), so no constant capacity explains the run.
    let snap = refused_once(&[(100 * MB, 0)]);
    let r = replay_snapshot(&snap);
    let d = &r.devices[0];
    assert!(d.validated && !d.fixes_replayed, "{r:?}");
    assert_eq!(d.capacity_read, None);
    let note = d.note.as_deref().unwrap_or_default();
    assert!(
        note.starts_with(
            "fixes not replayed: the device refused memory 1 time(s) (cached segments released \
             and the request retried) and no OOM is recorded; it granted 180.00 MiB reserved but \
             refused 140.00 MiB"
        ),
        "{note}"
    );
    let w = what_if(&snap, 0, &[]);
    assert!(!w.simulated);
    assert!(
        w.note.as_deref().unwrap_or_default().contains(note),
        "{w:?}"
    );
}
