//! The PyTorch views in the editor: "Show memory timeline" (`memlsp.timeline`) draws the same
//! page as `report --format html` — recorded stage bands, live memory at the peak by role and by
//! the `memlsp.categories` setting (as `report --category`), compile regions, the trace search —
//! on a real snapshot with `external_annotations`; a bad category is a settings message.

mod lsp_support;
#[path = "support/page.rs"]
mod page;

use std::time::Duration;

use lsp_support::{Lsp, copy, tempdir};
use serde_json::json;

const NIU: &str =
    "torch_snapshots/real/NiuHuangxiaozi__16edf316_forward_and_backward_memory_snapshot_150.pickle";

#[test]
fn the_timeline_page_has_stages_categories_and_the_trace_search() {
    let Some(src) = lsp_support::shared(NIU) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let cap = ws.join("runs/niu_snapshot.pickle");
    copy(&src, &cap);
    let mut lsp = Lsp::start(
        &ws,
        json!({"categories": ["optimizer=torch/optim/", "mine=NIU"]}),
    );
    // The server asks for its settings after `initialized`: answered while idling.
    lsp.idle(Duration::from_millis(1500));
    let page = lsp.request(
        "workspace/executeCommand",
        json!({"command": "memlsp.timeline", "arguments": [{"capture": cap.to_string_lossy()}]}),
    );
    let html = page["html"].as_str().unwrap_or_else(|| panic!("{page}"));
    assert!(html.contains("id: \"trace-search\""), "the search box");
    let data = page::page_data(html);
    let t = &data["captures"][0]["torch"];
    let bands = t["devices"][0]["stages"].as_array().expect("stage bands");
    assert!(
        bands
            .iter()
            .any(|b| b.to_string().contains("Optimizer.step#NIUAdam.step")),
        "the recorded optimizer step is a band: {bands:?}"
    );
    // The search box searches the device's largest allocations, each with its stage.
    let index = &t["trace_index"][0];
    let entries = index["entries"]
        .as_array()
        .expect("the search's allocations");
    let made = index["allocations"].as_u64().unwrap();
    assert!(
        !entries.is_empty() && entries.len() as u64 <= made,
        "{} of {made} allocations searchable",
        entries.len()
    );
    // In trace order, each with its bytes.
    let at: Vec<u64> = entries.iter().map(|e| e[0].as_u64().unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}");
    assert!(entries.iter().all(|e| e[1].as_u64().unwrap() > 0));
    assert!(
        index["stages"].as_array().unwrap().iter().any(|s| s
            .as_str()
            .is_some_and(|s| s.contains("Optimizer.step#NIUAdam.step"))),
        "{index}"
    );
    let custom = &t["categories"][0]["custom"];
    let names: Vec<&str> = custom
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["optimizer", "mine", "uncategorized"], "{custom}");
    // The same breakdown as the command line gives with the same categories.
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_memlsp"))
        .args(["report"])
        .arg(&cap)
        .args([
            "--category",
            "optimizer=torch/optim/",
            "--category",
            "mine=NIU",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let cli: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(t["categories"], cli["captures"][0]["torch"]["categories"]);
    assert_eq!(t["compile_contexts"]["recorded"], false);
    let idx = &t["trace_index"][0];
    assert!(
        idx["entries"].as_array().unwrap().len() > 100,
        "the search's allocations"
    );

    // A category that is not NAME=REGEX: one settings message, the others keep working.
    lsp.settings = json!({"categories": ["broken"]});
    lsp.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": null}),
    );
    lsp.idle(Duration::from_millis(500));
    assert!(
        lsp.messages()
            .iter()
            .any(|m| m.contains("categories") && m.contains("NAME=REGEX")),
        "{:?}",
        lsp.messages()
    );
    lsp.shutdown();
}
