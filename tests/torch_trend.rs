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

/// `report --trend A B C`: files named on the command line, oldest first.
fn trend(files: &[&str], format: &str) -> common::Run {
    let mut args = vec!["report", "--trend"];
    args.extend_from_slice(files);
    args.extend_from_slice(&["--format", format]);
    let r = common::memlsp(&args, Path::new(env!("CARGO_MANIFEST_DIR")));
    assert_eq!(r.code, 0, "{}", r.stderr);
    r
}

fn pt011(doc: &serde_json::Value) -> usize {
    doc["captures"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "PT011")
        .count()
}

#[test]
fn a_list_of_files_is_a_series_in_the_order_given() {
    let dir = "fixtures/torch/trend_growing";
    let files: Vec<String> = [5, 10, 15]
        .iter()
        .map(|k| format!("{dir}/snapshot_step{k}.pickle"))
        .collect();
    let names: Vec<&str> = files.iter().map(String::as_str).collect();
    let doc = trend(&names, "json").json();
    let t = &doc["captures"][0]["torch"]["trend"];
    assert_eq!(
        t["steps"],
        serde_json::json!([5, 10, 15]),
        "steps from the names"
    );
    assert_eq!(t["sites"][0]["grows_every_step"], true);
    assert_eq!(
        pt011(&doc),
        1,
        "the series' leak verdict, as for the folder"
    );
    // The flat run named file by file: no verdict.
    let flat: Vec<String> = [5, 10, 15]
        .iter()
        .map(|k| format!("fixtures/torch/trend_flat/snapshot_step{k}.pickle"))
        .collect();
    let names: Vec<&str> = flat.iter().map(String::as_str).collect();
    assert_eq!(pt011(&trend(&names, "json").json()), 0);
}

#[test]
fn trend_needs_three_files_and_report_without_it_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let a = "fixtures/torch/trend_growing/snapshot_step5.pickle";
    let b = "fixtures/torch/trend_growing/snapshot_step10.pickle";
    let r = common::memlsp(&["report", "--trend", a, b], root);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("three or more"), "{}", r.stderr);
    let r = common::memlsp(&["report", a, b], root);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("--trend A B C"), "{}", r.stderr);
}

/// The real series of `../shared` (one program at context 128, 256, 512): every activation
/// site's bytes grow with the context, but its block count does not — the trend shows the
/// growth and gives no leak verdict. The same snapshot three times is flat: no change at all.
#[test]
fn the_real_series_named_file_by_file_gets_its_trend_and_no_leak_verdict() {
    let Some(dir) = common::shared("torch_snapshots/series/xiaolin2004_forward_only_fp32") else {
        return;
    };
    let f = |n: u32| dir.join(format!("ctx{n}.pickle")).display().to_string();
    let (a, b, c) = (f(128), f(256), f(512));
    let doc = trend(&[&a, &b, &c], "json").json();
    let t = &doc["captures"][0]["torch"]["trend"];
    assert_eq!(
        t["steps"],
        serde_json::json!([1, 2, 3]),
        "no step in the names: their order"
    );
    assert_eq!(
        t["allocated_bytes"],
        serde_json::json!([1221137408u64, 2014641152u64, 4108372992u64])
    );
    let soft = t["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["site"]
                .as_str()
                .unwrap()
                .ends_with("nn_utils.py:7:softmax")
        })
        .expect("softmax's site in the trend");
    assert_eq!(
        soft["bytes"],
        serde_json::json!([39092224u64, 151584768u64, 605159424u64])
    );
    assert_eq!(soft["grows_every_step"], false, "its blocks do not grow");
    assert_eq!(pt011(&doc), 0);
    let text = trend(&[&a, &b, &c], "text").stdout;
    assert!(
        text.contains("Trend over 3 snapshots (step 1, step 2, step 3)"),
        "{text}"
    );
    assert!(text.contains("no leak verdict"), "{text}");
    let flat = trend(&[&a, &a, &a], "json").json();
    let t = &flat["captures"][0]["torch"]["trend"];
    assert_eq!(t["sites"], serde_json::json!([]), "nothing changed");
    assert_eq!(pt011(&flat), 0);
}
