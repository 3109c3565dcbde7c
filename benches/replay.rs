//! Allocator replay benchmark: `cargo bench --bench replay [-- FILE]`.
//!
//! Times `replay_snapshot` (state rebuild, replay, comparison) on the largest real snapshot of
//! `../shared/torch_snapshots/real` (or FILE), then on a synthetic trace of 3 million entries
//! built in memory (alloc/free churn over 64 cached 1 GiB and 512 cached 2 MiB segments) to show how it scales.
//! Each number is the median of 5 rounds.

use std::path::{Path, PathBuf};
use std::time::Instant;

use memlsp::options::DecodeOptions;
use memlsp::torch::load::load_snapshot;
use memlsp::torch::model::{Action, Block, BlockState, Segment, Snapshot, TraceEntry};
use memlsp::torch::replay::replay_snapshot;

const ROUNDS: usize = 5;

fn median_secs(mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[ROUNDS / 2]
}

fn largest_real() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/torch_snapshots/real");
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
        .max()
        .map(|(_, p)| p)
}

fn report(what: &str, snap: &Snapshot) {
    let entries: usize = snap.device_traces.iter().flatten().map(Vec::len).sum();
    let mut last = None;
    let secs = median_secs(|| last = Some(replay_snapshot(snap)));
    let (validated, note) = last.map_or((false, None), |r| (r.validated, r.note));
    println!(
        "{what}: {entries} trace entries, replay {:.1} ms ({:.2} M entries/s), validated: {validated}{}",
        secs * 1e3,
        entries as f64 / secs.max(1e-9) / 1e6,
        note.map(|n| format!(" ({n})")).unwrap_or_default()
    );
}

fn synthetic(n: usize) -> Snapshot {
    const GIB: u64 = 1 << 30;
    let segment = |address: u64, size: u64| Segment {
        device: 0,
        address,
        total_size: size,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: Some(if size == 2 << 20 { "small" } else { "large" }.into()),
        is_expandable: false,
        pool_id: Some((0, 0)),
        stack: None,
        blocks: vec![Block {
            address,
            size,
            requested_size: 0,
            state: BlockState::Inactive,
            stack: None,
            history_len: 0,
        }],
    };
    let mut segments: Vec<Segment> = (0..64u64)
        .map(|k| segment(0x7f00_0000_0000 + k * 2 * GIB, GIB))
        .collect();
    segments.extend((0..512u64).map(|k| segment(0x7e00_0000_0000 + k * (4 << 20), 2 << 20)));
    // A window of 256 live tensors of pseudo-random sizes (512 B … 64 MiB); the oldest is freed
    // before each new allocation; everything is freed at the end.
    let mut t = Vec::with_capacity(n);
    let mut live = std::collections::VecDeque::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next_addr = 0x1000u64;
    while t.len() + 3 * live.len() + 3 < n {
        if live.len() == 256 {
            let (a, s) = live.pop_front().unwrap_or((0, 0));
            t.push(TraceEntry::new(Action::FreeRequested, a, s, 0));
            t.push(TraceEntry::new(Action::FreeCompleted, a, s, 0));
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let size = 512 << (x % 18);
        next_addr += 1 << 12;
        t.push(TraceEntry::new(Action::Alloc, next_addr, size, 0));
        live.push_back((next_addr, size));
    }
    for (a, s) in live {
        t.push(TraceEntry::new(Action::FreeRequested, a, s, 0));
        t.push(TraceEntry::new(Action::FreeCompleted, a, s, 0));
    }
    Snapshot {
        segments,
        device_traces: Some(vec![t]),
        ..Snapshot::default()
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let file = args.first().map(PathBuf::from).or_else(largest_real);
    match file {
        Some(f) => match load_snapshot(&f, &DecodeOptions::default()) {
            Ok(snap) => report(&format!("{}", f.display()), &snap),
            Err(e) => println!("{}: {e:?}", f.display()),
        },
        None => println!("SKIP real snapshot: ../shared/torch_snapshots/real not found"),
    }
    report("synthetic", &synthetic(3_000_000));
}
