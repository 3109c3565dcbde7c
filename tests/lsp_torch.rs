//! Transcripts on real PyTorch snapshots, with the user's files recreated at their recorded
//! relative paths in a workspace elsewhere (`/home/c-kaitwang/assignment1/cs336_basics/…` →
//! `<tmp>/ws/cs336_basics/…`).

mod lsp_support;

use std::path::Path;
use std::time::{Duration, Instant};

use lsp_support::{Lsp, copy, tempdir, uri};
use serde_json::json;

const SNAPSHOT: &str = "torch_snapshots/real/kkaitlyn111__memory_ctx128_fullstep.pickle";

/// A stand-in for the user's source: `lines` numbered lines, indented like method bodies.
fn user_file(path: &Path, lines: usize) -> String {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    let text: String = (1..=lines)
        .map(|i| format!("        state_{i} = torch.zeros_like(p)  # line {i}\n"))
        .collect();
    std::fs::write(path, &text).unwrap();
    text
}

fn workspace(ws: &Path) {
    for f in [
        "cs336_basics/optimizers.py",
        "cs336_basics/transformer.py",
        "cs336_basics/training.py",
        "cs336_systems/benchmark.py",
    ] {
        user_file(&ws.join(f), 450);
    }
}

#[test]
fn optimizer_state_sites_get_live_memory_hints_and_a_stack_hover() {
    let Some(src) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    workspace(&ws);
    copy(&src, &ws.join("runs/memory_ctx128_fullstep.pickle"));
    let opt = ws.join("cs336_basics/optimizers.py");
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&opt);

    // Oracle: optimizers.py:82 and :84 each hold 24.8 % of allocated memory (291 blocks).
    let h = lsp.hints_until(&opt, 450, |h| h.len() >= 2);
    let on = |line: u64| h.iter().find(|x| x["position"]["line"] == line).cloned();
    let h82 = on(81).unwrap_or_else(|| panic!("no hint on line 82: {h:#?} {:?}", lsp.messages()));
    assert_eq!(h82["label"], "25% live memory");
    assert_eq!(
        on(83).map(|x| x["label"].clone()),
        Some(json!("25% live memory"))
    );
    let end = "        state_82 = torch.zeros_like(p)  # line 82".len();
    assert_eq!(h82["position"]["character"], end);
    let tip = h82["tooltip"].as_str().unwrap_or("");
    assert!(tip.contains("12.69 GiB in 291 blocks"), "{tip}");
    assert!(tip.contains("memory_ctx128_fullstep.pickle"), "{tip}");

    // Hover: size, blocks, and the stack with user frames first (mapped into the workspace).
    let hover = lsp.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&opt)}, "position": {"line": 81, "character": 8}}),
    );
    let md = hover["contents"]["value"].as_str().unwrap_or("");
    assert!(md.contains("**12.69 GiB** live in 291 blocks"), "{md}");
    // Frames are shown relative to the workspace, where they were found, as links to the line.
    let link = format!(
        "\n- [cs336_basics/optimizers.py:82]({}#L82) `step`\n",
        uri(&opt)
    );
    assert!(md.contains(&link), "{md}");
    assert!(
        md.contains("framework frames folded") || md.contains("native frames folded"),
        "{md}"
    );
    // A line the capture does not mention has no hover.
    let none = lsp.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&opt)}, "position": {"line": 10, "character": 0}}),
    );
    assert!(none.is_null(), "{none}");

    // Pull diagnostics answer what push published; reanalyze re-reads the capture.
    let pulled = lsp.request(
        "textDocument/diagnostic",
        json!({"textDocument": {"uri": uri(&opt)}}),
    );
    assert_eq!(pulled["kind"], "full");
    let pushed = lsp
        .diagnostics(&opt, Duration::from_millis(100), |_| true)
        .unwrap_or_default();
    assert_eq!(
        pulled["items"].as_array().cloned().unwrap_or_default(),
        pushed
    );
    let res = lsp.request(
        "workspace/executeCommand",
        json!({"command": "memlsp.reanalyze", "arguments": []}),
    );
    assert_eq!(res["captures"], 1, "{res}");
    assert!(lsp.errors().is_empty(), "{:?}", lsp.errors());
    lsp.shutdown();
}

/// The hover on a finding's line names the stage holding the capture's peak: kkaitlyn's
/// full training step recorded `Optimizer.step#AdamW.step` around the step that creates the
/// AdamW state (PT004 on optimizers.py:82), and the peak falls inside it.
#[test]
fn a_finding_hover_names_the_recorded_stage_at_the_peak() {
    let Some(src) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    workspace(&ws);
    copy(&src, &ws.join("runs/memory_ctx128_fullstep.pickle"));
    let opt = ws.join("cs336_basics/optimizers.py");
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&opt);
    let d = lsp.diagnostics(&opt, Duration::from_secs(60), |d| {
        d.iter().any(|x| x["code"] == "PT004")
    });
    assert!(d.is_some(), "no PT004: {:?}", lsp.messages());
    let hover = lsp.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&opt)}, "position": {"line": 81, "character": 8}}),
    );
    let md = hover["contents"]["value"].as_str().unwrap_or("");
    assert!(md.contains("**PT004 "), "{md}");
    assert!(
        md.contains("- *read*: the capture's peak is in `Optimizer.step#AdamW.step` of step 1\n"),
        "{md}"
    );
    assert!(lsp.errors().is_empty(), "{:?}", lsp.errors());
    lsp.shutdown();
}

#[test]
fn a_snapshot_dumped_slowly_is_quiet_until_complete_then_deleted_clears() {
    let Some(src) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    workspace(&ws);
    let opt = ws.join("cs336_basics/optimizers.py");
    let bytes = std::fs::read(&src).unwrap();
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&opt);
    lsp.idle(Duration::from_millis(400));

    let target = ws.join("dump_snapshot.pickle");
    let mut f = std::fs::File::create(&target).unwrap();
    let pieces: Vec<&[u8]> = bytes.chunks(bytes.len().div_ceil(8)).collect();
    for (i, chunk) in pieces.iter().enumerate() {
        use std::io::Write;
        if i > 0 {
            lsp.idle(Duration::from_millis(200));
        }
        f.write_all(chunk).unwrap();
        f.flush().unwrap();
    }
    drop(f);
    let last_byte = Instant::now();
    let from = lsp.seen.len();
    let refreshed = lsp.wait_for(from, Duration::from_secs(10), |m| {
        m["method"] == "workspace/inlayHint/refresh"
    });
    let took = last_byte.elapsed();
    assert!(refreshed.is_some(), "{:?}", lsp.messages());
    assert!(
        took < Duration::from_secs(2),
        "published {took:?} after the last byte"
    );
    let h = lsp.hints(&opt, 450);
    assert!(h.iter().any(|x| x["label"] == "25% live memory"), "{h:#?}");
    assert!(
        lsp.errors().is_empty(),
        "reported while being written: {:?}",
        lsp.errors()
    );

    std::fs::remove_file(&target).unwrap();
    let h = lsp.hints_until(&opt, 450, |h| h.is_empty());
    assert!(h.is_empty(), "hints outlived their capture: {h:#?}");
    lsp.shutdown();
}

/// Rank snapshots of one folder are compared in the editor too: PT012 on the line where one
/// rank holds far more than the median, the hover listing every rank's bytes there.
#[test]
fn rank_skew_is_a_diagnostic_on_the_line_with_the_ranks_in_its_hover() {
    let names = [
        "kkaitlyn111__memory_ctx128_fullstep.pickle",
        "kkaitlyn111__memory_ctx256_forward.pickle",
        "kkaitlyn111__memory_snapshot.pickle",
    ];
    let (_tmp, ws) = tempdir();
    workspace(&ws);
    for (r, n) in names.iter().enumerate() {
        let Some(src) = lsp_support::shared(&format!("torch_snapshots/real/{n}")) else {
            return;
        };
        copy(&src, &ws.join(format!("runs/rank{r}_snapshot.pickle")));
    }
    let opt = ws.join("cs336_basics/optimizers.py");
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&opt);
    let diags = lsp
        .diagnostics(&opt, Duration::from_secs(30), |d| {
            // Once all three ranks are read (they are published as each is done).
            d.iter().any(|x| {
                x["code"] == "PT012"
                    && x["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("across 3 ranks"))
            })
        })
        .unwrap_or_else(|| panic!("no PT012: {:?}", lsp.messages()));
    let d = diags.iter().find(|x| x["code"] == "PT012").unwrap();
    let line = d["range"]["start"]["line"].as_u64().unwrap();
    assert!(line == 81 || line == 83, "{d}");
    assert!(
        d["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("rank 0 holds ") && m.contains("than the median rank")),
        "{d}"
    );
    let hover = lsp.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&opt)}, "position": {"line": line, "character": 8}}),
    );
    let md = hover["contents"]["value"].as_str().unwrap_or("");
    assert!(
        md.contains("**PT012 rank skew**") && md.contains("rank 0: ") && md.contains("rank 1: "),
        "{md}"
    );
    // The excess over the median, with what kind of number it is.
    let excess = md
        .lines()
        .find(|l| l.starts_with("**") && l.contains("iB**"))
        .unwrap_or_else(|| panic!("no bytes line: {md}"));
    assert!(excess.ends_with(" *measured*"), "{excess}");
    lsp.shutdown();
}
