//! Captures copied in slowly — many small writes with pauses longer than the server's settle time
//! (1 s) — are reported once, correctly, after the last write, and never as unreadable in
//! between. (`lsp_torch.rs` / `lsp_jax.rs` cover quick writers with 200–250 ms pauses.)

mod lsp_support;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use lsp_support::{Lsp, copy, tempdir, uri};
use serde_json::{Value, json};

/// Write `bytes` to `target` in `pieces` writes, `pause` apart, pumping the server meanwhile.
/// Returns the number of messages seen before the last write, and the inlay hints `probe` had
/// between writes (there must be none while the capture is incomplete).
fn slow_copy(
    lsp: &mut Lsp,
    bytes: &[u8],
    target: &Path,
    pieces: usize,
    pause: Duration,
    probe: &Path,
) -> (usize, Vec<Value>) {
    let mut early_hints = Vec::new();
    let mut f = std::fs::File::create(target).unwrap();
    let chunks: Vec<&[u8]> = bytes.chunks(bytes.len().div_ceil(pieces)).collect();
    let last = chunks.len() - 1;
    let mut before_last = 0;
    for (i, chunk) in chunks.into_iter().enumerate() {
        if i == last {
            before_last = lsp.seen.len();
        }
        // Several small writes per piece, like a buffered writer.
        for part in chunk.chunks(4096) {
            f.write_all(part).unwrap();
        }
        f.flush().unwrap();
        if i != last {
            lsp.idle(pause);
            early_hints.extend(lsp.hints(probe, 450));
        }
    }
    (before_last, early_hints)
}

fn complaints_about(msgs: &[Value], name: &str) -> Vec<String> {
    msgs.iter()
        .filter(|m| m["method"] == "window/showMessage" || m["method"] == "window/logMessage")
        .filter_map(|m| m["params"]["message"].as_str())
        .filter(|s| s.contains(name))
        .map(str::to_string)
        .collect()
}

#[test]
fn an_xplane_copied_with_one_second_pauses_is_reported_once_after_the_last_write() {
    let (_tmp, ws) = tempdir();
    let Some(src) = lsp_support::shared("jax_cpu_captures/b_mlp_nodonate") else {
        return;
    };
    let py = ws.join("jax/b_mlp_nodonate.py");
    copy(&src.join("b_mlp_nodonate.py"), &py);
    let bytes = std::fs::read(src.join("b_mlp_nodonate.xplane.pb")).unwrap();
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&py);
    lsp.idle(Duration::from_millis(300));

    let target = ws.join("jax/slow.xplane.pb");
    let (before_last, early) = slow_copy(
        &mut lsp,
        &bytes,
        &target,
        5,
        Duration::from_millis(1200),
        &py,
    );
    let last_byte = Instant::now();
    assert!(early.is_empty(), "hints from a partial capture: {early:?}");
    let during: Vec<Value> = lsp.seen[..before_last].to_vec();
    let published_early = during.iter().any(|m| {
        m["method"] == "textDocument/publishDiagnostics"
            && m["params"]["uri"] == uri(&py).as_str()
            && m["params"]["diagnostics"]
                .as_array()
                .is_some_and(|d| !d.is_empty())
    });
    assert!(!published_early, "a partial capture was published");
    assert!(
        complaints_about(&during, "slow.xplane.pb").is_empty(),
        "reported while being written: {:?}",
        complaints_about(&during, "slow.xplane.pb")
    );
    let diags = lsp.diagnostics(&py, Duration::from_secs(15), |d| {
        d.iter().any(|x| x["code"] == "JX005")
    });
    assert!(diags.is_some(), "{:?}", lsp.messages());
    assert!(
        last_byte.elapsed() < Duration::from_secs(5),
        "{:?}",
        last_byte.elapsed()
    );
    lsp.idle(Duration::from_millis(1500));
    assert!(
        complaints_about(&lsp.seen, "slow.xplane.pb").is_empty(),
        "{:?}",
        lsp.messages()
    );
    lsp.shutdown();
}

#[test]
fn a_snapshot_copied_with_one_second_pauses_is_quiet_until_complete() {
    let Some(src) =
        lsp_support::shared("torch_snapshots/real/kkaitlyn111__memory_ctx128_fullstep.pickle")
    else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let opt = ws.join("cs336_basics/optimizers.py");
    std::fs::create_dir_all(opt.parent().unwrap()).unwrap();
    let text: String = (1..=450)
        .map(|i| format!("        s_{i} = 0  # line {i}\n"))
        .collect();
    std::fs::write(&opt, text).unwrap();
    let bytes = std::fs::read(&src).unwrap();
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&opt);
    lsp.idle(Duration::from_millis(300));

    let target = ws.join("slow_snapshot.pickle");
    let (before_last, early) = slow_copy(
        &mut lsp,
        &bytes,
        &target,
        5,
        Duration::from_millis(1200),
        &opt,
    );
    assert!(early.is_empty(), "hints from a partial snapshot: {early:?}");
    let during: Vec<Value> = lsp.seen[..before_last].to_vec();
    assert!(
        complaints_about(&during, "slow_snapshot.pickle").is_empty(),
        "reported while being written: {:?}",
        complaints_about(&during, "slow_snapshot.pickle")
    );
    let h = lsp.hints_until(&opt, 450, |h| {
        h.iter().any(|x| x["label"] == "25% live memory")
    });
    assert!(
        h.iter().any(|x| x["label"] == "25% live memory"),
        "{h:#?} {:?}",
        lsp.messages()
    );
    lsp.idle(Duration::from_millis(1500));
    assert!(
        complaints_about(&lsp.seen, "slow_snapshot.pickle").is_empty(),
        "{:?}",
        lsp.messages()
    );
    lsp.shutdown();
}
