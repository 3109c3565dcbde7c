//! The replay's cost per trace entry does not grow with the trace, whatever the trace: an
//! operation count (the model's block visits and the check's compared events, see
//! `Model::visits`) on generated traces of 10 k, 100 k and 1 M entries, one that does not fit
//! its segments (as `../shared/tools/gen_inconsistent_snapshot.py` writes them) and one
//! recorded from the model itself (alloc/free churn under a capacity, OOM paths included).

use super::model::{Malloc, Model, SegKind};
use super::run::{Capacity, visits};
use super::*;
use crate::test_rng::XorShift;
use crate::torch::model::{Action, Block, BlockState, Segment, Snapshot, TraceEntry};

const MB: u64 = 1 << 20;

/// Random actions over segments that have nothing to do with them (the generator's shape):
/// frees of what was never allocated, segments from nowhere.
fn inconsistent(n: usize) -> Snapshot {
    let base = 139_800_000_000_000u64;
    let mut r = XorShift::new(0x2545_f491_4f6c_dd1d);
    let actions = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
    ];
    let sizes = [512, 4096, MB, 16 * MB];
    let trace: Vec<TraceEntry> = (0..n as u64)
        .map(|i| {
            let a = actions[(r.next_u64() % 5) as usize];
            let s = sizes[(r.next_u64() % 4) as usize];
            TraceEntry::new(a, base + i * 512, s, 0)
        })
        .collect();
    let states = [
        BlockState::ActiveAllocated,
        BlockState::Inactive,
        BlockState::ActivePendingFree,
    ];
    let segments = (0..(n / 1000).max(1) as u64)
        .map(|s| {
            let address = base + s * (64 * MB);
            Segment {
                device: 0,
                address,
                total_size: 64 * MB,
                allocated_size: 32 * MB,
                active_size: 32 * MB,
                requested_size: 32 * MB,
                stream: 0,
                segment_type: Some("large".into()),
                is_expandable: false,
                pool_id: Some((0, 0)),
                stack: None,
                blocks: (0..50u64)
                    .map(|b| Block {
                        address: address + b * 4096,
                        size: 4096,
                        requested_size: 4000,
                        state: states[(r.next_u64() % 3) as usize].clone(),
                        stack: None,
                        history_len: 0,
                    })
                    .collect(),
            }
        })
        .collect();
    Snapshot {
        segments,
        device_traces: Some(vec![trace]),
        ..Snapshot::default()
    }
}

/// A trace the model itself records: a window of 64 live tensors of 512 B … 16 MiB on a
/// 4 GiB device (new segments, OOM paths that release the cache), everything freed and the
/// cache emptied at the end (so the snapshot has no segments left).
fn consistent(n: usize) -> Snapshot {
    let mut m = Model::new(Settings::default());
    let mut dev = Capacity(Some(4 << 30));
    let mut r = XorShift::new(0x9e37_79b9_7f4a_7c15);
    let mut t: Vec<TraceEntry> = Vec::with_capacity(n);
    let mut live = std::collections::VecDeque::new();
    let record = |m: &mut Model, t: &mut Vec<TraceEntry>| {
        for e in m.events.drain(..) {
            let a = match e.kind {
                SegKind::SegmentAlloc => Action::SegmentAlloc,
                SegKind::SegmentFree => Action::SegmentFree,
                SegKind::SegmentMap => Action::SegmentMap,
                SegKind::SegmentUnmap => Action::SegmentUnmap,
            };
            t.push(TraceEntry::new(a, e.addr, e.size, 0));
        }
    };
    let free = |m: &mut Model, t: &mut Vec<TraceEntry>, a: u64, s: u64| {
        m.free_requested(a);
        m.free_completed(a);
        t.push(TraceEntry::new(Action::FreeRequested, a, s, 0));
        t.push(TraceEntry::new(Action::FreeCompleted, a, s, 0));
    };
    while t.len() + 2 * live.len() < n {
        if live.len() == 64 {
            let (a, s) = live.pop_front().unwrap_or((0, 0));
            free(&mut m, &mut t, a, s);
        }
        let size = 512u64 << (r.next_u64() % 16);
        let Malloc::Ok { addr, .. } = m.malloc(size, 0, &mut dev) else {
            panic!("64 tensors of at most 16 MiB fit 4 GiB once the cache is released");
        };
        record(&mut m, &mut t);
        t.push(TraceEntry::new(Action::Alloc, addr, size, 0));
        live.push_back((addr, size));
    }
    for (a, s) in std::mem::take(&mut live) {
        free(&mut m, &mut t, a, s);
    }
    m.release_cached_blocks();
    record(&mut m, &mut t);
    Snapshot {
        device_traces: Some(vec![t]),
        ..Snapshot::default()
    }
}

/// Visits per trace entry of everything a report asks of the replay: the validation, what-ifs
/// (an earlier free, expandable segments), the states along the trace; and, because a trace
/// that does not validate stops at its first difference, two replays of the whole trace that
/// do not stop when it does not validate (recorded order with the recorded device answers, request order on an unlimited
/// device): the model's own cost on whatever state the trace leaves it in.
fn visits_per_entry(snap: &Snapshot) -> (f64, bool) {
    let n = snap.trace(0).len() as f64;
    let before = visits();
    let replays = Replays::new();
    let validated = replays.capture(snap).validated;
    // A trace that does not fit its segments is not replayed (its rebuild stops at the first
    // contradiction): the model is given whatever state the whole backward walk leaves.
    let segments: Vec<&Segment> = snap.segments.iter().collect();
    let settings = Settings::default();
    let init = initial::rebuild_with(&segments, snap.trace(0), &settings, false);
    let plan = run::plan(snap.trace(0), &init);
    let never = std::sync::atomic::AtomicBool::new(false);
    // (A trace that validates was replayed whole by its validation already.)
    for as_recorded in [true, false].into_iter().filter(|_| !validated) {
        run::replay(
            snap.trace(0),
            &plan,
            &init,
            settings.clone(),
            as_recorded,
            None,
            &run::Edits::default(),
            &mut run::Unless(&never),
        );
    }
    let allocs: Vec<usize> = snap
        .trace(0)
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Alloc)
        .map(|(i, _)| i)
        .take(100)
        .collect();
    let at = snap.trace(0).len() / 2;
    for changes in [
        vec![Change::FreeEarly { allocs, at }],
        vec![Change::ExpandableSegments(true)],
    ] {
        let w = replays.what_if(snap, 0, &changes);
        assert_eq!(w.simulated, validated, "{:?}", w.note);
    }
    let states = replays.recorded_states(snap, 0, &[At::After(at)]);
    assert_eq!(states.is_some(), validated);
    ((visits() - before) as f64 / n, validated)
}

#[test]
fn the_replay_costs_the_same_per_entry_at_10k_100k_and_1m_entries() {
    for (shape, make) in [
        ("inconsistent", inconsistent as fn(usize) -> Snapshot),
        ("consistent", consistent),
    ] {
        let per: Vec<(usize, f64)> = [10_000, 100_000, 1_000_000]
            .into_iter()
            .map(|n| {
                let snap = make(n);
                let (v, validated) = visits_per_entry(&snap);
                assert_eq!(validated, shape == "consistent", "{shape} {n}");
                (n, v)
            })
            .collect();
        eprintln!("{shape}: visits per entry {per:?}");
        let (small, large) = (per[0].1, per[2].1);
        assert!(
            large <= small * 1.25 + 1.0,
            "{shape}: the cost per entry grows with the trace: {per:?}"
        );
        assert!(large < 64.0, "{shape}: {per:?}");
    }
}

/// A trace that does not fit its segments is not replayed, and the note says which entry
/// contradicts them.
#[test]
fn an_inconsistent_trace_is_not_replayed_and_says_where() {
    let snap = inconsistent(10_000);
    let r = replay_device(&snap, 0);
    assert!(!r.validated);
    let note = r.note.unwrap_or_default();
    assert!(
        note.starts_with("trace entry 9999 contradicts the state the snapshot ends in (")
            && note.contains("): the trace does not fit its segments, not replayed"),
        "{note}"
    );
    let w = what_if(&snap, 0, &[Change::ExpandableSegments(true)]);
    assert!(!w.simulated);
    assert!(w.note.is_some_and(|n| n.starts_with("not simulated")));
}

/// On a trace large enough for the replay thread, whose replay stops at once (it does not fit
/// its segments), that thread computes the timeline while the main thread does the totals: the
/// analysis has the timeline a walk of its own gives.
#[test]
fn the_timeline_made_beside_a_failed_replay_is_the_timeline() {
    let snap = inconsistent(crate::torch::PARALLEL_FROM + 20_000);
    let opts = crate::torch::AnalysisOptions::default();
    let a = crate::torch::analyse(&snap, &opts);
    let alone = crate::torch::timeline::compute(
        &snap,
        &crate::torch::stacks::StackIndex::new(&snap, &opts.frames),
    );
    assert!(!alone.devices.is_empty());
    assert_eq!(a.timeline, alone);
    // And the stages, made beside PT018's grouping once that thread is idle.
    let releases = crate::torch::release::Releases::compute(&snap);
    let stages = crate::torch::stages::compute(&snap, &a.stacks, &alone, &releases);
    assert_eq!(a.stages, stages);
}
