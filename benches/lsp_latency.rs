//! Language-server latency, measured against the real binary over stdio:
//!
//! 1. time from a 100 MB PyTorch snapshot being written into the workspace to its results being
//!    published (diagnostics, or the inlay-hint refresh that carries its sites);
//! 2. hover and inlay-hint answers from the cache (p50 / p99 / max).
//!
//! The snapshot is generated at bench time from a real one in `../shared` by repeating its trace
//! entries with Python's pickle (frames stay shared, as PyTorch writes them). Run:
//! `cargo bench --bench lsp_latency` (needs `python3` and `../shared`).

#[path = "../tests/lsp_support/mod.rs"]
mod lsp_support;

use std::path::Path;
use std::time::{Duration, Instant};

use lsp_support::{Lsp, tempdir, uri};
use serde_json::json;

const SOURCE: &str = "torch_snapshots/real/kkaitlyn111__memory_ctx128_fullstep.pickle";
const TARGET_BYTES: u64 = 100 * 1000 * 1000;

const GEN: &str = r#"
import pickle, sys
src, dst, target = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(src, "rb") as f:
    snap = pickle.load(f)
trace = snap["device_traces"][0]
span = (trace[-1]["time_us"] - trace[0]["time_us"] + 1) if trace else 1
def repeated(reps):
    out = []
    for k in range(reps):
        for e in trace:
            d = dict(e)
            d["time_us"] = e["time_us"] + k * span
            out.append(d)
    return out
def size(entries):
    snap["device_traces"][0] = entries
    return len(pickle.dumps(snap, protocol=4))
one, two = size(repeated(1)), size(repeated(2))
per = max(two - one, 1)
reps = max(1, (target - (one - per)) // per + 1)
out = repeated(reps)
snap["device_traces"][0] = out
with open(dst, "wb") as f:
    pickle.dump(snap, f, protocol=4)
"#;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(name: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "{name:<28} n={:<5} p50={:>8.3} ms  p99={:>8.3} ms  max={:>8.3} ms",
        v.len(),
        pct(&v, 0.5).as_secs_f64() * 1e3,
        pct(&v, 0.99).as_secs_f64() * 1e3,
        v.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
}

fn user_file(path: &Path, lines: usize) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).expect("mkdir");
    }
    let text: String = (1..=lines)
        .map(|i| format!("    value_{i} = compute(value_{})  # line {i}\n", i - 1))
        .collect();
    std::fs::write(path, text).expect("write user file");
}

fn main() {
    let Some(src) = lsp_support::shared(SOURCE) else {
        return;
    };
    let (tmp, ws) = tempdir();
    // The recorded user files, at their recorded paths relative to the project.
    for f in [
        "cs336_basics/optimizers.py",
        "cs336_basics/transformer.py",
        "cs336_basics/training.py",
        "cs336_systems/benchmark.py",
    ] {
        user_file(&ws.join(f), 500);
    }
    let big = tmp.path().join("big.pickle");
    let t0 = Instant::now();
    let ok = std::process::Command::new("python3")
        .args(["-c", GEN])
        .arg(&src)
        .arg(&big)
        .arg(TARGET_BYTES.to_string())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP: python3 could not generate the 100 MB snapshot");
        return;
    }
    let size = std::fs::metadata(&big).map(|m| m.len()).unwrap_or(0);
    println!(
        "generated {} ({:.1} MB) in {:.1} s",
        big.display(),
        size as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );

    let mut lsp = Lsp::start(&ws, json!({}));
    let opt = ws.join("cs336_basics/optimizers.py");
    lsp.open(&opt);
    lsp.idle(Duration::from_millis(500));

    // 1. Capture written → results published.
    let mut to_publish = Vec::new();
    for run in 0..3 {
        let from = lsp.seen.len();
        let dst = ws.join(format!("runs/step_{run}.pickle"));
        std::fs::create_dir_all(dst.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&big, &dst).expect("copy snapshot");
        let written = Instant::now();
        // The newest capture wins on shared lines, so its name appears in the messages.
        let name = format!("capture step_{run}.pickle");
        let got = lsp.wait_for(from, Duration::from_secs(120), |m| {
            m["method"] == "textDocument/publishDiagnostics"
                && m["params"]["diagnostics"].as_array().is_some_and(|d| {
                    d.iter()
                        .any(|x| x["message"].as_str().is_some_and(|s| s.contains(&name)))
                })
        });
        let took = written.elapsed();
        match got {
            Some(m) => {
                println!(
                    "run {run}: {} {:.3} s after the last byte",
                    m["method"].as_str().unwrap_or(""),
                    took.as_secs_f64()
                );
                to_publish.push(took);
            }
            None => println!(
                "run {run}: nothing published within 120 s: {:?}",
                lsp.messages()
            ),
        }
    }
    summary("write → publish (100 MB)", to_publish);
    let begins: Vec<String> = lsp
        .seen
        .iter()
        .filter(|m| m["method"] == "$/progress" && m["params"]["value"]["kind"] == "begin")
        .map(|m| {
            m["params"]["value"]["title"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    println!("work-done progress shown: {begins:?}");

    // 2. Requests answered from the cache, once every analysis has finished.
    let progress = |lsp: &Lsp, kind: &str| {
        lsp.seen
            .iter()
            .filter(|m| m["method"] == "$/progress" && m["params"]["value"]["kind"] == kind)
            .count()
    };
    while progress(&lsp, "end") < progress(&lsp, "begin") {
        lsp.idle(Duration::from_millis(100));
    }
    lsp.idle(Duration::from_secs(1));
    let hints = lsp.request(
        "textDocument/inlayHint",
        json!({"textDocument": {"uri": uri(&opt)},
               "range": {"start": {"line": 0, "character": 0}, "end": {"line": 500, "character": 0}}}),
    );
    println!("inlay hints on optimizers.py: {hints}");
    let line = hints
        .as_array()
        .and_then(|h| h.first())
        .and_then(|h| h["position"]["line"].as_u64())
        .unwrap_or(81);
    let mut hover = Vec::new();
    let mut inlay = Vec::new();
    for _ in 0..1000 {
        let (_, t) = lsp.request_timed(
            "textDocument/hover",
            json!({"textDocument": {"uri": uri(&opt)}, "position": {"line": line, "character": 4}}),
        );
        hover.push(t);
        let (_, t) = lsp.request_timed(
            "textDocument/inlayHint",
            json!({"textDocument": {"uri": uri(&opt)},
                   "range": {"start": {"line": 0, "character": 0}, "end": {"line": 120, "character": 0}}}),
        );
        inlay.push(t);
    }
    summary("hover (cached)", hover);
    summary("inlayHint (cached)", inlay);

    // 3. The same requests while a 100 MB capture is being analysed: they must not wait.
    let dst = ws.join("runs/step_busy.pickle");
    std::fs::copy(&big, &dst).expect("copy snapshot");
    let start = Instant::now();
    let mut busy = Vec::new();
    let name = "capture step_busy.pickle";
    while start.elapsed() < Duration::from_secs(60) {
        let (_, t) = lsp.request_timed(
            "textDocument/hover",
            json!({"textDocument": {"uri": uri(&opt)}, "position": {"line": line, "character": 4}}),
        );
        busy.push(t);
        let done = lsp.seen.iter().any(|m| {
            m["method"] == "textDocument/publishDiagnostics" && m.to_string().contains(name)
        });
        if done {
            break;
        }
    }
    summary("hover (during analysis)", busy);
    lsp.shutdown();
}
