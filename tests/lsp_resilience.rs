//! The server survives hostile workspaces and clients (issue 6). `lsp_robustness.rs` covers
//! garbage captures and a 1 GB sparse capture; this file covers a panicking analysis, files that
//! vanish or shrink while read, 10,000 unrelated files with a 2 GB `.pkl`, symlink loops,
//! unreadable files, malformed requests, and documents closed mid-analysis.

mod lsp_support;

use std::path::Path;
use std::time::{Duration, Instant};

use lsp_support::{Lsp, copy, tempdir, uri};
use serde_json::{Value, json};

const SNAPSHOT: &str = "torch_snapshots/real/kkaitlyn111__memory_ctx128_fullstep.pickle";
const BIG: &str = "torch_snapshots/real/notHanmin__memory_snapshot.pickle";

/// The user file the snapshot's top sites point at (optimizers.py:82 and :84 hold 25% each).
fn user_files(ws: &Path) -> std::path::PathBuf {
    let opt = ws.join("cs336_basics/optimizers.py");
    std::fs::create_dir_all(opt.parent().unwrap()).unwrap();
    let text: String = (1..=450)
        .map(|i| format!("        state_{i} = torch.zeros_like(p)  # line {i}\n"))
        .collect();
    std::fs::write(&opt, text).unwrap();
    opt
}

fn has_25(h: &[Value]) -> bool {
    h.iter().any(|x| x["label"] == "25% live memory")
}

/// Hover and inlay hints answer quickly and the process is alive.
fn still_serving(lsp: &mut Lsp, file: &Path) {
    assert!(lsp.alive(), "the server died");
    let (_, took) = lsp.request_timed(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(file)}, "position": {"line": 0, "character": 0}}),
    );
    assert!(took < Duration::from_secs(2), "hover took {took:?}");
}

#[test]
fn a_panic_in_one_analysis_is_contained() {
    let Some(src) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let opt = user_files(&ws);
    copy(&src, &ws.join("runs/good_snapshot.pickle"));
    copy(&src, &ws.join("runs/boom_snapshot.pickle"));
    let mut lsp = Lsp::start_with_env(&ws, json!({}), &[("MEMLSP_TEST_PANIC_ON", "boom_")]);
    lsp.open(&opt);
    let panicked = lsp.wait_for(0, Duration::from_secs(20), |m| {
        m["method"] == "window/showMessage"
            && m["params"]["message"]
                .as_str()
                .is_some_and(|s| s.contains("boom_snapshot.pickle") && s.contains("panicked"))
    });
    assert!(panicked.is_some(), "{:?}", lsp.messages());
    // The other capture is analysed and served as usual.
    let h = lsp.hints_until(&opt, 450, has_25);
    assert!(has_25(&h), "{h:#?} {:?}", lsp.messages());
    still_serving(&mut lsp, &opt);
    // A change to the panicking capture is tried again (and contained again).
    let from = lsp.seen.len();
    std::thread::sleep(Duration::from_millis(1100));
    copy(&src, &ws.join("runs/boom_snapshot.pickle"));
    let again = lsp.wait_for(from, Duration::from_secs(20), |m| {
        m["method"] == "window/showMessage"
            && m["params"]["message"]
                .as_str()
                .is_some_and(|s| s.contains("panicked"))
    });
    assert!(again.is_some(), "{:?}", lsp.messages());
    still_serving(&mut lsp, &opt);
    lsp.shutdown();
}

#[test]
fn captures_deleted_or_truncated_while_read_do_not_crash_or_report() {
    let Some(big) = lsp_support::shared(BIG) else {
        return;
    };
    let Some(good) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let opt = user_files(&ws);
    let bytes = std::fs::read(&big).unwrap();
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&opt);
    lsp.idle(Duration::from_millis(300));
    for round in 0..4 {
        let p = ws.join(format!("runs/r{round}_snapshot.pickle"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &bytes).unwrap();
        // Let the analysis start, then pull the file from under it.
        lsp.idle(Duration::from_millis(30 + 40 * round as u64));
        if round % 2 == 0 {
            std::fs::remove_file(&p).unwrap();
        } else {
            let f = std::fs::File::options().write(true).open(&p).unwrap();
            f.set_len(1000).unwrap();
        }
        assert!(lsp.alive(), "the server died in round {round}");
    }
    // Truncated files are "still being written": quiet. The server still works.
    copy(&good, &ws.join("runs/good_snapshot.pickle"));
    let h = lsp.hints_until(&opt, 450, has_25);
    assert!(has_25(&h), "{h:#?} {:?}", lsp.messages());
    lsp.idle(Duration::from_millis(1500));
    assert!(
        lsp.errors().is_empty(),
        "a shrinking or vanished file was reported: {:?}",
        lsp.errors()
    );
    still_serving(&mut lsp, &opt);
    lsp.shutdown();
}

/// `memlsp report` (the server's analysis path) on a snapshot cut short while it is decoded: an
/// error or a result, never death by signal (a memory-mapped file raised SIGBUS here).
#[test]
fn a_snapshot_truncated_while_read_never_kills_the_process() {
    let Some(big) = lsp_support::shared(BIG) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let bytes = std::fs::read(&big).unwrap();
    let p = ws.join("redumped_snapshot.pickle");
    for delay_ms in [0u64, 5, 10, 20, 40, 80] {
        std::fs::write(&p, &bytes).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_memlsp"))
            .args(["report", p.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(1000)
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.code().is_some(),
            "truncated after {delay_ms} ms: killed by a signal ({:?})",
            out.status
        );
        assert!(matches!(out.status.code(), Some(0 | 2)), "{:?}", out.status);
    }
}

#[test]
fn ten_thousand_files_a_2gb_pkl_symlink_loops_and_unreadable_files() {
    let Some(good) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let opt = user_files(&ws);
    for d in 0..100 {
        let dir = ws.join(format!("data/d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            std::fs::write(dir.join(format!("f{f}.txt")), b"not a capture\n").unwrap();
        }
    }
    // An unrelated 2 GB sparse .pkl (a dataset, not a snapshot): refused fast, once, by name.
    let pkl = std::fs::File::create(ws.join("data/dataset.pkl")).unwrap();
    pkl.set_len(2 << 30).unwrap();
    drop(pkl);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{PermissionsExt, symlink};
        symlink(&ws, ws.join("data/loop")).unwrap();
        symlink(ws.join("data/a"), ws.join("data/b")).unwrap();
        symlink(ws.join("data/b"), ws.join("data/a")).unwrap();
        symlink(
            ws.join("nowhere.pickle"),
            ws.join("data/dangling_snapshot.pickle"),
        )
        .unwrap();
        let locked = ws.join("data/locked_snapshot.pickle");
        std::fs::write(&locked, b"\x80\x04N.").unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        let dir = ws.join("data/locked_dir");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("x_snapshot.pickle"), b"junk").unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    copy(&good, &ws.join("runs/good_snapshot.pickle"));
    std::thread::sleep(Duration::from_millis(1100));

    let t0 = Instant::now();
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&opt);
    for _ in 0..3 {
        still_serving(&mut lsp, &opt);
    }
    let h = lsp.hints_until(&opt, 450, has_25);
    assert!(has_25(&h), "{h:#?} {:?}", lsp.messages());
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    lsp.idle(Duration::from_millis(1500));
    let about_pkl = lsp
        .messages()
        .iter()
        .filter(|m| m.contains("dataset.pkl") && m.contains("cannot read"))
        .count();
    assert!(about_pkl <= 1, "{:?}", lsp.messages());
    still_serving(&mut lsp, &opt);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(
            ws.join("data/locked_dir"),
            std::fs::Permissions::from_mode(0o755),
        );
    }
    lsp.shutdown();
}

#[test]
fn malformed_requests_and_out_of_range_positions_get_answers() {
    let (_tmp, ws) = tempdir();
    let py = ws.join("train.py");
    std::fs::write(&py, "x = 1\né = '€'\n").unwrap();
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&py);
    // Not JSON, not JSON-RPC, a request without params: none may kill the server.
    lsp.send_raw(b"{ this is not json");
    let r = lsp.request_full("memlsp/afterGarbage", json!({}));
    assert!(r.is_some(), "a non-JSON message made the server deaf");
    lsp.send_raw(b"[1, 2, 3]");
    lsp.send_raw(br#"{"id": 902, "method": 12}"#);
    let r = lsp.response(json!(902), Duration::from_secs(10));
    assert!(
        r.is_some_and(|r| r.get("error").is_some()),
        "a bad request with an id is answered"
    );
    lsp.send_raw(br#"{"jsonrpc": "2.0", "id": 900, "method": "textDocument/hover"}"#);
    lsp.send_raw(br#"{"jsonrpc": "2.0", "id": 901, "method": "textDocument/hover", "params": {"textDocument": 7}}"#);
    let r = lsp.response(json!(901), Duration::from_secs(10));
    assert!(r.is_some_and(|r| r.get("error").is_some()), "bad params");
    let r = lsp.request_full("memlsp/noSuchMethod", json!({}));
    assert!(
        r.is_some_and(|r| r["error"]["code"] == -32601),
        "unknown method"
    );
    // Out-of-range positions and ranges, on open, unopened and non-file documents.
    let far = json!({"line": 4_000_000_000u64, "character": 4_000_000_000u64});
    for doc in [
        uri(&py),
        uri(&ws.join("never_opened.py")),
        "untitled:Untitled-1".to_string(),
    ] {
        for (method, params) in [
            (
                "textDocument/hover",
                json!({"textDocument": {"uri": doc}, "position": far}),
            ),
            (
                "textDocument/inlayHint",
                json!({"textDocument": {"uri": doc}, "range": {"start": far, "end": {"line": 0, "character": 0}}}),
            ),
            (
                "textDocument/codeAction",
                json!({"textDocument": {"uri": doc}, "range": {"start": far, "end": far},
                       "context": {"diagnostics": []}}),
            ),
            (
                "textDocument/diagnostic",
                json!({"textDocument": {"uri": doc}}),
            ),
        ] {
            let r = lsp
                .request_full(method, params)
                .unwrap_or_else(|| panic!("{method} on {doc}: no answer"));
            assert!(r.get("result").is_some() || r.get("error").is_some(), "{r}");
        }
    }
    // Notifications about documents that were never opened, or with nonsense versions.
    lsp.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": uri(&ws.join("nope.py"))}}),
    );
    lsp.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri(&ws.join("nope.py")), "version": -5},
               "contentChanges": [{"range": {"start": far, "end": far}, "text": "zzz"}]}),
    );
    lsp.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri(&py), "version": 2},
               "contentChanges": [{"range": {"start": far, "end": {"line": 0, "character": 0}}, "text": "q"}]}),
    );
    lsp.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": {"memlsp": {"maxFileBytes": "lots"}}}),
    );
    lsp.notify("$/cancelRequest", json!({"id": 123456}));
    still_serving(&mut lsp, &py);
    lsp.shutdown();
}

#[test]
fn documents_closed_mid_analysis() {
    let Some(src) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let opt = user_files(&ws);
    let mut lsp = Lsp::start(&ws, json!({}));
    for _ in 0..3 {
        lsp.open(&opt);
        lsp.notify(
            "textDocument/didClose",
            json!({"textDocument": {"uri": uri(&opt)}}),
        );
    }
    copy(&src, &ws.join("runs/snapshot.pickle"));
    // Open and close while the analysis runs.
    for _ in 0..5 {
        lsp.open(&opt);
        lsp.idle(Duration::from_millis(20));
        lsp.notify(
            "textDocument/didClose",
            json!({"textDocument": {"uri": uri(&opt)}}),
        );
        lsp.idle(Duration::from_millis(20));
    }
    assert!(lsp.alive());
    lsp.open(&opt);
    let h = lsp.hints_until(&opt, 450, has_25);
    assert!(has_25(&h), "{h:#?} {:?}", lsp.messages());
    lsp.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": uri(&opt)}}),
    );
    still_serving(&mut lsp, &opt);
    assert!(lsp.errors().is_empty(), "{:?}", lsp.errors());
    lsp.shutdown();
}

/// Issue 31, item 5: the cached reports stay within `scan.maxReportBytes`. With room for about
/// one report, the capture analysed first is dropped (said once in a window message), the other
/// still serves its hints, and the dropped one is analysed again when it changes.
#[test]
fn cached_reports_stay_within_their_memory_budget() {
    let Some(src) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let opt = user_files(&ws);
    copy(&src, &ws.join("runs/a_snapshot.pickle"));
    copy(&src, &ws.join("runs/b_snapshot.pickle"));
    let mut lsp = Lsp::start(&ws, json!({"scan": {"maxReportBytes": 1}}));
    lsp.open(&opt);
    let dropped = |m: &Value| {
        m["params"]["message"]
            .as_str()
            .is_some_and(|s| s.contains("1 cached report(s)") && s.contains("scan.maxReportBytes"))
    };
    let shown = lsp.wait_for(0, Duration::from_secs(30), |m| {
        m["method"] == "window/showMessage" && dropped(m)
    });
    let Some(shown) = shown else {
        panic!("no eviction message: {:?}", lsp.messages())
    };
    let first = shown["params"]["message"].as_str().unwrap().to_string();
    let (gone, kept) = if first.contains("a_snapshot.pickle") {
        ("a_snapshot.pickle", "b_snapshot.pickle")
    } else {
        ("b_snapshot.pickle", "a_snapshot.pickle")
    };
    assert!(first.contains(gone) && !first.contains(kept), "{first}");
    // The kept report still serves.
    let h = lsp.hints_until(&opt, 450, has_25);
    assert!(has_25(&h), "{h:#?} {:?}", lsp.messages());
    // The dropped capture changes: analysed again, and now the other one goes (in the log only).
    let from = lsp.seen.len();
    std::thread::sleep(Duration::from_millis(1100));
    copy(&src, &ws.join("runs").join(gone));
    let again = lsp.wait_for(from, Duration::from_secs(30), |m| {
        m["method"] == "window/logMessage"
            && dropped(m)
            && m["params"]["message"]
                .as_str()
                .is_some_and(|s| s.contains(kept))
    });
    assert!(again.is_some(), "{:?}", lsp.messages());
    let shown_twice = lsp.seen[from..]
        .iter()
        .any(|m| m["method"] == "window/showMessage" && dropped(m));
    assert!(!shown_twice, "the window message is shown once");
    still_serving(&mut lsp, &opt);
    lsp.shutdown();
}
