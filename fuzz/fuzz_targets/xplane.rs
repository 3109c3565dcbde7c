//! `.xplane.pb` bytes → index, HLO protos, plans, runtime, report (the decoder reads files, so the
//! input goes to a per-process file in /dev/shm first).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("memlsp-fuzz-xplane-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("fuzz.xplane.pb");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let _ = memlsp::xla::capture::list_modules(&path);
    let opts = memlsp::analyze::Options::default();
    let _ = memlsp::xla::capture::analyze_file_with(&path, &opts, &|_| None);
});
