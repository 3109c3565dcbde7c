//! Categories of live memory at the peak on real snapshots: by role (inferred from the stacks)
//! and by `--category NAME=REGEX`, in text, JSON and the page.

mod common;

use std::path::Path;

use serde_json::Value;

const NIU: &str = "NiuHuangxiaozi__16edf316_forward_and_backward_memory_snapshot_150.pickle";

fn run(args: &[&str]) -> common::Run {
    let r = common::memlsp(args, Path::new(env!("CARGO_MANIFEST_DIR")));
    assert_eq!(r.code, 0, "{}", r.stderr);
    r
}

const CATS: [&str; 4] = [
    "--category",
    "optim=optimizer/",
    "--category",
    "model=cs336_basics/modules/",
];

/// The peak of NiuHuangxiaozi's step 2: activations, the custom Adam's state, and gradients —
/// every byte of the live set in exactly one role and one category, the sums equal to the live
/// set PT005 reports.
#[test]
fn niu_peak_by_role_and_by_regex_in_json() {
    let Some(p) = common::shared(&format!("torch_snapshots/real/{NIU}")) else {
        return;
    };
    let mut args = vec!["report", common::arg(&p), "--format", "json"];
    args.extend(CATS);
    let doc = run(&args).json();
    let c = &doc["captures"][0]["torch"]["categories"][0];
    assert_eq!(c["at"], "peak");
    assert_eq!(c["index"], 4575, "the timeline's peak entry");
    let total = c["total_bytes"].as_u64().unwrap();
    let sum = |k: &str| -> u64 {
        c[k].as_array()
            .unwrap()
            .iter()
            .map(|p| p["bytes"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(sum("by_role"), total);
    assert_eq!(sum("custom"), total);
    let role = |n: &str| {
        c["by_role"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == n)
            .map(|p| p["bytes"].as_u64().unwrap())
    };
    // PT005's "511.31 MiB of 893.63 MiB live at the peak" is the activation share of this set.
    assert_eq!(role("activation"), Some(536_145_300));
    assert_eq!(total, 937_035_160);
    let custom: Vec<(&str, u64)> = c["custom"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        custom.iter().map(|c| c.0).collect::<Vec<_>>(),
        vec!["optim", "model", "uncategorized"]
    );
    assert!(custom[0].1 > 0 && custom[1].1 > 0, "{custom:?}");
    assert_eq!(c["custom"][0]["pattern"], "optimizer/");
}

#[test]
fn categories_in_text_and_on_the_page() {
    let Some(p) = common::shared(&format!("torch_snapshots/real/{NIU}")) else {
        return;
    };
    let mut args = vec!["report", common::arg(&p)];
    args.extend(CATS);
    let text = run(&args).stdout;
    assert!(
        text.contains("Categories of live memory at the peak"),
        "{text}"
    );
    assert!(text.contains("  device 0 at the trace's peak (after entry 4575): 893.63 MiB"));
    assert!(text.contains("    optim /optimizer//"), "{text}");
    assert!(text.contains("    uncategorized"), "{text}");
    args.extend(["--format", "html"]);
    let html = run(&args).stdout;
    let start = html
        .find(r#"<script id="memlsp-data" type="application/json">"#)
        .unwrap()
        + r#"<script id="memlsp-data" type="application/json">"#.len();
    let end = start + html[start..].find("</script>").unwrap();
    let data: Value = serde_json::from_str(&html[start..end].replace("<\\/", "</")).unwrap();
    let c = &data["captures"][0]["torch"]["categories"][0];
    assert_eq!(c["custom"][1]["name"], "model");
    assert!(html.contains("Live memory by --category"));
}

/// A snapshot without a trace is broken down at the dump; without `--category` only by role.
#[test]
fn a_snapshot_without_trace_is_broken_down_at_the_dump() {
    let Some(p) = common::shared("torch_snapshots/real/Maphsge4__bdf4fe2e_snapshot.pickle") else {
        return;
    };
    let doc = run(&["report", common::arg(&p), "--format", "json"]).json();
    let cats = doc["captures"][0]["torch"]["categories"]
        .as_array()
        .unwrap();
    assert!(!cats.is_empty());
    for c in cats {
        assert_eq!(c["at"], "snapshot");
        assert!(c["custom"].as_array().unwrap().is_empty());
    }
    let allocated: u64 = cats
        .iter()
        .map(|c| c["total_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(
        Some(allocated),
        doc["captures"][0]["torch"]["totals"]["allocated_bytes"]
            .as_u64()
            .map(
                |a| a + doc["captures"][0]["torch"]["totals"]["pending_free_bytes"]
                    .as_u64()
                    .unwrap()
            )
    );
}

#[test]
fn a_bad_category_is_one_line() {
    let r = common::memlsp(
        &["report", "x.pickle", "--category", "a=("],
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
    r.assert_one_line_error("is not a regular expression");
}
