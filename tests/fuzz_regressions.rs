//! Every input a fuzz run ever crashed, hung or blew up on, replayed on each `cargo test`.
//!
//! `fuzz/regressions/<target>/<file>` holds the reproducers (minimised by `cargo fuzz tmin`);
//! each is run through the same code as the fuzz target of that name (`fuzz/fuzz_targets/`) and
//! must finish quickly without a panic. Errors are fine: hostile input must be refused, not obeyed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memlsp::pickle::{Limits, decode, decode_with};
use memlsp::torch::load::{LoadOptions, decode_snapshot};

fn pickle_vm(data: &[u8]) {
    if let Ok(tree) = decode(data) {
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![tree.root];
        while let Some(v) = stack.pop() {
            if !seen.insert(v) || seen.len() > 100_000 {
                continue;
            }
            let _ = tree.describe(v);
            let _ = (tree.str(v), tree.bytes(v), tree.int128(v), tree.float(v));
            stack.extend_from_slice(tree.items(v));
            for (k, x) in tree.pairs(v) {
                stack.push(k);
                stack.push(x);
            }
            if let Some((c, a, s)) = tree.call(v) {
                stack.extend([c, a, s]);
            }
        }
    }
    let strict = Limits {
        refuse_globals: true,
        max_depth: 16,
        ..Limits::default()
    };
    let _ = decode_with(data, &strict);
}

fn torch_snapshot(data: &[u8]) {
    let path = Path::new("fuzz.pickle");
    for opts in [
        LoadOptions::default(),
        LoadOptions {
            max_trace_events: Some(3),
        },
    ] {
        if let Ok(snap) = decode_snapshot(path, data, &opts) {
            let o = memlsp::analyze::Options::default();
            let a = memlsp::torch::analyze_snapshot(&snap, &o);
            let _ = memlsp::torch::build_report(path, &snap, &a, &o);
        }
    }
}

fn xplane(data: &[u8], dir: &Path) {
    let path = dir.join("fuzz.xplane.pb");
    std::fs::write(&path, data).unwrap();
    let _ = memlsp::xla::capture::list_modules(&path);
    let opts = memlsp::analyze::Options::default();
    let _ = memlsp::xla::capture::analyze_file_with(&path, &opts, &|_| None);
}

fn report(data: &[u8], dir: &Path) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let name = match pick % 4 {
        0 => "fuzz.pickle",
        1 => "fuzz.xplane.pb",
        2 => "memory_snapshot.json",
        _ => "fuzz.bin",
    };
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    let opts = memlsp::analyze::Options::default();
    if let Ok(r) = memlsp::analyze::analyze_file(&path, &opts) {
        let _ = format!("{} {:?} {:?}", r.headline, r.sites, r.findings);
    }
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file() && p.file_name().is_some_and(|n| n != ".gitkeep"));
    files.sort();
    files
}

fn replay(target: &str, run: impl Fn(&[u8])) {
    for f in inputs(target) {
        let data = std::fs::read(&f).unwrap();
        let start = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&data)));
        assert!(r.is_ok(), "{target}: {} panicked", f.display());
        // Generous for debug builds on a shared machine; the fuzzers ran with -timeout=10.
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{target}: {} took {:?}",
            f.display(),
            start.elapsed()
        );
    }
}

#[test]
fn pickle_vm_regressions() {
    replay("pickle_vm", pickle_vm);
}

#[test]
fn torch_snapshot_regressions() {
    replay("torch_snapshot", torch_snapshot);
}

#[test]
fn xplane_regressions() {
    let dir = tempfile::tempdir().unwrap();
    replay("xplane", |d| xplane(d, dir.path()));
}

#[test]
fn report_regressions() {
    let dir = tempfile::tempdir().unwrap();
    replay("report", |d| report(d, dir.path()));
}
