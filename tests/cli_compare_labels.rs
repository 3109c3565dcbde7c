//! `memlsp compare --label NAME=SNAPSHOT …` on real snapshots: one program recorded at context
//! 128 and 512 (`series/xiaolin2004_forward_only_fp32`), side by side with deltas against the
//! first label, in text, JSON and HTML; the rank comparison of `compare SUMMARY…` is unchanged.

mod common;

use std::path::Path;

fn series(name: &str) -> Option<std::path::PathBuf> {
    common::shared(&format!(
        "torch_snapshots/series/xiaolin2004_forward_only_fp32/{name}"
    ))
}

fn compare(a: &Path, b: &Path, format: &str) -> common::Run {
    let la = format!("ctx 128={}", a.display());
    let lb = format!("ctx512={}", b.display());
    let r = common::memlsp(
        &[
            "compare",
            "--label",
            &la,
            "--label",
            &lb,
            "--category",
            "attention=attention",
            "--format",
            format,
        ],
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    r
}

#[test]
fn two_context_lengths_side_by_side_in_json() {
    let (Some(a), Some(b)) = (series("ctx128.pickle"), series("ctx512.pickle")) else {
        return;
    };
    let doc = compare(&a, &b, "json").json();
    let c = &doc["labelled_comparison"];
    assert_eq!(c["labels"], serde_json::json!(["ctx 128", "ctx512"]));
    // The same numbers `report` gives each snapshot alone.
    let report = |p: &Path| {
        common::memlsp(
            &["report", common::arg(p), "--format", "json"],
            Path::new(env!("CARGO_MANIFEST_DIR")),
        )
        .json()
    };
    let (ra, rb) = (report(&a), report(&b));
    let reserved = |d: &serde_json::Value| {
        d["captures"][0]["torch"]["totals"]["reserved_bytes"]
            .as_i64()
            .unwrap()
    };
    let peak = |d: &serde_json::Value| {
        d["captures"][0]["torch"]["timeline"][0]["live_bytes_reconstructed"]["peak"]
            .as_i64()
            .unwrap()
    };
    let row = |name: &str| {
        c["totals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()
            .clone()
    };
    let r = row("reserved bytes");
    assert_eq!(
        r["values"],
        serde_json::json!([reserved(&ra), reserved(&rb)])
    );
    assert_eq!(r["deltas"][1], reserved(&rb) - reserved(&ra));
    assert_eq!(r["deltas"][0], 0);
    let p = row("peak live bytes");
    assert_eq!(p["values"], serde_json::json!([peak(&ra), peak(&rb)]));
    assert!(
        peak(&rb) > 3 * peak(&ra),
        "four times the context: more than three times the peak"
    );
    // Categories at the peak, by role and by the user's regex, and the stages.
    let names = |k: &str| -> Vec<String> {
        c[k].as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(names("categories").contains(&"activation".to_string()));
    assert!(names("custom_categories").contains(&"attention".to_string()));
    assert!(!names("stages").is_empty());
    assert!(!names("sites").is_empty());
}

#[test]
fn text_and_html_show_labels_and_deltas() {
    let (Some(a), Some(b)) = (series("ctx128.pickle"), series("ctx512.pickle")) else {
        return;
    };
    let text = compare(&a, &b, "text").stdout;
    assert!(text.starts_with("ctx 128: "), "{text}");
    assert!(text.contains("Δ vs ctx 128"), "{text}");
    let peak = text
        .lines()
        .find(|l| l.contains("peak live bytes"))
        .unwrap();
    assert!(peak.contains('+') && peak.ends_with("[measured]"), "{peak}");
    assert!(text.contains("Categories at the peak (--category)"));
    let html = compare(&a, &b, "html").stdout;
    assert!(html.starts_with("<!doctype html>"));
    assert!(html.contains("<th>Δ vs ctx 128</th>"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "self-contained"
    );
}

#[test]
fn bad_labels_are_one_line() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    common::memlsp(&["compare", "--label", "nolabel"], dir)
        .assert_one_line_error("is not NAME=SNAPSHOT");
    common::memlsp(
        &[
            "compare",
            "--label",
            "a=fixtures/torch/pt005_activations.pickle",
        ],
        dir,
    )
    .assert_one_line_error("two or more labelled snapshots");
    common::memlsp(
        &[
            "compare",
            "--label",
            "a=fixtures/torch/pt005_activations.pickle",
            "--label",
            "b=/nonexistent.pickle",
        ],
        dir,
    )
    .assert_one_line_error("nonexistent");
}
