//! The HTML report page of a large snapshot: how long `memlsp report --format html` takes, its
//! peak RSS, the page's size, and how long Chromium takes to open it.
//!
//! `cargo bench --bench page [-- FILE]`. Without FILE it generates a 5 M-entry snapshot (about
//! 1.1 GB) with `benches/gen_snapshot.py` under `target/bench/` (a few minutes, once). The page
//! is opened by `tests/e2e/html/open.cjs` (Playwright + Chromium; `npm ci` in tests/e2e/html
//! first) when node is there. Each number is the median of 3 runs, each in its own process.

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
    let file = match args.first() {
        Some(f) => PathBuf::from(f),
        None => generate(),
    };
    let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    println!("snapshot: {} ({:.0} MB)", file.display(), size as f64 / 1e6);
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench/page.html");
    let mut report = Vec::new();
    for _ in 0..3 {
        report.push(render(&file, &out));
    }
    report.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (secs, rss) = report[1];
    let page = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    println!(
        "report --format html: {secs:.2} s, peak RSS {:.0} MB; page {:.0} KiB",
        rss as f64 / 1e6,
        page as f64 / 1024.0
    );
    let opener = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/html/open.cjs");
    let mut opened = Vec::new();
    for _ in 0..3 {
        match open(&opener, &out) {
            Some(x) => opened.push(x),
            None => {
                println!(
                    "open in Chromium: skipped (needs node, chromium and `npm ci` in tests/e2e/html)"
                );
                return;
            }
        }
    }
    opened.sort_by_key(|x| x.0);
    let (load, draw) = opened[1];
    println!("open in Chromium: load {load} ms (page script {draw:.0} ms)");
}

/// One `memlsp report FILE --format html -o OUT` in its own process: seconds and peak RSS.
fn render(file: &Path, out: &Path) -> (f64, u64) {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memlsp"))
        .arg("report")
        .arg(file)
        .args(["--format", "html", "-o"])
        .arg(out)
        .spawn()
        .expect("run memlsp");
    let (status, rss) = child::wait_with_rss(&mut child);
    assert!(status, "memlsp report failed");
    (t0.elapsed().as_secs_f64(), rss)
}

fn open(opener: &Path, page: &Path) -> Option<(u64, f64)> {
    let out = Command::new("node").arg(opener).arg(page).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn generate() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).expect("mkdir target/bench");
    let file = dir.join("snapshot_5000k.pickle");
    if !file.exists() {
        eprintln!("generating {} (a few minutes)…", file.display());
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/gen_snapshot.py");
        let st = Command::new("python3")
            .arg(script)
            .arg(&file)
            .arg("5000000")
            .status()
            .expect("python3");
        assert!(st.success(), "generator failed");
    }
    file
}
