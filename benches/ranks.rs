//! Per-rank directories: time and peak RSS of `memlsp report DIR --jobs N` against one snapshot's.
//!
//! `cargo bench --bench ranks [-- BIG_SNAPSHOT]`. Builds under `target/bench/ranks/`:
//! - `big/`: 64 ranks, each a hard link to BIG_SNAPSHOT (default: the 250 MB realistic snapshot
//!   `benches/gen_snapshot.py --scale` writes, else the 1 M-entry synthetic one of `bench load`);
//! - `small/`: 1,024 ranks, copies of a real snapshot from `../shared` (never committed).
//!
//! Reports, for `--jobs 1` and `--jobs 2`: wall time and peak RSS (VmHWM of the whole process,
//! via wait4), and the bound `N × one file's peak` the issue sets, one file's peak being the
//! highest of five runs (its spread is printed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[path = "support/child.rs"]
mod child;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let big = match args.first() {
        Some(f) => PathBuf::from(f),
        None => ["scaled_NiuHuangxiaozi_250M.pickle", "snapshot_1000k.pickle"]
            .iter()
            .map(|n| root.join(n))
            .find(|p| p.exists())
            .expect("no big snapshot: run `cargo bench --bench scaled` (or `--bench load`) first, or pass one"),
    };
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/torch_snapshots/real/kkaitlyn111__memory_snapshot.pickle");

    let big_dir = fill(&root.join("ranks/big"), 64, &big, true);
    let small_dir = fill(&root.join("ranks/small"), 1024, &shared, false);

    for (name, dir, one) in [
        ("64 × big", &big_dir, &big),
        ("1,024 × small", &small_dir, &shared),
    ] {
        let size = std::fs::metadata(one).map(|m| m.len()).unwrap_or(0);
        // One file's peak varies from run to run (how the replay threads overlap, where the
        // allocator's arenas land), and a folder's peak is the highest of its ranks': so one
        // file is run five times and the spread shown; the bound is checked against the highest.
        let mut singles: Vec<(f64, u64)> = (0..5)
            .map(|_| run(&["report", &one.to_string_lossy(), "--format", "json"]))
            .collect();
        singles.sort_by_key(|s| s.1);
        let (t1, single) = singles[singles.len() - 1];
        println!(
            "{name}: one file {:.3} MB → report {t1:.2} s, peak RSS {:.0}–{:.0} MB over {} runs",
            size as f64 / 1e6,
            singles[0].1 as f64 / 1e6,
            single as f64 / 1e6,
            singles.len()
        );
        for jobs in [1, 2] {
            let (t, rss) = run(&[
                "report",
                &dir.to_string_lossy(),
                "--format",
                "json",
                "--jobs",
                &jobs.to_string(),
            ]);
            let bound = jobs as u64 * single;
            let median = jobs as u64 * singles[singles.len() / 2].1;
            println!(
                "  --jobs {jobs}: {t:.1} s, peak RSS {:.0} MB (bound {jobs} × one file's highest = {:.0} MB: {}; {:.3}× the highest, {:.3}× the median)",
                rss as f64 / 1e6,
                bound as f64 / 1e6,
                if rss <= bound { "within" } else { "ABOVE" },
                rss as f64 / bound as f64,
                rss as f64 / median as f64,
            );
        }
    }
}

/// `dir` with `n` ranks of `src` (hard links, or copies).
fn fill(dir: &Path, n: usize, src: &Path, link: bool) -> PathBuf {
    if dir.join(format!("rank{}_snapshot.pickle", n - 1)).exists() {
        return dir.to_path_buf();
    }
    std::fs::create_dir_all(dir).expect("mkdir");
    for r in 0..n {
        let dst = dir.join(format!("rank{r}_snapshot.pickle"));
        let _ = std::fs::remove_file(&dst);
        if link {
            std::fs::hard_link(src, &dst).expect("hard link");
        } else {
            std::fs::copy(src, &dst).expect("copy");
        }
    }
    dir.to_path_buf()
}

/// Run memlsp to completion: seconds and peak RSS.
fn run(args: &[&str]) -> (f64, u64) {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memlsp"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("memlsp");
    let (ok, rss) = child::wait_with_rss(&mut child);
    assert!(ok, "memlsp {args:?} failed");
    (t0.elapsed().as_secs_f64(), rss)
}
