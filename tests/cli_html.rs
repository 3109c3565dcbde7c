//! `memlsp report --format html` on every capture in `../shared`: one self-contained page under
//! 2 MB whose pictures carry the measured and read numbers of the reference tools — the peak of
//! the active-memory timeline where the PyTorch oracle puts it, the heap over the program order
//! peaking at xprof's heap peak. What the browser does with the page is checked in real Chromium
//! by `tests/e2e/html.sh` (bands drawn, tooltips, click targets, open time).

mod common;
#[path = "support/page.rs"]
mod page;

use std::path::{Path, PathBuf};

use serde_json::Value;

const MAX_PAGE: usize = 2 << 20;

/// Every capture of `../shared` (39 real snapshots, 16 JAX captures).
fn captures(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root.join("torch_snapshots/real"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    for dir in ["jax_cpu_captures", "jax-real-captures"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
            if let Ok(rd) = std::fs::read_dir(e.path()) {
                out.extend(
                    rd.flatten()
                        .map(|f| f.path())
                        .filter(|p| p.to_string_lossy().ends_with(".xplane.pb")),
                );
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_shared_capture_gets_a_self_contained_page_with_the_oracle_peaks() {
    let Some(root) = common::shared("") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let all = captures(&root);
    assert_eq!(all.len(), 39 + 16, "{all:#?}");
    let (mut timelines, mut heaps, mut peak_states, mut oom_states) = (0, 0, 0, 0);
    for cap in &all {
        let name = cap.file_name().unwrap().to_string_lossy().into_owned();
        let out = tmp.path().join("page.html");
        let r = common::memlsp(
            &[
                "report",
                common::arg(cap),
                "--format",
                "html",
                "-o",
                common::arg(&out),
            ],
            tmp.path(),
        );
        assert_eq!(r.code, 0, "{name}: {}", r.stderr);
        assert!(r.stdout.is_empty(), "-o writes the page, not stdout");
        let html = std::fs::read_to_string(&out).unwrap();
        assert!(
            html.len() < MAX_PAGE,
            "{name}: page is {} bytes",
            html.len()
        );
        // Nothing fetched: no external script, style, image or font.
        for bad in ["<link", " src=", "http://", "https://", "@import", "url("] {
            assert!(!html.contains(bad), "{name}: page contains {bad:?}");
        }
        let data = page::page_data(&html);
        let c = &data["captures"][0];
        if let Some(t) = c.get("torch") {
            let oracle: Value = serde_json::from_slice(
                &std::fs::read(root.join(format!("torch_snapshots/oracle/{name}.json"))).unwrap(),
            )
            .unwrap();
            for dev in t["devices"].as_array().unwrap() {
                let d = dev["device"].as_u64().unwrap();
                let cols = dev["columns"].as_array().unwrap();
                assert!(
                    !cols.is_empty() && cols.len() <= 800,
                    "{name}: {} columns",
                    cols.len()
                );
                // Each column is the sample at its highest total: the bands add up to it.
                for k in cols {
                    let sum: u64 = k[6]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap())
                        .sum();
                    assert_eq!(sum, k[4].as_u64().unwrap(), "{name}: column {k}");
                }
                // The peak is kept through the downsampling, at the entry the oracle names.
                let o = &oracle["trace"]["per_device"][d.to_string()]["peak_active_bytes_trace_relative"];
                if dev["peak"].is_null() {
                    // A trace without one allocation or free (CognitoBlocks: one segment_free).
                    assert_eq!(o["bytes"], 0, "{name} device {d}: no peak drawn");
                    continue;
                }
                let top = cols.iter().map(|k| k[4].as_u64().unwrap()).max().unwrap();
                assert_eq!(dev["peak"][1].as_u64(), Some(top), "{name}");
                assert_eq!(dev["peak"][0], o["index"], "{name} device {d}: peak entry");
                // The allocator replayed at the peak (every traced device of these snapshots
                // validates) and at the first recorded OOM, with the oracle's request.
                let states = dev["states"].as_array().unwrap();
                let peak = states.iter().find(|s| s["moment"] == "peak");
                let peak = peak.unwrap_or_else(|| panic!("{name} device {d}: no peak state"));
                assert_eq!(peak["entry"], o["index"], "{name} device {d}");
                assert!(!peak["segments"].as_array().unwrap().is_empty(), "{name}");
                assert!(
                    peak["active_bytes"].as_u64() >= o["bytes"].as_u64(),
                    "{name} device {d}: blocks hold at least the requested bytes"
                );
                peak_states += 1;
                let first_oom = oracle["trace"]["oom"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|x| x["device"].as_u64() == Some(d));
                let oom = states.iter().find(|s| s["moment"] == "oom");
                assert_eq!(oom.is_some(), first_oom.is_some(), "{name} device {d}");
                if let (Some(s), Some(x)) = (oom, first_oom) {
                    assert_eq!(s["entry"], x["index"], "{name} device {d}");
                    assert_eq!(s["request"]["bytes"], x["size"], "{name} device {d}");
                    assert_eq!(s["request"]["stream"], x["stream"], "{name} device {d}");
                    assert!(
                        s["request"]["largest_free_bytes"].as_u64() < x["size"].as_u64(),
                        "{name} device {d}"
                    );
                    oom_states += 1;
                }
                // Entries covered: every one, in order, once.
                assert_eq!(cols[0][0], 0);
                for w in cols.windows(2) {
                    assert_eq!(
                        w[1][0].as_u64().unwrap(),
                        w[0][1].as_u64().unwrap() + 1,
                        "{name}"
                    );
                }
                assert_eq!(
                    cols.last().unwrap()[1].as_u64().unwrap() + 1,
                    dev["entries"].as_u64().unwrap()
                );
                timelines += 1;
            }
        } else if let Some(x) = c.get("xla") {
            let Some(module) = x["module"].as_str() else {
                continue;
            };
            let oracle: Value = serde_json::from_slice(
                &std::fs::read(cap.parent().unwrap().join("oracle.json")).unwrap(),
            )
            .unwrap();
            let m = oracle["modules"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["module"] == module)
                .unwrap_or_else(|| panic!("{name}: {module} not in the oracle"));
            assert_eq!(
                x["heap_peak"], m["peak_heap_bytes"],
                "{name}: heap peak (xprof)"
            );
            let cols = x["heap"].as_array().unwrap();
            let top = cols
                .iter()
                .map(|k| k[3].as_u64().unwrap())
                .max()
                .unwrap_or(0);
            assert_eq!(
                Some(top),
                m["peak_heap_bytes"].as_u64(),
                "{name}: the curve's top"
            );
            heaps += 1;
        }
    }
    // Device traces with allocations in the 39 snapshots (the others draw their segments), and
    // every JAX capture with an HLO plan.
    assert_eq!((timelines, heaps), (28, 15), "timelines, heaps");
    // Every one of those timelines validates; one records an OOM (Constructor-Sun, device 1).
    assert_eq!((peak_states, oom_states), (28, 1), "peak and OOM states");
}

/// The sites of the memory-over-time picture are located like the report's: with the program
/// in the workspace, each band names the workspace file (the editor's webview opens it on a
/// click) and its stack shows workspace paths.
#[test]
fn the_timeline_bands_point_at_workspace_files() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("page.html");
    let r = common::memlsp(
        &[
            "report",
            "fixtures/torch/pt002_retained_graph.pickle",
            "--format",
            "html",
            "-o",
            common::arg(&out),
        ],
        repo,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let data = page::page_data(&std::fs::read_to_string(&out).unwrap());
    let bands = data["captures"][0]["torch"]["devices"][0]["bands"]
        .as_array()
        .unwrap();
    let script = repo.join("fixtures/torch/train_leak.py");
    let located: Vec<&Value> = bands.iter().filter(|b| b["at"]["local"] == true).collect();
    assert!(!located.is_empty(), "{bands:#?}");
    for b in &located {
        assert_eq!(b["at"]["shown"], "fixtures/torch/train_leak.py", "{b}");
        assert_eq!(
            Path::new(b["at"]["file"].as_str().unwrap()),
            script.as_path()
        );
        assert!(
            b["stack"].as_array().unwrap().iter().any(|f| f
                .as_str()
                .unwrap()
                .starts_with("fixtures/torch/train_leak.py:")),
            "{b}"
        );
    }
}

/// `report --on CAPACITY --format html`: the page gets what the timeline draws for "will it
/// fit": the capacity line, `needs`, and the first failing request's entry and line.
#[test]
fn the_page_draws_the_capacity_and_the_first_failing_request() {
    let Some(f) =
        common::shared("torch_snapshots/real/silmont2000__memory_forward_bf16_128.pickle")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("page.html");
    let r = common::memlsp(
        &[
            "report",
            common::arg(&f),
            "--on",
            "700MiB",
            "--format",
            "html",
            "-o",
            common::arg(&out),
        ],
        tmp.path(),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(
        html.contains("\"capacity \" + bytes(cap)"),
        "the page draws the capacity line"
    );
    let data = page::page_data(&html);
    let fit = &data["captures"][0]["torch"]["fit"][0];
    assert_eq!(fit["on"]["capacity_bytes"], 700u64 << 20, "{fit}");
    assert_eq!(fit["needs_bytes"], 818u64 << 20, "{fit}");
    assert_eq!(fit["on"]["first_failure"]["entry"], 1704, "{fit}");
    assert_eq!(fit["on"]["first_failure"]["site"]["line"], 33, "{fit}");
    // The timeline's columns cover the failing entry, so the marker has a place.
    let cols = data["captures"][0]["torch"]["devices"][0]["columns"]
        .as_array()
        .unwrap();
    assert!(
        cols.iter()
            .any(|k| k[0].as_u64() <= Some(1704) && k[1].as_u64() >= Some(1704))
    );
}
