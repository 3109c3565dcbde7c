//! The allocator state after a trace entry (`replay::recorded_states`), checked on every real
//! snapshot whose device replay validates (docs/REPLAY.md):
//!
//! - after the last entry it is the dump itself: the same segments (address, size) with the same
//!   blocks (address, size, state), and the same requested bytes on the live blocks;
//! - at the peak of the trace (the series' peak, which is the oracle's
//!   `peak_active_bytes_trace_relative.index`), the live blocks are the ones a backward walk from
//!   the dump finds (addresses), and their requested bytes add up to the trace's running sum:
//!   live requested bytes at the peak − live requested bytes before the first entry = the
//!   oracle's trace-relative peak bytes. The series' total at the peak counts requested bytes on
//!   top of an offset taken from the dump's block sizes, so it equals the requested bytes live at
//!   the peak plus the rounding slack (block size − requested) of the blocks live at the end;
//! - at a recorded OOM, the request is bigger than every free block of its pool and stream.

mod common;

use std::path::{Path, PathBuf};

use memlsp::options::{AnalysisOptions, DecodeOptions};
use memlsp::torch::load::load_snapshot;
use memlsp::torch::model::{Action, BlockState, Segment, Snapshot};
use memlsp::torch::replay::{At, recorded_states, replay_snapshot};

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Segment (address, size) with blocks (address, size, state), in address order.
type Shape = (u64, u64, Vec<(u64, u64, BlockState)>);

fn shapes<'a>(segs: impl Iterator<Item = &'a Segment>) -> Vec<Shape> {
    let mut v: Vec<Shape> = segs
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

fn live(b: &memlsp::torch::model::Block) -> bool {
    matches!(
        b.state,
        BlockState::ActiveAllocated | BlockState::ActivePendingFree
    )
}

/// (block bytes, requested bytes) of the live blocks.
fn live_bytes<'a>(segs: impl Iterator<Item = &'a Segment>) -> (u64, u64) {
    segs.flat_map(|s| s.blocks.iter())
        .filter(|b| live(b))
        .fold((0, 0), |(a, r), b| (a + b.size, r + b.requested_size))
}

/// Addresses of the live blocks just after entry `n`: the dump's live blocks with the entries
/// after `n` undone (an `alloc` removes its block, a `free_completed` brings it back).
fn live_addresses_by_walking_back(snap: &Snapshot, device: i64, n: usize) -> Vec<u64> {
    let mut set: std::collections::BTreeSet<u64> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| live(b))
        .map(|b| b.address)
        .collect();
    let trace = &snap.device_traces.as_ref().expect("a trace")[device as usize];
    for e in trace[n + 1..].iter().rev() {
        match e.action {
            Action::Alloc => {
                set.remove(&e.addr);
            }
            Action::FreeCompleted => {
                set.insert(e.addr);
            }
            _ => {}
        }
    }
    set.into_iter().collect()
}

/// The oracle's trace-relative peak of one device: (index, bytes).
fn oracle_peak(shared: &Path, name: &str, device: i64) -> Option<(usize, i64)> {
    let path = shared.join(format!("torch_snapshots/oracle/{name}.json"));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}")))
            .expect("oracle JSON");
    let p = &v["trace"]["per_device"][device.to_string()]["peak_active_bytes_trace_relative"];
    Some((p["index"].as_u64()? as usize, p["bytes"].as_i64()?))
}

#[test]
fn real_states_at_the_end_the_peak_and_the_oom() {
    let Some(dir) = common::shared("torch_snapshots/real") else {
        return;
    };
    let shared = dir.join("../..");
    let (mut devices, mut peaks, mut ooms) = (0, 0, 0);
    for f in files(&dir) {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let snap = load_snapshot(&f, &DecodeOptions::default()).unwrap_or_else(|e| panic!("{e:?}"));
        let opts = AnalysisOptions {
            pictures: true,
            ..AnalysisOptions::default()
        };
        let a = memlsp::torch::analyse(&snap, &opts);
        let series = memlsp::torch::output(&snap, &a, &opts).summary.series;
        for d in replay_snapshot(&snap).devices {
            let device = d.device;
            let trace = &snap.device_traces.as_ref().expect("a trace")[device as usize];
            let last = trace.len() - 1;
            let s = series
                .iter()
                .find(|s| s.device == device)
                .expect("a series per traced device");
            let peak = s.peak.map(|(i, _)| i as usize);
            let oom = trace.iter().position(|e| e.action == Action::Oom);
            let mut at = vec![At::After(last), At::BeforeRequest(0)];
            at.extend(peak.map(At::After));
            at.extend(oom.map(At::BeforeRequest));
            let states = recorded_states(&snap, device, &at);
            let Some(states) = states else {
                assert!(
                    !d.validated,
                    "{name} device {device}: validated, yet no state"
                );
                println!("{name} device {device}: not validated, no state");
                continue;
            };
            assert!(
                d.validated,
                "{name} device {device}: a state without validation"
            );
            devices += 1;
            let dump = || snap.segments.iter().filter(|s| s.device == device);

            // After the last entry: the dump.
            assert_eq!(
                shapes(states[0].iter()),
                shapes(dump()),
                "{name} device {device}: the state after the last entry is not the dump"
            );
            assert_eq!(
                live_bytes(states[0].iter()),
                live_bytes(dump()),
                "{name} device {device}: live (block, requested) bytes at the end"
            );

            // At the peak.
            let (start_blocks, start_requested) = live_bytes(states[1].iter());
            let Some(p) = peak else {
                println!("{name} device {device}: no alloc or free in the trace, no peak");
                continue;
            };
            let (oracle_index, oracle_bytes) =
                oracle_peak(&shared, &name, device).expect("an oracle peak");
            assert_eq!(p, oracle_index, "{name} device {device}: peak entry");
            let at_peak = &states[2];
            let mut addrs: Vec<u64> = at_peak
                .iter()
                .flat_map(|s| s.blocks.iter())
                .filter(|b| live(b))
                .map(|b| b.address)
                .collect();
            addrs.sort_unstable();
            assert_eq!(
                addrs,
                live_addresses_by_walking_back(&snap, device, p),
                "{name} device {device}: live blocks at the peak"
            );
            let (peak_blocks, peak_requested) = live_bytes(at_peak.iter());
            assert_eq!(
                peak_requested as i64 - start_requested as i64,
                oracle_bytes,
                "{name} device {device}: requested bytes live at the peak − before the first entry"
            );
            let (end_blocks, end_requested) = live_bytes(dump());
            let series_total = s.peak.expect("a peak").1;
            assert_eq!(
                series_total,
                peak_requested + (end_blocks - end_requested),
                "{name} device {device}: the series' total at the peak"
            );
            peaks += 1;
            println!(
                "{name} device {device}: peak at entry {p}: {} segments, live {peak_blocks} B in \
                 blocks ({peak_requested} B requested; {start_blocks} B in blocks before the \
                 first entry), series total {series_total} B",
                at_peak.len()
            );

            // At the first OOM: the request fits no free block of its pool and stream.
            if let Some(i) = oom {
                let e = &trace[i];
                let small = e.size <= 1 << 20;
                let largest = states[3]
                    .iter()
                    .filter(|s| {
                        s.stream == e.stream
                            && (s.segment_type.as_deref() == Some("small")) == small
                    })
                    .flat_map(|s| s.blocks.iter())
                    .filter(|b| b.state == BlockState::Inactive)
                    .map(|b| b.size)
                    .max()
                    .unwrap_or(0);
                assert!(
                    largest < e.size,
                    "{name} device {device}: a free block of {largest} B would serve the failed \
                     {} B request",
                    e.size
                );
                ooms += 1;
                println!(
                    "{name} device {device}: OOM at entry {i}: request {} B ({} pool, stream {}), \
                     largest free block of that pool {largest} B, {} segments",
                    e.size,
                    if small { "small" } else { "large" },
                    e.stream,
                    states[3].len()
                );
            }
        }
    }
    println!("{devices} device states checked, {peaks} peaks, {ooms} OOMs");
    assert!(devices >= 20, "only {devices} devices validate");
    assert!(ooms >= 1, "Constructor-Sun records an OOM on device 1");
}
