//! Every input a fuzz run ever crashed, hung or blew up on, replayed on each `cargo test`.
//!
//! `fuzz/regressions/<target>/<file>` holds the reproducers (minimised by `cargo fuzz tmin`);
//! each is run through the same code as the fuzz target of that name (`fuzz/fuzz_targets/`) and
//! must finish quickly without a panic. Errors are fine: hostile input must be refused, not obeyed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "../fuzz/harness.rs"]
mod harness;

use harness::{pickle_vm, report, torch_snapshot, xplane};

fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file());
    files.sort();
    files
}

fn replay(target: &str, run: impl Fn(&[u8])) {
    let files = inputs(target);
    assert!(
        !files.is_empty(),
        "fuzz/regressions/{target}/ holds no reproducer: this replay would check nothing"
    );
    for f in files {
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
