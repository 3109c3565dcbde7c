//! Snapshot bytes (pickle or JSON) → the `Snapshot` model → the PyTorch analyses.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memlsp::torch::load::{LoadOptions, decode_snapshot};

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz.pickle");
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
});
