//! The server keeps serving when captures are garbage, huge, or unreadable.

mod lsp_support;

use std::path::PathBuf;
use std::time::Duration;

use lsp_support::{Lsp, tempdir, uri};
use serde_json::{Value, json};

#[test]
fn garbage_and_a_1gb_file_neither_block_hover_nor_crash() {
    let (_tmp, ws) = tempdir();
    std::fs::write(ws.join("train.py"), "x = 1\ny = 2\n").unwrap();
    // Bytes that are no capture at all, under every capture extension.
    let garbage: Vec<u8> = (0..50_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(ws.join("garbage.pickle"), &garbage).unwrap();
    std::fs::write(ws.join("garbage.xplane.pb"), &garbage).unwrap();
    std::fs::write(ws.join("memory_snapshot.json"), b"{\"segments\": [1, 2,").unwrap();
    // A 1 GB sparse file: costs no disk, but a reader that loads it whole would stall.
    let huge = std::fs::File::create(ws.join("huge.pickle")).unwrap();
    huge.set_len(1 << 30).unwrap();
    drop(huge);
    // Make every file look settled (not a write in progress).
    std::thread::sleep(Duration::from_millis(1100));

    let mut lsp = Lsp::start(&ws, json!({}));
    let file = ws.join("train.py");
    lsp.open(&file);
    // Requests are answered from the last result while the analyses run.
    for _ in 0..5 {
        let (res, took) = lsp.request_timed(
            "textDocument/hover",
            json!({"textDocument": {"uri": uri(&file)}, "position": {"line": 0, "character": 0}}),
        );
        assert!(res.is_null(), "no capture touches train.py: {res}");
        assert!(took < Duration::from_millis(500), "hover took {took:?}");
        let (hints, took) = lsp.request_timed(
            "textDocument/inlayHint",
            json!({"textDocument": {"uri": uri(&file)},
                   "range": {"start": {"line": 0, "character": 0}, "end": {"line": 2, "character": 0}}}),
        );
        assert_eq!(hints, json!([]));
        assert!(
            took < Duration::from_millis(1500),
            "inlay hints took {took:?}"
        );
    }
    // Each unreadable capture is reported once, by name, and the server goes on.
    let from = 0;
    let seen = lsp.wait_for(from, Duration::from_secs(20), |m| {
        m["method"] == "window/showMessage"
            && m["params"]["message"]
                .as_str()
                .is_some_and(|s| s.contains("garbage.xplane.pb"))
    });
    assert!(
        seen.is_some(),
        "no message about garbage.xplane.pb: {:?}",
        lsp.messages()
    );
    lsp.idle(Duration::from_millis(1500));
    let about = |name: &str| {
        lsp.seen
            .iter()
            .filter(|m| {
                m["method"] == "window/showMessage"
                    && m["params"]["message"]
                        .as_str()
                        .is_some_and(|s| s.contains(name))
            })
            .count()
    };
    assert_eq!(about("garbage.pickle"), 1, "{:?}", lsp.messages());
    assert_eq!(about("garbage.xplane.pb"), 1, "{:?}", lsp.messages());
    // No diagnostics were published for a file that is not a readable capture.
    assert!(
        !lsp.seen
            .iter()
            .any(|m| m["method"] == "textDocument/publishDiagnostics"
                && !m["params"]["diagnostics"]
                    .as_array()
                    .is_some_and(|a| a.is_empty())),
        "unexpected diagnostics"
    );
    let res = lsp.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&file)}, "position": {"line": 1, "character": 0}}),
    );
    assert!(res.is_null());
    lsp.shutdown();
}

#[test]
fn max_file_bytes_refuses_then_a_raised_limit_reanalyses() {
    let Some(src) = lsp_support::shared("jax_cpu_captures/b_mlp_nodonate") else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let py = ws.join("b_mlp_nodonate.py");
    lsp_support::copy(&src.join("b_mlp_nodonate.py"), &py);
    lsp_support::copy(
        &src.join("b_mlp_nodonate.xplane.pb"),
        &ws.join("b_mlp_nodonate.xplane.pb"),
    );
    std::thread::sleep(Duration::from_millis(1100));
    let mut lsp = Lsp::start(&ws, json!({"maxFileBytes": 1000}));
    lsp.open(&py);
    let refused = lsp.wait_for(0, Duration::from_secs(10), |m| {
        m["method"] == "window/showMessage"
            && m["params"]["message"].as_str().is_some_and(|s| {
                s.contains("b_mlp_nodonate.xplane.pb") && s.contains("maxFileBytes")
            })
    });
    assert!(refused.is_some(), "{:?}", lsp.messages());
    assert!(
        lsp.diagnostics(&py, Duration::from_millis(300), |d| !d.is_empty())
            .is_none(),
        "diagnostics from a refused capture"
    );
    // A new limit changes what an analysis may do: the cached refusal is dropped.
    lsp.settings = json!({"maxFileBytes": 1_000_000_000u64});
    lsp.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": null}),
    );
    let d = lsp.diagnostics(&py, Duration::from_secs(10), |d| {
        d.iter().any(|x| x["code"] == "JX005")
    });
    assert!(d.is_some(), "{:?}", lsp.messages());
    lsp.shutdown();
}

#[test]
fn clients_that_can_watch_files_get_a_registration_and_their_events_count() {
    let Some(src) = lsp_support::shared("jax_cpu_captures/b_mlp_nodonate") else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let py = ws.join("b_mlp_nodonate.py");
    lsp_support::copy(&src.join("b_mlp_nodonate.py"), &py);
    let capture = ws.join("b_mlp_nodonate.xplane.pb");
    lsp_support::copy(&src.join("b_mlp_nodonate.xplane.pb"), &capture);
    let mut caps = lsp_support::client_caps();
    caps["workspace"]["didChangeWatchedFiles"]["dynamicRegistration"] = json!(true);
    let mut lsp = Lsp::start_with(&ws, json!({"captureGlobs": ["**/*.xplane.pb"]}), caps);
    let reg = lsp
        .wait_for(0, Duration::from_secs(5), |m| {
            m["method"] == "client/registerCapability"
        })
        .expect("no registration");
    let r = &reg["params"]["registrations"][0];
    assert_eq!(r["method"], "workspace/didChangeWatchedFiles");
    assert_eq!(
        r["registerOptions"]["watchers"],
        json!([{"globPattern": "**/*.xplane.pb"}])
    );
    lsp.open(&py);
    assert!(
        lsp.diagnostics(&py, Duration::from_secs(10), |d| !d.is_empty())
            .is_some()
    );
    // New globs replace the registration.
    let from = lsp.seen.len();
    lsp.settings = json!({"captureGlobs": ["**/*.xplane.pb", "runs/**/*.pickle"]});
    lsp.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": null}),
    );
    let unreg = lsp.wait_for(from, Duration::from_secs(5), |m| {
        m["method"] == "client/unregisterCapability"
    });
    assert!(unreg.is_some(), "old registration kept");
    let reg = lsp
        .wait_for(from, Duration::from_secs(5), |m| {
            m["method"] == "client/registerCapability"
        })
        .expect("no new registration");
    assert_eq!(
        reg["params"]["registrations"][0]["registerOptions"]["watchers"][1],
        json!({"globPattern": "runs/**/*.pickle"})
    );
    // A client event about the deleted capture withdraws its diagnostics (created, changed and
    // deleted are all checked against the disk).
    std::fs::remove_file(&capture).unwrap();
    lsp.notify(
        "workspace/didChangeWatchedFiles",
        json!({"changes": [{"uri": uri(&capture), "type": 2}]}),
    );
    assert!(
        lsp.diagnostics(&py, Duration::from_secs(2), |d| d.is_empty())
            .is_some()
    );
    lsp.shutdown();
}

/// A JSON snapshot of about `mb` MB: one device, `alloc` entries from one user frame.
fn big_json_snapshot(path: &std::path::Path, mb: usize) {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    write!(w, "{{\"segments\": [], \"device_traces\": [[").unwrap();
    let mut written = 0;
    let mut i = 0u64;
    while written < mb << 20 {
        let e = format!(
            "{}{{\"action\": \"alloc\", \"addr\": {}, \"size\": 512, \"stream\": 0, \"time_us\": {}, \"frames\": [{{\"filename\": \"/home/u/train.py\", \"line\": 12, \"name\": \"main\"}}]}}",
            if i == 0 { "" } else { ", " },
            0x7f00_0000_0000u64 + i * 512,
            1_700_000_000_000_000u64 + i
        );
        w.write_all(e.as_bytes()).unwrap();
        written += e.len();
        i += 1;
    }
    write!(w, "]]}}").unwrap();
}

/// A server over a workspace of `train.py`, settled, then given a JSON snapshot of about `mb`
/// MB: the temporary folder, the workspace, the server, the capture and where its messages
/// about the capture start.
fn serving_a_big_snapshot(mb: usize) -> (tempfile::TempDir, PathBuf, Lsp, PathBuf, usize) {
    let (tmp, ws) = tempdir();
    std::fs::write(ws.join("train.py"), "x = 1\n").unwrap();
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.idle(Duration::from_millis(300));
    let cap = ws.join("memory_snapshot.json");
    big_json_snapshot(&cap, mb);
    let from = lsp.seen.len();
    (tmp, ws, lsp, cap, from)
}

/// Is `m` a `$/progress` of this kind (`begin`, `report`, `end`)?
fn is_progress(m: &Value, kind: &str) -> bool {
    m["method"] == "$/progress" && m["params"]["value"]["kind"] == kind
}

/// The `report`s among progress values: (percentage, message) each.
fn reports_of(values: &[Value]) -> Vec<(u64, &str)> {
    values
        .iter()
        .filter(|v| v["kind"] == "report")
        .map(|v| {
            (
                v["percentage"].as_u64().unwrap(),
                v["message"].as_str().unwrap(),
            )
        })
        .collect()
}

/// The values of the `$/progress` messages seen from `from` on.
fn progress_since(lsp: &Lsp, from: usize) -> Vec<Value> {
    lsp.seen[from..]
        .iter()
        .filter(|m| m["method"] == "$/progress")
        .map(|m| m["params"]["value"].clone())
        .collect()
}

#[test]
fn a_capture_rewritten_in_place_while_being_read_does_not_kill_the_server() {
    let (_tmp, ws, mut lsp, cap, from) = serving_a_big_snapshot(150);
    let py = ws.join("train.py");
    let began = lsp.wait_for(from, Duration::from_secs(10), |m| is_progress(m, "begin"));
    assert!(began.is_some(), "the analysis never started");
    // `_dump_snapshot()` to the same path: open(path, "wb") truncates the file being read.
    std::fs::write(&cap, b"{\"segments\": [").unwrap();
    let noticed = lsp.wait_for(from, Duration::from_secs(20), |m| {
        m["method"] == "window/logMessage"
            && m["params"]["message"]
                .as_str()
                .is_some_and(|s| s.contains("rewritten while being read"))
    });
    // Either the decoder finished before the truncation hit an unread page, or the fault was
    // absorbed; in both cases the server must still answer.
    let (res, took) = lsp.request_timed(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&py)}, "position": {"line": 0, "character": 0}}),
    );
    assert!(res.is_null());
    assert!(took < Duration::from_secs(1));
    eprintln!("fault absorbed: {}", noticed.is_some());
    // The half-written replacement is not reported as broken.
    lsp.idle(Duration::from_millis(1500));
    assert!(lsp.errors().is_empty(), "{:?}", lsp.errors());
    lsp.shutdown();
}

/// An analysis that ends between two redraws of its bar (here: redrawn every ten minutes, so
/// once, at its start) still shows its last state, 100 %, before the bar ends.
#[test]
fn a_bar_whose_analysis_ends_between_redraws_still_ends_at_100() {
    let (tmp, ws) = tempdir();
    std::fs::write(ws.join("train.py"), "x = 1\n").unwrap();
    let mut lsp = Lsp::start_with_env(
        &ws,
        json!({}),
        &[("MEMLSP_TEST_PROGRESS_REDRAW_MS", "600000")],
    );
    lsp.idle(Duration::from_millis(300));
    let cap = ws.join("memory_snapshot.json");
    big_json_snapshot(&cap, 40);
    let from = lsp.seen.len();
    let ended = lsp.wait_for(from, Duration::from_secs(120), |m| is_progress(m, "end"));
    assert!(ended.is_some(), "the analysis never ended");
    let values = progress_since(&lsp, from);
    assert_eq!(values[0]["kind"], "begin", "{values:?}");
    let reports = reports_of(&values);
    // At most the redraw at its start came while the file was read.
    assert!(
        reports.iter().skip(1).all(|&(_, m)| m != "reading"),
        "one redraw, at the start: {reports:?}"
    );
    assert!(
        matches!(reports.last(), Some(&(100, "analysing" | "simulating"))),
        "{reports:?}"
    );
    lsp.shutdown();
    drop(tmp);
}

/// A large snapshot's progress bar says how much of the file was read, rising, then that the
/// analysis runs (100 %), then ends; the editor never sees a bar stuck at nothing.
#[test]
fn a_large_snapshot_shows_how_far_it_was_read() {
    let (_tmp, _ws, mut lsp, cap, from) = serving_a_big_snapshot(40);
    let ended = lsp.wait_for(from, Duration::from_secs(120), |m| is_progress(m, "end"));
    assert!(ended.is_some(), "the analysis never ended");
    let values = progress_since(&lsp, from);
    let begin = &values[0];
    assert_eq!(begin["kind"], "begin", "{values:?}");
    assert_eq!(begin["title"], "memlsp: analysing memory_snapshot.json");
    assert_eq!(
        (begin["percentage"].as_u64(), begin["message"].as_str()),
        (Some(0), Some("reading"))
    );
    let reports = reports_of(&values);
    // Rising; at 100 % "analysing" may give way to "simulating" (what the capture records is
    // published, the replay and what-ifs run).
    assert!(
        reports
            .windows(2)
            .all(|w| w[0].0 < w[1].0 || (w[0] == (100, "analysing") && w[1] == (100, "simulating"))),
        "rising: {reports:?}"
    );
    assert!(
        reports
            .iter()
            .any(|&(p, m)| m == "reading" && p > 0 && p < 100),
        "a share of the file while it is read: {reports:?}"
    );
    assert!(
        matches!(reports.last(), Some(&(100, "analysing" | "simulating"))),
        "{reports:?}"
    );
    assert!(
        reports
            .iter()
            .all(|&(p, m)| matches!(m, "analysing" | "simulating") == (p == 100))
    );

    // The timeline page analyses the capture again: it shows its own bar.
    let from = lsp.seen.len();
    let page = lsp.request(
        "workspace/executeCommand",
        json!({"command": "memlsp.timeline", "arguments": [{"capture": cap.to_string_lossy()}]}),
    );
    assert!(
        page["html"].as_str().is_some_and(|h| h.len() > 1000),
        "{page}"
    );
    // Its end may arrive after the answer (notifications and responses are separate streams).
    let ended = lsp.wait_for(from, Duration::from_secs(10), |m| is_progress(m, "end"));
    assert!(ended.is_some(), "the timeline's bar never ended");
    let bar = progress_since(&lsp, from);
    assert_eq!(
        bar.first().map(|v| v["kind"].clone()),
        Some(json!("begin")),
        "{bar:?}"
    );
    assert_eq!(bar[0]["title"], "memlsp: timeline of memory_snapshot.json");
    assert_eq!(
        bar.last().map(|v| v["kind"].clone()),
        Some(json!("end")),
        "{bar:?}"
    );

    // Opened again (another lens of the same capture): the page drawn is shown at once, with
    // no analysis and so no bar.
    let from = lsp.seen.len();
    let again = lsp.request(
        "workspace/executeCommand",
        json!({"command": "memlsp.timeline", "arguments": [{"capture": cap.to_string_lossy()}]}),
    );
    assert_eq!(again, page);
    lsp.idle(Duration::from_millis(500));
    assert_eq!(progress_since(&lsp, from), Vec::<Value>::new());
    assert!(
        !lsp.seen[from..]
            .iter()
            .any(|m| m["method"] == "window/workDoneProgress/create"),
        "a bar was created for a page already drawn"
    );
    lsp.shutdown();
}
