//! Small files that ask for gigabytes (issue 31): the model a snapshot or a plane's metadata
//! would hold is counted while decoding and refused past a budget tied to the file's size
//! (`--max-model-bytes`; docs/LIMITS.md), with one line and before the memory is spent.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the bytes live on the heap (all threads) and their peak.
struct Peak;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if n >= l.size() {
            let now = LIVE.fetch_add(n - l.size(), Ordering::Relaxed) + n - l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(l.size() - n, Ordering::Relaxed);
        }
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static ALLOC: Peak = Peak;

/// The heap's peak above its level at the start, while `f` runs (one test at a time).
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    static ONE: Mutex<()> = Mutex::new(());
    let _g = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let r = f();
    (r, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

/// `gen_hostile_snapshots.py CASE N` into `dir` (None, after `skip`, without the tool or python3).
fn hostile(case: &str, n: u32, dir: &Path) -> Option<PathBuf> {
    let tool = common::shared("tools/gen_hostile_snapshots.py")?;
    let out = dir.join(format!("{case}.pickle"));
    let made = std::process::Command::new("python3")
        .arg(&tool)
        .args([case, &n.to_string()])
        .arg(&out)
        .status();
    match made {
        Ok(s) if s.success() => Some(out),
        other => {
            common::skip(&format!(
                "python3 could not run {}: {other:?}",
                tool.display()
            ));
            None
        }
    }
}

fn refused_in_process(path: &Path, cap: usize) -> String {
    let opts = memlsp::options::Options::default();
    let (r, peak) = peak_of(|| memlsp::analyze::analyze_file(path, &opts));
    let Err(e) = r else {
        panic!("{}: accepted", path.display())
    };
    let e = e.to_string();
    assert!(
        peak < cap,
        "{}: {peak} bytes live at the peak before the refusal",
        path.display()
    );
    e
}

/// One segment dict referenced 10^6 times through the memo: a 2.0 MB file whose model held
/// 464 MiB (a quarter of a gigabyte of `Segment`s and `Block`s).
#[test]
fn a_segment_referenced_a_million_times_is_refused_before_the_model_is_built() {
    let dir = tempfile::tempdir().unwrap();
    let Some(p) = hostile("shared-segment", 1_000_000, dir.path()) else {
        return;
    };
    let e = refused_in_process(&p, 80 << 20);
    assert!(e.contains("1000000 segments, 2000000 blocks"), "{e}");
    assert!(e.contains("over the budget of 64.00 MiB"), "{e}");
    let r = common::memlsp(&["report", "shared-segment.pickle"], dir.path());
    r.assert_one_line_error("shared-segment.pickle");
    assert!(r.stderr.contains("--max-model-bytes"), "{}", r.stderr);
}

/// 400,000 empty device traces: a 0.8 MB file whose analysis held 0.9 GiB (each device its
/// totals, sites and summary). The empty lists cost nothing; the devices do.
#[test]
fn four_hundred_thousand_empty_device_traces_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let Some(p) = hostile("empty-traces", 400_000, dir.path()) else {
        return;
    };
    let e = refused_in_process(&p, 80 << 20);
    assert!(e.contains("0 trace entries, 400000 devices"), "{e}");
    // `--check` names it and goes on.
    let r = common::memlsp(&["--check", "empty-traces.pickle"], dir.path());
    assert!(
        r.stdout.contains("empty-traces.pickle") || r.stderr.contains("empty-traces.pickle"),
        "{} {}",
        r.stdout,
        r.stderr
    );
}

/// Many devices with real content stay under the default budget (12,500: 51 MiB of analysis),
/// and `--max-model-bytes` sets the budget.
#[test]
fn many_real_devices_pass_and_the_budget_can_be_set() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_) = hostile("devices", 2_000, dir.path()) else {
        return;
    };
    let ok = common::memlsp(
        &["report", "devices.pickle", "--format", "json"],
        dir.path(),
    );
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let devices = &ok.json()["captures"][0]["torch"]["devices"];
    assert_eq!(devices.as_array().map(Vec::len), Some(2_000));
    let tight = common::memlsp(
        &["report", "devices.pickle", "--max-model-bytes", "1M"],
        dir.path(),
    );
    tight.assert_one_line_error("devices.pickle");
    assert!(
        tight
            .stderr
            .contains("over the budget of 1.00 MiB (--max-model-bytes)"),
        "{}",
        tight.stderr
    );
}

/// The real snapshots are far from the default budget: their models hold at most about twice
/// their size (files above 100 KB; below 8 MiB the 64 MiB floor applies).
#[test]
fn every_real_snapshot_is_under_a_tight_budget() {
    let Some(dir) = common::shared("torch_snapshots/real") else {
        return;
    };
    let mut n = 0;
    for f in std::fs::read_dir(dir).unwrap().flatten() {
        let p = f.path();
        let len = std::fs::metadata(&p).unwrap().len();
        if len < 100_000 {
            continue;
        }
        // 3 × the file, no floor: the default (8 ×, at least 64 MiB) leaves room to spare.
        let opts = memlsp::options::DecodeOptions {
            max_model_bytes: Some(len * 3),
            ..Default::default()
        };
        let r = memlsp::torch::load::load_snapshot(&p, &opts);
        assert!(r.is_ok(), "{}: {:?}", p.display(), r.err());
        n += 1;
    }
    assert!(n >= 10, "only {n} real snapshots above 100 KB");
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn len_field(num: u64, payload: &[u8], out: &mut Vec<u8>) {
    varint(num << 3 | 2, out);
    varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// An `.xplane.pb` whose `/host:metadata` holds `n` tiny event-metadata entries (22 bytes each).
fn metadata_capture(n: u64) -> Vec<u8> {
    let mut plane = Vec::new();
    varint(1 << 3, &mut plane);
    varint(1, &mut plane);
    len_field(2, b"/host:metadata", &mut plane);
    for i in 1..=n {
        let mut meta = Vec::new();
        varint(1 << 3, &mut meta);
        varint(i, &mut meta);
        len_field(2, format!("op{i}").as_bytes(), &mut meta);
        let mut entry = Vec::new();
        varint(1 << 3, &mut entry);
        varint(i, &mut entry);
        len_field(2, &meta, &mut entry);
        len_field(4, &entry, &mut plane);
    }
    let mut space = Vec::new();
    len_field(1, &plane, &mut space);
    space
}

/// 2·10^6 event-metadata entries (45 MB) held 980 MB; 600,000 (13 MB) are refused here, at the
/// byte offset of the entry that crossed the budget, before the tables grow past it.
#[test]
fn millions_of_event_metadata_entries_are_refused_with_their_offset() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("meta.xplane.pb");
    let bytes = metadata_capture(600_000);
    std::fs::write(&p, &bytes).unwrap();
    let budget = 8 * bytes.len();
    let e = refused_in_process(&p, budget + budget / 2);
    assert!(
        e.contains("the plane's metadata would hold more than"),
        "{e}"
    );
    assert!(e.contains("at byte "), "{e}");
    let r = common::memlsp(&["report", "meta.xplane.pb"], dir.path());
    r.assert_one_line_error("meta.xplane.pb");
    // A real-sized one passes.
    std::fs::write(&p, metadata_capture(2_000)).unwrap();
    let opts = memlsp::options::Options::default();
    let r = memlsp::analyze::analyze_file(&p, &opts);
    assert!(
        !r.as_ref()
            .err()
            .is_some_and(|e| e.to_string().contains("budget")),
        "{:?}",
        r.err()
    );
}

/// A snapshot with one small segment and `extra` (Python: a dict literal's items) beside it,
/// pickled by CPython into `dir` (None, after `skip`, without python3).
fn with_extras(name: &str, extra: &str, dir: &Path) -> Option<PathBuf> {
    let out = dir.join(format!("{name}.pickle"));
    let script = format!(
        "import pickle, sys\n\
         seg = {{'device': 0, 'address': 0, 'total_size': 1 << 20, 'allocated_size': 0, \
         'active_size': 0, 'requested_size': 0, 'stream': 0, 'segment_type': 'large', \
         'blocks': [{{'size': 1 << 20, 'requested_size': 0, 'address': 0, 'state': 'inactive', \
         'frames': []}}]}}\n\
         snap = {{'segments': [seg], 'device_traces': [[]], {extra}}}\n\
         pickle.dump(snap, open(sys.argv[1], 'wb'), protocol=4)\n"
    );
    let made = std::process::Command::new("python3")
        .args(["-c", &script])
        .arg(&out)
        .status();
    match made {
        Ok(s) if s.success() => Some(out),
        other => {
            common::skip(&format!("python3 could not write {name}: {other:?}"));
            None
        }
    }
}

/// One `external_annotations` dict (a 200-character name) referenced 10^6 times through the
/// memo: a 2.0 MB file whose model held 244 MiB of annotations (282 MB resident) — each entry
/// owns its name. Counted and refused like segments.
#[test]
fn an_annotation_referenced_a_million_times_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "'external_annotations': [{'name': 'x' * 200, 'stage': 'START', 'device': 0, \
                 'time_us': 1}] * 1000000";
    let Some(p) = with_extras("annotations", extra, dir.path()) else {
        return;
    };
    let e = refused_in_process(&p, 80 << 20);
    assert!(e.contains("1000000 annotations"), "{e}");
    assert!(e.contains("over the budget of 64.00 MiB"), "{e}");
}

/// `trace_alloc_max_entries` as a list of 10^6 values names 10^6 devices, each one of the
/// analysis's devices (`torch::recording`): a 2.0 MB file that did not finish in a minute (a
/// search per device). Counted as devices and refused at once.
#[test]
fn ring_buffer_keys_naming_a_million_devices_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let Some(p) = with_extras(
        "ring",
        "'trace_alloc_max_entries': [5] * 1000000",
        dir.path(),
    ) else {
        return;
    };
    let e = refused_in_process(&p, 80 << 20);
    assert!(e.contains("1000000 devices"), "{e}");
    let r = common::memlsp(&["report", "ring.pickle"], dir.path());
    r.assert_one_line_error("ring.pickle");
}

/// One `host_segments` dict of 1,000 blocks referenced 10^6 times (and 10^6 host traces): only
/// totals are kept, and the shared dict is read once (it walked 10^9 blocks, over a minute).
#[test]
fn host_segments_referenced_a_million_times_are_totalled_once() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "'host_segments': [{'total_size': 1 << 20, 'blocks': [{'size': 4096, \
                 'state': 'active_allocated'}] * 1000}] * 1000000, 'host_traces': [[]] * 1000000";
    let Some(_) = with_extras("host", extra, dir.path()) else {
        return;
    };
    let r = common::memlsp(&["report", "host.pickle", "--format", "json"], dir.path());
    assert_eq!(r.code, 0, "{}", r.stderr);
    let host = &r.json()["captures"][0]["torch"]["host"];
    assert_eq!(host["segments"], 1_000_000, "{host}");
    assert_eq!(host["reserved_bytes"], 1_000_000u64 << 20, "{host}");
    assert_eq!(host["allocated_bytes"], 4_096_000_000_000u64, "{host}");
    assert_eq!(host["trace_entries"], 1_000_000, "{host}");
    assert_eq!(host["label"], "read", "{host}");
}
