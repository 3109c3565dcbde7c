//! Quick fixes on a real forward-only capture (the `xiaolin2004` series at context 512): the
//! editor offers `logits = None` before the forward that rebinds the output (PT005, two graphs
//! alive at the peak) and, as a suggestion, the fused attention call on the line that calls the
//! hand-written attention (PT018). The capture is real; the Python files are stand-ins at the
//! recorded paths with the recorded lines.

mod lsp_support;

use std::path::Path;
use std::time::Duration;

use lsp_support::{Lsp, actions, applied, copy, tempdir, titled};
use serde_json::json;

const SNAPSHOT: &str = "torch_snapshots/series/xiaolin2004_forward_only_fp32/ctx512.pickle";

/// A file of `n` lines whose line `at` (1-based) is `text` and whose earlier lines open `prefix`.
fn write(path: &Path, n: usize, prefix: &[&str], at: usize, text: &str) {
    let mut lines: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    while lines.len() < n {
        lines.push(String::new());
    }
    lines[at - 1] = text.to_string();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[test]
fn drop_the_previous_output_and_use_fused_attention_on_a_real_forward_capture() {
    let Some(src) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    copy(&src, &ws.join("runs/ctx512.pickle"));
    // The recorded frames: scripts/benchmark.py:115 in `benchmark` runs the forward and drops
    // the previous graph; cs336_systems/model.py:533 in `forward` calls the attention.
    let bench = ws.join("scripts/benchmark.py");
    let bench_head = [
        "import torch",
        "",
        "",
        "def benchmark(model, x, steps):",
        "    for _ in range(steps):",
    ];
    let mut head: Vec<&str> = bench_head.to_vec();
    head.extend(std::iter::repeat_n("        pass", 109));
    write(&bench, 160, &head, 115, "        logits = model(x)");
    let model = ws.join("cs336_systems/model.py");
    write(
        &model,
        540,
        &[
            "import torch",
            "from cs336_systems.nn_utils import scaled_dot_product_attention",
        ],
        533,
        "        attn = scaled_dot_product_attention(q, k, v, mask)",
    );
    let mut lsp = Lsp::start(&ws, json!({}));

    let text = lsp.open(&bench);
    let diags = lsp
        .diagnostics(&bench, Duration::from_secs(60), |d| {
            d.iter().any(|x| x["code"] == "PT005")
        })
        .unwrap_or_else(|| panic!("no PT005: {:?}", lsp.messages()));
    let pt005 = diags.iter().find(|d| d["code"] == "PT005").unwrap();
    assert_eq!(pt005["range"]["start"]["line"], 114);
    let a = actions(&mut lsp, &bench, 114);
    let drop = titled(&a, "`del out`");
    assert_ne!(drop["isPreferred"], true, "{drop}");
    let fixed = applied(&text, drop, &bench);
    let lines: Vec<&str> = fixed.lines().collect();
    assert_eq!(
        lines[114],
        "        logits = None  # drop the previous output and its graph before the next forward"
    );
    assert_eq!(lines[115], "        logits = model(x)");
    assert_eq!(lines.len(), text.lines().count() + 1);

    let text = lsp.open(&model);
    let diags = lsp
        .diagnostics(&model, Duration::from_secs(60), |d| {
            d.iter().any(|x| x["code"] == "PT018")
        })
        .unwrap_or_else(|| panic!("no PT018: {:?}", lsp.messages()));
    let pt018 = diags.iter().find(|d| d["code"] == "PT018").unwrap();
    assert_eq!(pt018["range"]["start"]["line"], 532);
    assert!(
        pt018["message"]
            .as_str()
            .is_some_and(|m| m.contains("scaled_dot_product_attention") && m.contains("1.12 GiB")),
        "{pt018}"
    );
    let a = actions(&mut lsp, &model, 532);
    let sdpa = titled(&a, "Replace the hand-written attention");
    assert_ne!(
        sdpa["isPreferred"], true,
        "a suggestion, never preferred: {sdpa}"
    );
    assert!(
        sdpa["title"]
            .as_str()
            .is_some_and(|t| t.contains("(simulated)")),
        "{sdpa}"
    );
    let fixed = applied(&text, sdpa, &model);
    assert_eq!(
        fixed.lines().nth(532),
        Some("        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, mask)")
    );
    assert!(lsp.errors().is_empty(), "{:?}", lsp.errors());
    lsp.shutdown();
}
