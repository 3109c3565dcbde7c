//! Quick fixes on PyTorch findings, applied to the editor buffer. The captures are the synthetic
//! snapshots of `fixtures/lsp/` (recorded at `/home/alice/proj`); the workspace is a temp dir.

mod lsp_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use lsp_support::{Lsp, actions, applied, copy, tempdir, titled, uri};
use serde_json::{Value, json};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/lsp")
}

/// `<ws>/proj/{train,model}.py` and the three snapshots under `<ws>/runs/`.
fn workspace(ws: &Path) -> PathBuf {
    for f in ["train.py", "model.py"] {
        copy(&fixtures().join("proj").join(f), &ws.join("proj").join(f));
    }
    for f in ["pt002_accumulate", "pt003_append", "pt008_oom"] {
        copy(
            &fixtures().join(format!("{f}.pickle")),
            &ws.join(format!("runs/{f}.pickle")),
        );
    }
    ws.join("proj/train.py")
}

fn line(text: &str, n: usize) -> &str {
    text.lines().nth(n).unwrap_or("")
}

#[test]
fn each_quick_fix_applied_to_the_buffer_gives_the_fixed_line() {
    let (_tmp, ws) = tempdir();
    let train = workspace(&ws);
    let mut lsp = Lsp::start(&ws, json!({}));
    let text = lsp.open(&train);
    let diags = lsp
        .diagnostics(&train, Duration::from_secs(20), |d| {
            ["PT002", "PT003", "PT008"]
                .iter()
                .all(|c| d.iter().any(|x| x["code"] == *c))
        })
        .unwrap_or_else(|| panic!("findings missing: {:?}", lsp.messages()));
    let at = |code: &str| {
        diags
            .iter()
            .find(|d| d["code"] == code)
            .map(|d| d["range"]["start"]["line"].clone())
    };
    assert_eq!(at("PT002"), Some(json!(14)), "total_loss += loss");
    assert_eq!(at("PT003"), Some(json!(15)), "history.append(...)");
    assert_eq!(
        at("PT008"),
        Some(json!(12)),
        "out = model(x), where the OOM hit"
    );
    let pt002 = diags.iter().find(|d| d["code"] == "PT002").unwrap();
    assert_eq!(pt002["severity"], 2);
    assert!(
        pt002["message"]
            .as_str()
            .is_some_and(|m| m.contains("capture pt002_accumulate.pickle")),
        "{pt002}"
    );

    // PT002: `.detach()` is the preferred fix, `.item()` the alternative.
    let a = actions(&mut lsp, &train, 14);
    let detach = titled(&a, "loss.detach()");
    assert_eq!(detach["isPreferred"], true);
    assert_eq!(detach["kind"], "quickfix");
    assert_eq!(detach["diagnostics"][0]["code"], "PT002");
    assert_eq!(
        line(&applied(&text, detach, &train), 14),
        "        total_loss += loss.detach()"
    );
    let item = titled(&a, "loss.item()");
    assert_ne!(item["isPreferred"], true);
    assert_eq!(
        line(&applied(&text, item, &train), 14),
        "        total_loss += loss.item()"
    );
    // Advice without an edit explains through a command.
    let advice = titled(&a, "retain_graph=True");
    assert!(advice.get("edit").is_none());
    assert_eq!(advice["command"]["command"], "memlsp.explain");

    // PT003: the appended GPU tensor is detached and moved to the CPU.
    let a = actions(&mut lsp, &train, 15);
    let cpu = titled(&a, "detach().cpu()");
    assert_eq!(cpu["isPreferred"], true);
    assert_eq!(
        line(&applied(&text, cpu, &train), 15),
        "        history.append(torch.softmax(out, -1).detach().cpu())"
    );

    // PT008: the allocator setting goes before `import torch` in the entry script.
    let a = actions(&mut lsp, &train, 12);
    let conf = titled(&a, "expandable_segments:True");
    let fixed = applied(&text, conf, &train);
    let conf_at = fixed
        .lines()
        .position(|l| l.contains("PYTORCH_ALLOC_CONF") && l.contains("expandable_segments:True"))
        .unwrap_or_else(|| panic!("no PYTORCH_ALLOC_CONF line:\n{fixed}"));
    let import_at = fixed.lines().position(|l| l == "import torch").unwrap();
    assert!(conf_at < import_at, "{fixed}");
    // Nothing else in the file changed.
    assert_eq!(
        fixed
            .lines()
            .filter(|l| !l.contains("PYTORCH_ALLOC_CONF") && !l.starts_with("import os"))
            .count(),
        text.lines().count(),
        "{fixed}"
    );
    assert!(lsp.errors().is_empty(), "{:?}", lsp.errors());
    lsp.shutdown();
}

#[test]
fn fixes_follow_the_buffer_not_the_disk() {
    let (_tmp, ws) = tempdir();
    let train = workspace(&ws);
    let mut lsp = Lsp::start(&ws, json!({}));
    let text = lsp.open(&train);
    lsp.diagnostics(&train, Duration::from_secs(20), |d| {
        d.iter().any(|x| x["code"] == "PT002")
    })
    .unwrap_or_else(|| panic!("no PT002: {:?}", lsp.messages()));

    // A non-ASCII name before the edit: the edit's columns must be UTF-16 in the buffer.
    let renamed = text.replace("total_loss", "tötal_𝓁oss");
    lsp.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri(&train), "version": 2}, "contentChanges": [{"text": renamed}]}),
    );
    let a = actions(&mut lsp, &train, 14);
    let detach = titled(&a, "loss.detach()");
    assert_eq!(
        line(&applied(&renamed, detach, &train), 14),
        "        tötal_𝓁oss += loss.detach()"
    );

    // The line no longer accumulates: no edit, and the action says why.
    let changed = text.replace("        total_loss += loss\n", "        print(loss)\n");
    lsp.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri(&train), "version": 3}, "contentChanges": [{"text": changed}]}),
    );
    let a = actions(&mut lsp, &train, 14);
    let detach = titled(&a, "loss.detach()");
    assert!(detach.get("edit").is_none(), "stale edit: {detach}");
    assert!(
        detach["disabled"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no longer")),
        "{detach}"
    );
    assert!(
        detach["title"].as_str().unwrap().contains("no edit"),
        "{detach}"
    );

    // Closing the buffer falls back to the file on disk, which still matches.
    lsp.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": uri(&train)}}),
    );
    let a = actions(&mut lsp, &train, 14);
    let detach = titled(&a, "loss.detach()");
    assert_eq!(
        line(&applied(&text, detach, &train), 14),
        "        total_loss += loss.detach()"
    );
    lsp.shutdown();
}

#[test]
fn moving_the_folder_of_captures_away_withdraws_their_diagnostics() {
    let (tmp, ws) = tempdir();
    let train = workspace(&ws);
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&train);
    lsp.diagnostics(&train, Duration::from_secs(20), |d| {
        d.iter().any(|x| x["code"] == "PT003")
    })
    .unwrap_or_else(|| panic!("no PT003: {:?}", lsp.messages()));
    // Moved out of the workspace: the watcher reports the folder, not the files in it.
    std::fs::rename(ws.join("runs"), tmp.path().join("archived-runs")).unwrap();
    let cleared = lsp.diagnostics(&train, Duration::from_secs(2), |d| d.is_empty());
    assert!(cleared.is_some(), "diagnostics outlived their captures");
    let hints = lsp.hints(&train, 30);
    assert!(hints.is_empty(), "{hints:#?}");
    lsp.shutdown();
}

#[test]
fn a_folder_of_captures_moved_in_is_read() {
    let (tmp, ws) = tempdir();
    let train = workspace(&ws);
    let outside = tmp.path().join("incoming");
    std::fs::rename(ws.join("runs"), &outside).unwrap();
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&train);
    lsp.idle(Duration::from_millis(500));
    assert!(
        lsp.diagnostics(&train, Duration::from_millis(10), |d| !d.is_empty())
            .is_none()
    );
    // Moved in as a whole: the watcher reports the folder, not the files in it.
    std::fs::rename(&outside, ws.join("runs")).unwrap();
    let d = lsp.diagnostics(&train, Duration::from_secs(5), |d| {
        d.iter().any(|x| x["code"] == "PT003")
    });
    assert!(d.is_some(), "{:?}", lsp.messages());
    lsp.shutdown();
}

#[test]
fn a_training_loop_offers_to_record_a_memory_capture() {
    let (_tmp, ws) = tempdir();
    let train = workspace(&ws);
    let mut lsp = Lsp::start(&ws, json!({}));
    let text = lsp.open(&train);
    // On the `for step in range(8):` header (line 11), even before any capture exists there.
    let a = actions(&mut lsp, &train, 10);
    let record = titled(&a, "Record a memory capture here");
    assert_eq!(record["kind"], "refactor.rewrite");
    let fixed = applied(&text, record, &train);
    let want = "    _memlsp_capture = memlsp_capture.torch(\"memlsp-captures\", steps=(1, 10))\n    _memlsp_capture.start()\n    for step in range(8):";
    assert!(fixed.contains(want), "{fixed}");
    assert!(
        fixed.starts_with("import memlsp_capture\nimport torch\n"),
        "{fixed}"
    );
    assert!(
        fixed.contains("        opt.zero_grad()\n        _memlsp_capture.step()\n    _memlsp_capture.stop()\n    print("),
        "{fixed}"
    );
    // Not on a line of the body; not twice.
    let body = actions(&mut lsp, &train, 12);
    assert!(
        !body.iter().any(|x| x["title"]
            .as_str()
            .is_some_and(|t| t.contains("Record a memory capture"))),
        "{body:#?}"
    );
    lsp.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri(&train), "version": 2}, "contentChanges": [{"text": fixed}]}),
    );
    let again = actions(&mut lsp, &train, 14);
    assert!(
        !again.iter().any(|x| x["title"]
            .as_str()
            .is_some_and(|t| t.contains("Record a memory capture"))),
        "{again:#?}"
    );
    lsp.shutdown();
}

/// The editor never waits for a simulation: what the capture records is published as soon as
/// it is decoded (PT008 and its fixes, without an outcome), then the same diagnostic again with
/// what replaying the recorded requests with each setting gave.
#[test]
fn what_the_capture_records_is_published_before_the_simulated_outcome() {
    let (_tmp, ws) = tempdir();
    let train = workspace(&ws);
    let mut lsp = Lsp::start(&ws, json!({}));
    let simulated = |d: &Value| {
        d["data"]["fixes"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x["simulated"].is_string()))
    };
    let pt008 = |ds: &[Value]| ds.iter().find(|d| d["code"] == "PT008").cloned();
    let last = lsp.diagnostics(&train, Duration::from_secs(30), |ds| {
        pt008(ds).is_some_and(|d| simulated(&d))
    });
    let last = last.unwrap_or_else(|| panic!("no simulated PT008: {:?}", lsp.messages()));
    let d = pt008(&last).unwrap();
    let outcome = d["data"]["fixes"]
        .as_array()
        .and_then(|f| f.iter().find_map(|x| x["simulated"].as_str()))
        .unwrap_or_default()
        .to_string();
    assert!(
        outcome.contains("replayed with this allocator setting"),
        "{outcome}"
    );
    // Every publish of train.py, in order: whether its PT008 carries the simulated outcome.
    let u = uri(&train);
    let seen: Vec<bool> = lsp
        .seen
        .iter()
        .filter(|m| {
            m["method"] == "textDocument/publishDiagnostics" && m["params"]["uri"] == u.as_str()
        })
        .filter_map(|m| {
            let ds = m["params"]["diagnostics"].as_array()?;
            pt008(ds).map(|d| simulated(&d))
        })
        .collect();
    assert_eq!(seen.first(), Some(&false), "recorded first: {seen:?}");
    assert_eq!(seen.last(), Some(&true), "then simulated: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    lsp.shutdown();
}
