//! Trend over three snapshots of one run (fixtures made by `fixtures/torch/gen_fixtures.py`
//! `trend()`): a gradient copy kept per step grows at every snapshot — the series' PT011 with
//! its slope; the same run freeing it is flat — no trend verdict, no PT011.

mod common;

use std::path::Path;

fn report(dir: &str, format: &str) -> common::Run {
    let r = common::memlsp(
        &["report", dir, "--format", format],
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    r
}

#[test]
fn a_site_growing_every_step_gets_the_series_leak_verdict() {
    let doc = report("fixtures/torch/trend_growing", "json").json();
    let c = &doc["captures"][0];
    let t = &c["torch"]["trend"];
    assert_eq!(t["steps"], serde_json::json!([5, 10, 15]));
    let site = &t["sites"][0];
    assert_eq!(
        site["site"],
        "/home/alice/project/train_leak.py:124:train_with_cache"
    );
    assert_eq!(site["bytes"], serde_json::json!([204800, 409600, 614400]));
    assert_eq!(site["blocks"], serde_json::json!([5, 10, 15]));
    assert_eq!(site["slope_bytes_per_step"], 40960.0);
    assert_eq!(site["grows_every_step"], true);
    let pt011: Vec<&serde_json::Value> = c["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "PT011")
        .collect();
    assert_eq!(pt011.len(), 1, "{pt011:#?}");
    let m = pt011[0]["message"].as_str().unwrap();
    assert!(
        m.contains("grew at every one of 3 snapshots (steps 5, 10, 15)"),
        "{m}"
    );
    assert_eq!(pt011[0]["line"], 124);
    assert_eq!(
        pt011[0]["file"], "fixtures/torch/train_leak.py",
        "located in the workspace"
    );
    let text = report("fixtures/torch/trend_growing", "text").stdout;
    assert!(
        text.contains("Trend over 3 snapshots (step 5, step 10, step 15)"),
        "{text}"
    );
    assert!(
        text.contains("slope +40.00 KiB per step [inferred]"),
        "{text}"
    );
}

#[test]
fn a_flat_series_gets_no_verdict() {
    let doc = report("fixtures/torch/trend_flat", "json").json();
    let c = &doc["captures"][0];
    let t = &c["torch"]["trend"];
    assert_eq!(t["steps"], serde_json::json!([5, 10, 15]));
    assert!(
        t["sites"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["grows_every_step"] == false),
        "{t:#}"
    );
    assert!(
        !c["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["code"] == "PT011")
    );
    let text = report("fixtures/torch/trend_flat", "text").stdout;
    assert!(text.contains("no site grew at every snapshot [measured]: no leak verdict"));
}
