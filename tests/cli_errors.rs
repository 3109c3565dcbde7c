//! Captures that cannot be read: one clear line on stderr naming the file, exit 2, no panic.

mod common;

use common::{arg, memlsp};

fn write(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Deterministic noise (no RNG crate needed).
fn noise(n: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn nonexistent_file() {
    let dir = tempfile::tempdir().unwrap();
    let report = memlsp(&["report", "missing_snapshot.pickle"], dir.path());
    report.assert_one_line_error("missing_snapshot.pickle");
    assert_eq!(report.stdout, "");
    let check = memlsp(&["--check", "missing_snapshot.pickle"], dir.path());
    check.assert_one_line_error("missing_snapshot.pickle");
}

#[test]
fn empty_and_random_files() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        write(dir.path(), "empty.pickle", b""),
        write(dir.path(), "empty.xplane.pb", b""),
        write(dir.path(), "noise.pickle", &noise(4096)),
        write(dir.path(), "noise.xplane.pb", &noise(4096)),
        write(dir.path(), "noise.bin", &noise(64)),
        write(
            dir.path(),
            "half_snapshot.json",
            b"{\"segments\": [{\"device\": 0, ",
        ),
    ];
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap();
        let report = memlsp(&["report", arg(f)], dir.path());
        report.assert_one_line_error(name);
        assert_eq!(report.stdout, "", "{name}");
        let check = memlsp(&["--check", arg(f), "--format", "json"], dir.path());
        check.assert_one_line_error(name);
        let doc = check.json();
        assert_eq!(doc["captures"], serde_json::json!([]), "{name}");
        assert!(
            doc["errors"][0]["path"].as_str().unwrap().ends_with(name),
            "{doc}"
        );
    }
}

#[test]
fn directory_without_captures() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "train.py", b"print(1)\n");
    write(dir.path(), "config.json", b"{}");
    // A gitignored capture is not part of the workspace scan.
    std::fs::create_dir(dir.path().join("out")).unwrap();
    write(&dir.path().join("out"), "step.pickle", &noise(16));
    write(dir.path(), ".gitignore", b"out/\n");
    let check = memlsp(&["--check"], dir.path());
    check.assert_one_line_error("no capture found");
    assert_eq!(
        check.stdout,
        "no findings in 0 captures (1 more could not be read)\n"
    );
    let explicit = memlsp(&["--check", arg(dir.path())], dir.path());
    explicit.assert_one_line_error(arg(dir.path()));
    let empty = tempfile::tempdir().unwrap();
    let report = memlsp(&["report", arg(empty.path())], dir.path());
    report.assert_one_line_error("no capture");
}

#[test]
fn every_unreadable_capture_gets_its_line() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.pickle", &noise(100));
    write(dir.path(), "b.xplane.pb", b"");
    let check = memlsp(&["--check", "--format", "sarif"], dir.path());
    assert_eq!(check.code, 2);
    let lines: Vec<&str> = check.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", check.stderr);
    assert!(lines[0].starts_with("memlsp: ") && lines[0].contains("a.pickle"));
    assert!(lines[1].starts_with("memlsp: ") && lines[1].contains("b.xplane.pb"));
    let sarif = check.json();
    assert_eq!(sarif["version"], "2.1.0");
    let inv = &sarif["runs"][0]["invocations"][0];
    assert_eq!(inv["executionSuccessful"], false);
    assert_eq!(
        inv["toolExecutionNotifications"].as_array().unwrap().len(),
        2
    );
}

#[test]
fn size_limit_is_an_error_with_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "big.pickle", &noise(2048));
    let run = memlsp(&["--check", arg(&f), "--max-file-bytes", "1K"], dir.path());
    run.assert_one_line_error("above the limit of 1024 bytes");
    let report = memlsp(&["report", arg(&f), "--max-file-bytes", "1000"], dir.path());
    report.assert_one_line_error("big.pickle");
}
