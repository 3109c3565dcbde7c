//! The whole `memlsp report` path on bytes: the first byte picks the file name (and so the
//! engine), the rest is the file; `analyze_file` then renders like the CLI does.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let name = match pick % 4 {
        0 => "fuzz.pickle",
        1 => "fuzz.xplane.pb",
        2 => "memory_snapshot.json",
        _ => "fuzz.bin",
    };
    let dir = std::env::temp_dir().join(format!("memlsp-fuzz-report-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(name);
    if std::fs::write(&path, body).is_err() {
        return;
    }
    let opts = memlsp::analyze::Options::default();
    if let Ok(r) = memlsp::analyze::analyze_file(&path, &opts) {
        let _ = serde_json_free_render(&r);
    }
});

fn serde_json_free_render(r: &memlsp::report::CaptureReport) -> String {
    format!("{} {:?} {:?}", r.headline, r.sites, r.findings)
}
