//! `.xplane.pb` bytes → index, HLO protos, plans, runtime, report (the decoder reads files, so the
//! input goes to a per-process file in /dev/shm first).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("memlsp-fuzz-xplane-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    harness::xplane(data, &dir);
});
