//! Transcripts on the real JAX CPU captures, with the workspace at another path than the one the
//! capture recorded (`/srv/jaxdemo/…` → `<tmp>/ws/jax/…`).

mod lsp_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lsp_support::{Lsp, apply_edits, copy, tempdir, uri};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// Copy `jax_cpu_captures/<name>/*` into `<ws>/jax/`; returns the program's path there.
fn workspace_with(name: &str, ws: &Path) -> Option<PathBuf> {
    let src = lsp_support::shared(&format!("jax_cpu_captures/{name}"))?;
    for e in std::fs::read_dir(&src).ok()?.flatten() {
        copy(&e.path(), &ws.join("jax").join(e.file_name()));
    }
    Some(ws.join("jax").join(format!("{name}.py")))
}

fn codes(diags: &[Value]) -> Vec<String> {
    diags
        .iter()
        .map(|d| d["code"].as_str().unwrap_or("").to_string())
        .collect()
}

fn has(code: &'static str) -> impl Fn(&[Value]) -> bool {
    move |d: &[Value]| d.iter().any(|x| x["code"] == code)
}

#[test]
fn no_donation_is_pinned_to_the_jit_line_with_a_working_fix() {
    let (_tmp, ws) = tempdir();
    let Some(py) = workspace_with("b_mlp_nodonate", &ws) else {
        return;
    };
    let capture = ws.join("jax/b_mlp_nodonate.xplane.pb");
    let mut lsp = Lsp::start(&ws, json!({}));
    let text = lsp.open(&py);

    let diags = lsp
        .diagnostics(&py, WAIT, has("JX005"))
        .unwrap_or_else(|| panic!("no JX005 on {}: {:?}", py.display(), lsp.messages()));
    let d = diags.iter().find(|d| d["code"] == "JX005").unwrap();
    // Line 57 of the program: `train_step_jit = jax.jit(train_step)`.
    assert_eq!(d["range"]["start"]["line"], 56, "{d}");
    assert_eq!(d["range"]["start"]["character"], 0);
    assert_eq!(d["source"], "memlsp");
    assert_eq!(d["severity"], 2, "JX005 is a waste with a fix: warning");
    assert_eq!(
        d["codeDescription"]["href"],
        memlsp::findings::Code::JX005.docs_url()
    );
    let msg = d["message"].as_str().unwrap();
    assert!(msg.contains("capture b_mlp_nodonate.xplane.pb"), "{msg}");
    assert!(msg.contains("jit_train_step"), "{msg}");
    assert_eq!(d["relatedInformation"][0]["location"]["uri"], uri(&capture));
    assert!(
        d["data"]["fixes"].as_array().is_some_and(|f| !f.is_empty()),
        "{d}"
    );

    // Hover: what is kept and why, each number labelled.
    let hover = lsp.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&py)}, "position": {"line": 56, "character": 5}}),
    );
    let md = hover["contents"]["value"].as_str().unwrap_or("");
    assert!(md.contains("**JX005"), "{md}");
    assert!(md.contains("capture `b_mlp_nodonate.xplane.pb`"), "{md}");
    assert!(
        md.contains("- *read*:") || md.contains("- *measured*:"),
        "{md}"
    );

    // Hints: the 40 MiB of activations on line 27, nothing for the 4-byte scalars of
    // lines 45 and 46 (a share of XLA:CPU's near-empty heap says nothing).
    let hints = lsp.hints(&py, 100);
    let on = |l: u64| hints.iter().find(|h| h["position"]["line"] == l).cloned();
    let h27 = on(26).unwrap_or_else(|| panic!("{hints:#?}"));
    assert!(
        h27["tooltip"]
            .as_str()
            .is_some_and(|t| t.starts_with("40.00 MiB in 3 blocks")),
        "{h27}"
    );
    assert!(on(44).is_none() && on(45).is_none(), "{hints:#?}");

    // The preferred quick fix, applied to the buffer, donates the parameters.
    let actions = lsp_support::actions(&mut lsp, &py, 56);
    let fix = actions
        .iter()
        .find(|a| a["isPreferred"] == true && a.get("edit").is_some())
        .unwrap_or_else(|| panic!("no preferred edit: {actions:#?}"));
    let edits = fix["edit"]["changes"][uri(&py)]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let fixed = apply_edits(&text, &edits);
    let line57 = fixed.lines().nth(56).unwrap();
    assert!(
        line57.starts_with("train_step_jit = jax.jit(train_step, donate_argnums=(0, 1))"),
        "{line57}"
    );
    assert_eq!(fixed.lines().count(), text.lines().count());

    // Once the line no longer matches the capture, no edit is offered, and the title says why.
    let edited = text.replace(
        "train_step_jit = jax.jit(train_step)",
        "train_step_jit = train_step",
    );
    lsp.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri(&py), "version": 2}, "contentChanges": [{"text": edited}]}),
    );
    let actions = lsp_support::actions(&mut lsp, &py, 56);
    assert!(!actions.is_empty());
    for a in &actions {
        assert!(a.get("edit").is_none(), "stale edit offered: {a}");
    }
    assert!(
        actions.iter().any(|a| a["disabled"]["reason"].is_string()),
        "{actions:#?}"
    );

    // Deleting the capture withdraws its diagnostics.
    std::fs::remove_file(&capture).unwrap();
    let t0 = Instant::now();
    let cleared = lsp.diagnostics(&py, Duration::from_secs(5), |d| d.is_empty());
    assert!(cleared.is_some(), "diagnostics not cleared after delete");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t0.elapsed()
    );
    assert!(lsp.errors().is_empty(), "{:?}", lsp.errors());
    lsp.shutdown();
}

#[test]
fn heap_peak_hints_and_attention_hover_on_the_softmax_line() {
    let (_tmp, ws) = tempdir();
    let Some(py) = workspace_with("e_attention_big", &ws) else {
        return;
    };
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&py);
    let hints = lsp.hints_until(&py, 200, |h| h.iter().any(|x| x["position"]["line"] == 30));
    // 832.12 MiB of the 935.12 MiB heap peak come from line 31 (xprof).
    let h31 = hints
        .iter()
        .find(|h| h["position"]["line"] == 30)
        .unwrap_or_else(|| panic!("no hint on line 31: {hints:#?}"));
    assert_eq!(h31["label"], "89% of heap peak", "{h31}");
    let line31 = std::fs::read_to_string(&py)
        .unwrap()
        .lines()
        .nth(30)
        .unwrap()
        .to_string();
    assert_eq!(h31["position"]["character"], line31.encode_utf16().count());
    let tip = h31["tooltip"].as_str().unwrap_or("");
    assert!(tip.contains("832.12 MiB"), "{tip}");
    assert!(tip.contains("e_attention_big.xplane.pb"), "{tip}");

    // Turning hints off in the settings takes effect on didChangeConfiguration.
    lsp.settings = json!({"inlayHints": {"enable": false}});
    lsp.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": null}),
    );
    let t0 = Instant::now();
    loop {
        let hints = lsp.hints(&py, 200);
        if hints.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "hints still on: {hints:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    lsp.shutdown();
}

#[test]
fn path_mappings_win_over_suffix_matching() {
    let (_tmp, ws) = tempdir();
    let Some(decoy) = workspace_with("b_mlp_nodonate", &ws) else {
        return;
    };
    let mapped = ws.join("mapped/b_mlp_nodonate.py");
    copy(&decoy, &mapped);
    let mut lsp = Lsp::start(
        &ws,
        json!({"pathMappings": {"/srv/jaxdemo": "${workspaceFolder}/mapped"}}),
    );
    let diags = lsp.diagnostics(&mapped, WAIT, has("JX005"));
    assert!(diags.is_some(), "{:?}", lsp.messages());
    lsp.idle(Duration::from_millis(300));
    let on_decoy = lsp.seen.iter().any(|m| {
        m["method"] == "textDocument/publishDiagnostics"
            && m["params"]["uri"] == uri(&decoy)
            && !codes(m["params"]["diagnostics"].as_array().unwrap()).is_empty()
    });
    assert!(!on_decoy, "the suffix match was used despite pathMappings");
    lsp.shutdown();
}

#[test]
fn a_capture_written_in_pieces_is_reported_once_complete() {
    let (_tmp, ws) = tempdir();
    let Some(src) = lsp_support::shared("jax_cpu_captures/b_mlp_nodonate") else {
        return;
    };
    let py = ws.join("jax/b_mlp_nodonate.py");
    copy(&src.join("b_mlp_nodonate.py"), &py);
    let bytes = std::fs::read(src.join("b_mlp_nodonate.xplane.pb")).unwrap();
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&py);
    lsp.idle(Duration::from_millis(500));

    // Like a slow writer: 6 pieces, 250 ms apart.
    let target = ws.join("jax/run.xplane.pb");
    let mut f = std::fs::File::create(&target).unwrap();
    for (i, chunk) in bytes.chunks(bytes.len().div_ceil(6)).enumerate() {
        use std::io::Write;
        if i > 0 {
            lsp.idle(Duration::from_millis(250));
        }
        f.write_all(chunk).unwrap();
        f.flush().unwrap();
    }
    drop(f);
    let last_byte = Instant::now();
    let diags = lsp.diagnostics(&py, Duration::from_secs(10), has("JX005"));
    let took = last_byte.elapsed();
    assert!(diags.is_some(), "{:?}", lsp.messages());
    assert!(
        took < Duration::from_secs(2),
        "diagnostics {took:?} after the last byte"
    );
    assert!(
        lsp.errors().is_empty(),
        "reported while being written: {:?}",
        lsp.errors()
    );
    assert!(
        !lsp.messages()
            .iter()
            .any(|m| m.contains("run.xplane.pb") && m.contains("cannot read")),
        "{:?}",
        lsp.messages()
    );
    lsp.shutdown();
}

#[test]
fn two_captures_of_one_line_merge_and_ignored_dirs_are_skipped() {
    let (_tmp, ws) = tempdir();
    let Some(py) = workspace_with("b_mlp_nodonate", &ws) else {
        return;
    };
    let first = ws.join("jax/b_mlp_nodonate.xplane.pb");
    // Beside the program, like the first: the engine reads the program to find the jit line.
    let second = ws.join("jax/later.xplane.pb");
    // The newer capture has a later mtime.
    std::thread::sleep(Duration::from_millis(20));
    copy(&first, &second);
    // Captures under .venv, node_modules and .gitignored folders are not the user's.
    copy(&first, &ws.join(".venv/lib/other.xplane.pb"));
    copy(&first, &ws.join("node_modules/x/other.xplane.pb"));
    std::fs::write(ws.join(".gitignore"), "scratch/\n").unwrap();
    copy(&first, &ws.join("scratch/other.xplane.pb"));

    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&py);
    let diags = lsp
        .diagnostics(&py, WAIT, |d| {
            d.iter().any(|x| {
                x["code"] == "JX005" && x["message"].as_str().is_some_and(|m| m.contains("also in"))
            })
        })
        .unwrap_or_else(|| panic!("no merged JX005: {:?}", lsp.messages()));
    let jx: Vec<&Value> = diags.iter().filter(|d| d["code"] == "JX005").collect();
    assert_eq!(jx.len(), 1, "{jx:#?}");
    let msg = jx[0]["message"].as_str().unwrap();
    assert!(
        msg.contains("capture later.xplane.pb") && msg.contains("also in b_mlp_nodonate.xplane.pb"),
        "{msg}"
    );
    lsp.idle(Duration::from_millis(500));
    let from_ignored = lsp
        .seen
        .iter()
        .any(|m| m.to_string().contains("other.xplane.pb"));
    assert!(!from_ignored, "a capture in an ignored folder was read");
    lsp.shutdown();
}

#[test]
fn remat_and_device_get_fixes_edit_the_buffer() {
    let (_tmp, ws) = tempdir();
    let Some(attn) = workspace_with("e_attention_big", &ws) else {
        return;
    };
    let Some(grads) = workspace_with("d_grads_kept", &ws) else {
        return;
    };
    let mut lsp = Lsp::start(&ws, json!({}));

    // JX002 on the softmax line: `@jax.checkpoint` on the function that owns it.
    let text = lsp.open(&attn);
    let d = lsp
        .diagnostics(&attn, WAIT, has("JX002"))
        .unwrap_or_else(|| panic!("no JX002: {:?}", lsp.messages()));
    let jx2 = d.iter().find(|x| x["code"] == "JX002").unwrap();
    assert_eq!(jx2["range"]["start"]["line"], 30);
    let actions = lsp_support::actions(&mut lsp, &attn, 30);
    let remat = actions
        .iter()
        .find(|a| {
            a["title"]
                .as_str()
                .is_some_and(|t| t.contains("jax.checkpoint"))
        })
        .unwrap_or_else(|| panic!("{actions:#?}"));
    let edits = remat["edit"]["changes"][uri(&attn)]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let fixed = apply_edits(&text, &edits);
    let lines: Vec<&str> = fixed.lines().collect();
    let def = lines
        .iter()
        .position(|l| l.starts_with("def attention("))
        .unwrap();
    assert_eq!(lines[def - 1], "@jax.checkpoint", "{fixed}");
    assert_eq!(lines.len(), text.lines().count() + 1);

    // JX004 on the append: keep a host copy instead of the device arrays.
    let text = lsp.open(&grads);
    lsp.diagnostics(&grads, WAIT, has("JX004"))
        .unwrap_or_else(|| panic!("no JX004: {:?}", lsp.messages()));
    let actions = lsp_support::actions(&mut lsp, &grads, 50);
    let get = actions
        .iter()
        .find(|a| a.get("edit").is_some())
        .unwrap_or_else(|| panic!("{actions:#?}"));
    let edits = get["edit"]["changes"][uri(&grads)]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let fixed = apply_edits(&text, &edits);
    assert!(
        fixed
            .lines()
            .nth(50)
            .unwrap()
            .starts_with("        grad_history.append(jax.device_get(grads))"),
        "{}",
        fixed.lines().nth(50).unwrap()
    );
    lsp.shutdown();
}
