//! The whole `memlsp report` path on bytes: the first byte picks the file name (and so the
//! engine), the rest is the file; `analyze_file` then renders like the CLI does.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("memlsp-fuzz-report-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    harness::report(data, &dir);
});
