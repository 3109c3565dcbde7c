//! Many devices: the work per device stays constant (counted, not timed). 12,500 devices took
//! 1.6 s and 50,000 took 17 s when every device scanned every segment.

use std::sync::atomic::Ordering;

use crate::options::AnalysisOptions;
use crate::torch::model::{Action, Block, BlockState, Frame, Snapshot, TraceEntry};
use crate::torch::totals::tests::segment;

/// `n` devices, one segment and a one-entry trace each (`gen_hostile_snapshots.py devices`).
fn devices(n: i64) -> Snapshot {
    let mut segments = Vec::new();
    let mut traces = Vec::new();
    for d in 0..n {
        let base = (1u64 << 40) + d as u64 * (4 << 20);
        let live = Block {
            address: 0,
            size: 512,
            requested_size: 500,
            state: BlockState::ActiveAllocated,
            stack: Some(0),
            history_len: 0,
        };
        let free = Block {
            size: (2 << 20) - 512,
            state: BlockState::Inactive,
            stack: None,
            ..live.clone()
        };
        segments.push(segment(d, base, vec![live, free]));
        traces.push(vec![
            TraceEntry::new(Action::Alloc, base, 512, 0).with_stack(Some(0)),
        ]);
    }
    Snapshot {
        segments,
        device_traces: Some(traces),
        frames: vec![Frame {
            name: "step".into(),
            filename: "/home/u/proj/train.py".into(),
            line: 10,
        }],
        stacks: vec![vec![0]],
        ..Snapshot::default()
    }
}

/// Segments visited per device by the analysis, the summary and the pictures.
fn visits_per_device(n: i64) -> u64 {
    let snap = devices(n);
    let opts = AnalysisOptions {
        pictures: true,
        ..AnalysisOptions::default()
    };
    let a = crate::torch::analyse(&snap, &opts);
    let out = crate::torch::output(&snap, &a, &opts);
    assert_eq!(out.summary.devices.len(), n as usize);
    assert_eq!(out.summary.series.len(), n as usize);
    snap.by_device.visits.load(Ordering::Relaxed) / n as u64
}

#[test]
fn per_device_work_does_not_grow_with_the_devices() {
    let small = visits_per_device(50);
    let large = visits_per_device(2_000);
    assert!(small > 0, "the per-device analyses read their segments");
    assert_eq!(
        small, large,
        "segments visited per device: {small} with 50 devices, {large} with 2,000"
    );
}

/// A stale index (segments changed after it was built) is not trusted: the device's segments
/// are found by scanning, as before.
#[test]
fn segments_of_sees_segments_added_after_the_index() {
    let mut snap = devices(3);
    assert_eq!(snap.segments_of(1).count(), 1);
    let mut extra = snap.segments[0].clone();
    extra.device = 1;
    snap.segments.push(extra);
    assert_eq!(snap.segments_of(1).count(), 2);
    assert_eq!(snap.segments_of(7).count(), 0);
}

/// Per-device code asks for its device's segments (`Snapshot::segments_of`) and looks devices
/// up in sorted lists, never scans everything once per device: a scan per device is quadratic.
#[test]
fn no_per_device_scan_of_every_segment() {
    let sources = [
        ("totals.rs", include_str!("totals.rs")),
        ("sites.rs", include_str!("sites.rs")),
        ("timeline.rs", include_str!("timeline.rs")),
        ("series.rs", include_str!("series.rs")),
        ("fragmentation.rs", include_str!("fragmentation.rs")),
        ("replay/mod.rs", include_str!("replay/mod.rs")),
        ("replay/state.rs", include_str!("replay/state.rs")),
        ("summary.rs", include_str!("summary.rs")),
        ("present/html.rs", include_str!("../present/html.rs")),
    ];
    for (name, text) in sources {
        let flat: String = text.split_whitespace().collect();
        for bad in [
            ".filter(|s|s.device==",
            ".find(|t|t.device==",
            ".find(|d|d.device==device)",
            ".find(|(d,_)|*d==s.device)",
            "t.series.iter().any(",
        ] {
            assert!(!flat.contains(bad), "{name}: a per-device scan `{bad}`");
        }
    }
}
