//! The editor keeps up: findings follow the user's edits, every finding's line carries its own
//! hint, a code lens opens the memory timeline, and `memlsp.timeline` answers with the page.
//! Transcripts on the real JAX CPU capture `b_mlp_nodonate` (JX005 on the `jax.jit` line 57).

mod lsp_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use lsp_support::{Lsp, copy, tempdir, uri};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);
const JIT: &str = "train_step_jit = jax.jit(train_step)";

fn workspace_with(name: &str, ws: &Path) -> Option<PathBuf> {
    let src = lsp_support::shared(&format!("jax_cpu_captures/{name}"))?;
    for e in std::fs::read_dir(&src).ok()?.flatten() {
        copy(&e.path(), &ws.join("jax").join(e.file_name()));
    }
    Some(ws.join("jax").join(format!("{name}.py")))
}

fn change(lsp: &mut Lsp, file: &Path, version: i32, text: &str) {
    lsp.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri(file), "version": version}, "contentChanges": [{"text": text}]}),
    );
}

/// The line (0-based) of the JX005 diagnostic in `diags`.
fn jx005_line(diags: &[Value]) -> Option<u64> {
    diags
        .iter()
        .find(|d| d["code"] == "JX005")
        .and_then(|d| d["range"]["start"]["line"].as_u64())
}

fn label(h: &Value) -> String {
    h["label"].as_str().unwrap_or_default().to_string()
}

#[test]
fn findings_follow_edits_and_go_away_with_their_line() {
    let (_tmp, ws) = tempdir();
    let Some(py) = workspace_with("b_mlp_nodonate", &ws) else {
        return;
    };
    let mut lsp = Lsp::start(&ws, json!({}));
    let text = lsp.open(&py);
    let first = lsp
        .diagnostics(&py, WAIT, |d| jx005_line(d).is_some())
        .expect("JX005 published");
    assert_eq!(jx005_line(&first), Some(56));
    assert!(text.lines().nth(56).is_some_and(|l| l.starts_with(JIT)));

    // Three lines inserted above: the diagnostic moves down by three, and so do its hint and
    // code actions.
    let three = format!("# one\n# two\n# three\n{text}");
    change(&mut lsp, &py, 2, &three);
    let moved = lsp
        .diagnostics(&py, WAIT, |d| jx005_line(d) == Some(59))
        .unwrap_or_else(|| panic!("JX005 did not move to line 60: {:?}", lsp.messages()));
    let d = moved.iter().find(|d| d["code"] == "JX005").unwrap();
    assert_eq!(d["range"]["start"]["character"], 0);
    let hints = lsp.hints(&py, 200);
    assert!(
        hints
            .iter()
            .any(|h| h["position"]["line"] == 59 && label(h).contains("not donated")),
        "{hints:#?}"
    );
    assert!(
        !hints
            .iter()
            .any(|h| h["position"]["line"] == 56 && label(h).contains("not donated")),
        "{hints:#?}"
    );
    let actions = lsp.request(
        "textDocument/codeAction",
        json!({
            "textDocument": {"uri": uri(&py)},
            "range": {"start": {"line": 59, "character": 0}, "end": {"line": 59, "character": 0}},
            "context": {"diagnostics": []}
        }),
    );
    let edit = actions
        .as_array()
        .and_then(|a| a.iter().find(|x| x["isPreferred"] == true))
        .map(|a| a["edit"]["changes"][uri(&py)][0]["range"]["start"]["line"].clone());
    assert_eq!(edit, Some(json!(59)), "{actions:#}");
    let hover = lsp.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&py)}, "position": {"line": 59, "character": 4}}),
    );
    assert!(
        hover["contents"]["value"]
            .as_str()
            .is_some_and(|v| v.contains("JX005")),
        "{hover}"
    );

    // Its line deleted: the diagnostic goes away.
    let deleted: String = three
        .lines()
        .filter(|l| !l.starts_with(JIT))
        .map(|l| format!("{l}\n"))
        .collect();
    change(&mut lsp, &py, 3, &deleted);
    let gone = lsp.diagnostics(&py, WAIT, |d| jx005_line(d).is_none());
    assert!(gone.is_some(), "JX005 stayed after its line was deleted");
    let hints = lsp.hints(&py, 200);
    assert!(
        !hints.iter().any(|h| label(h).contains("not donated")),
        "{hints:#?}"
    );
    assert!(lsp.errors().is_empty(), "{:?}", lsp.errors());
    lsp.shutdown();
}

#[test]
fn a_saved_edit_moves_findings_too() {
    let (_tmp, ws) = tempdir();
    let Some(py) = workspace_with("b_mlp_nodonate", &ws) else {
        return;
    };
    let mut lsp = Lsp::start(&ws, json!({}));
    let text = std::fs::read_to_string(&py).unwrap();
    // Not open in the editor: the file changes on disk (another editor, a `git checkout`).
    lsp.diagnostics(&py, WAIT, |d| jx005_line(d) == Some(56))
        .expect("JX005 published");
    std::fs::write(&py, format!("import os\n\n{text}")).unwrap();
    let moved = lsp.diagnostics(&py, WAIT, |d| jx005_line(d) == Some(58));
    assert!(moved.is_some(), "JX005 did not follow the saved file");
    lsp.shutdown();
}

#[test]
fn every_finding_line_has_its_own_hint_and_a_timeline_lens() {
    let (_tmp, ws) = tempdir();
    let Some(py) = workspace_with("b_mlp_nodonate", &ws) else {
        return;
    };
    let capture = ws.join("jax/b_mlp_nodonate.xplane.pb");
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&py);
    let hints = lsp.hints_until(&py, 200, |h| h.iter().any(|x| x["position"]["line"] == 56));
    // The jit line holds no buffer of its own (no `% of heap peak`), but its finding says what
    // it costs: the parameters and optimizer state XLA could have reused.
    let on57: Vec<String> = hints
        .iter()
        .filter(|h| h["position"]["line"] == 56)
        .map(label)
        .collect();
    assert!(
        on57.iter()
            .any(|l| l.ends_with("not donated") || l.contains("not donated ·")),
        "{on57:?}"
    );
    let text = std::fs::read_to_string(&py).unwrap();
    let end = text.lines().nth(56).unwrap().encode_utf16().count();
    assert!(
        hints
            .iter()
            .filter(|h| h["position"]["line"] == 56)
            .all(|h| h["position"]["character"] == end)
    );

    let lenses = lsp.request(
        "textDocument/codeLens",
        json!({"textDocument": {"uri": uri(&py)}}),
    );
    let lens = lenses
        .as_array()
        .and_then(|a| a.iter().find(|l| l["range"]["start"]["line"] == 56))
        .cloned()
        .unwrap_or_else(|| panic!("no lens on line 57: {lenses:#}"));
    assert_eq!(lens["command"]["command"], "memlsp.showTimeline");
    assert_eq!(lens["command"]["title"], "Show memory timeline");
    let arg = lens["command"]["arguments"][0].clone();
    assert_eq!(arg["line"], 57);

    // The lens's argument is what the client passes to `memlsp.timeline`: the page comes back.
    let page = lsp.request(
        "workspace/executeCommand",
        json!({"command": "memlsp.timeline", "arguments": [arg]}),
    );
    let html = page["html"].as_str().expect("html");
    assert!(html.to_ascii_lowercase().starts_with("<!doctype html>"));
    assert!(html.contains("JX005"));
    assert!(
        !html.contains("http://") && !html.contains("https://cdn"),
        "the page fetches nothing"
    );
    assert_eq!(
        Path::new(page["capture"].as_str().unwrap()),
        std::fs::canonicalize(&capture).unwrap()
    );
    // Places in the page are the workspace's files, so a click opens the right one.
    let local = std::fs::canonicalize(&py).unwrap();
    assert!(html.contains(&format!("\"file\":\"{}\"", local.display())));

    // From a line with nothing on it: the newest capture with findings in that file.
    let page = lsp.request(
        "workspace/executeCommand",
        json!({"command": "memlsp.timeline", "arguments": [{"file": uri(&py), "line": 1}]}),
    );
    assert!(page["html"].as_str().is_some_and(|h| h.contains("JX005")));

    // A capture that is not one: a clear error, and the server keeps serving.
    let bad = ws.join("jax/not_a_capture.xplane.pb");
    std::fs::write(&bad, b"\x01\x02garbage").unwrap();
    let resp = lsp.request_full(
        "workspace/executeCommand",
        json!({"command": "memlsp.timeline", "arguments": [{"capture": bad.to_string_lossy()}]}),
    );
    let err = resp
        .and_then(|r| r.get("error").cloned())
        .expect("an error");
    let msg = err["message"].as_str().unwrap_or_default();
    assert!(msg.contains("not_a_capture.xplane.pb"), "{msg}");
    assert!(lsp.alive());
    lsp.shutdown();
}

#[test]
fn a_rewritten_capture_cancels_the_running_analysis() {
    let (_tmp, ws) = tempdir();
    let Some(py) = workspace_with("b_mlp_nodonate", &ws) else {
        return;
    };
    let Some(c_py) = workspace_with("c_mlp_donate", &ws) else {
        return;
    };
    let donated = ws.join("jax/c_mlp_donate.xplane.pb");
    let keep = ws.join("c_mlp_donate.run");
    std::fs::rename(&donated, &keep).unwrap();
    let capture = ws.join("jax/b_mlp_nodonate.xplane.pb");
    // The first analysis of the capture is held (as a slow read of a large capture would be)
    // until it is cancelled.
    let mut lsp = Lsp::start_with_env(
        &ws,
        json!({}),
        &[("MEMLSP_TEST_HOLD_ON", "b_mlp_nodonate.xplane.pb")],
    );
    lsp.open(&py);
    lsp.idle(Duration::from_millis(600));
    // The run is rewritten with the donating version while it is being read.
    let t0 = std::time::Instant::now();
    let tmp = ws.join("jax/.partial");
    std::fs::copy(&keep, &tmp).unwrap();
    std::fs::rename(&tmp, &capture).unwrap();
    let from = lsp.seen.len();
    let cancelled = lsp.wait_for(from, Duration::from_secs(10), |m| {
        m["method"] == "window/logMessage"
            && m["params"]["message"]
                .as_str()
                .is_some_and(|s| s.contains("cancelled: the capture changed while it was read"))
    });
    assert!(cancelled.is_some(), "no cancellation: {:?}", lsp.messages());
    // The new content is analysed at once (not after the held read's 30 s): the donating run's
    // findings are on its own program, and nothing is said about the old one.
    let published = lsp.diagnostics(&c_py, Duration::from_secs(10), |d| !d.is_empty());
    assert!(published.is_some(), "{:?}", lsp.messages());
    assert!(
        !lsp.seen
            .iter()
            .any(|m| m["method"] == "textDocument/publishDiagnostics"
                && m["params"]["uri"] == uri(&py).as_str()
                && m["params"]["diagnostics"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty())),
        "the cancelled read published"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    lsp.shutdown();
}

#[test]
fn a_baseline_setting_puts_bl001_on_the_jit_line_with_its_hint() {
    let (_tmp, ws) = tempdir();
    let Some(py) = workspace_with("b_mlp_nodonate", &ws) else {
        return;
    };
    let Some(c) = lsp_support::shared("jax_cpu_captures/c_mlp_donate/c_mlp_donate.xplane.pb")
    else {
        return;
    };
    // The baseline recorded from the donating run, committed in the workspace.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memlsp"))
        .args(["baseline"])
        .arg(&c)
        .args(["-o", "memlsp-baseline.json"])
        .current_dir(&ws)
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut lsp = Lsp::start(
        &ws,
        json!({"memlsp": {"baseline": {"file": "memlsp-baseline.json", "maxGrowth": 5}}}),
    );
    lsp.open(&py);
    let diags = lsp
        .diagnostics(&py, WAIT, |d| d.iter().any(|x| x["code"] == "BL001"))
        .unwrap_or_else(|| panic!("no BL001: {:?}", lsp.messages()));
    let bl = diags
        .iter()
        .find(|d| d["code"] == "BL001" && d["range"]["start"]["line"] == 56)
        .unwrap_or_else(|| panic!("no BL001 on the jax.jit line: {diags:#?}"));
    assert_eq!(bl["severity"], 1);
    assert!(
        bl["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("+56% vs baseline: 186.09 MiB → 290.16 MiB")),
        "{bl}"
    );
    let hints = lsp.hints(&py, 200);
    assert!(
        hints.iter().any(|h| h["position"]["line"] == 56
            && label(h) == "+56% vs baseline: 186.09 MiB → 290.16 MiB"),
        "{hints:#?}"
    );
    // A generous threshold withdraws it.
    lsp.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": {"memlsp": {"baseline": {"file": "memlsp-baseline.json", "maxGrowth": 60}}}}),
    );
    let gone = lsp.diagnostics(&py, WAIT, |d| !d.iter().any(|x| x["code"] == "BL001"));
    assert!(gone.is_some(), "BL001 stayed at maxGrowth 60");
    lsp.shutdown();
}
