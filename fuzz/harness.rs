//! The fuzz harnesses, shared by `fuzz/fuzz_targets/*` and `tests/fuzz_regressions.rs` (both
//! include this file) so a reproducer is replayed through exactly the code the fuzzer ran. Each
//! takes arbitrary bytes; errors are fine (hostile input is refused), panics and hangs are the
//! bugs. Only the library's public API is used.
#![allow(dead_code)]

use std::path::Path;

use memlsp::options::{DecodeOptions, Options};
use memlsp::pickle::{Limits, decode, decode_with};
use memlsp::torch::load::decode_snapshot;

/// The pickle VM: decode, walk every node through the public accessors (no recursion: the
/// graph may be cyclic), then decode again with globals refused and a small depth limit.
pub fn pickle_vm(data: &[u8]) {
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

/// Snapshot bytes (pickle or JSON) → the model → the PyTorch analyses and report.
pub fn torch_snapshot(data: &[u8]) {
    let path = Path::new("fuzz.pickle");
    for opts in [
        DecodeOptions::default(),
        DecodeOptions {
            max_trace_events: Some(3),
            ..DecodeOptions::default()
        },
    ] {
        if let Ok(snap) = decode_snapshot(path, data, &opts) {
            let o = Options::default();
            let a = memlsp::torch::analyse(&snap, &o.analysis);
            let out = memlsp::torch::output(&snap, &a, &o.analysis);
            let _ = serde_json::to_string(&out.summary);
        }
    }
}

/// `.xplane.pb` bytes (written to `dir`, the decoder reads files) → modules, plans, report.
pub fn xplane(data: &[u8], dir: &Path) {
    let path = dir.join("fuzz.xplane.pb");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let _ = memlsp::xla::list_modules(&path);
    let opts = Options::default();
    if let Ok(cap) = memlsp::xla::Capture::open(&path) {
        let _ = memlsp::xla::analyse(&cap, &opts.analysis);
    }
}

/// The whole report path: the first byte picks the file name (and so the engine, including
/// content sniffing for unknown extensions), the rest is the file; text and JSON, then the HTML
/// page with its pictures.
pub fn report(data: &[u8], dir: &Path) {
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
    if std::fs::write(&path, body).is_err() {
        return;
    }
    let mut opts = Options::default();
    if let Ok(reports) = memlsp::analyze::run(&path, &opts) {
        let _ = memlsp::cli::render_text(&reports, opts.analysis.top);
        let _ = memlsp::cli::render_json(&reports);
    }
    // The page (`--format html`, the editor's timeline) draws on more: the pictures' analyses
    // (memory over time, the allocator's states replayed, the heap over the program order).
    opts.analysis.pictures = true;
    if let Ok(reports) = memlsp::analyze::run(&path, &opts) {
        let _ = memlsp::cli::render_html(&reports);
    }
}
