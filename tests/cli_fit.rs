//! `memlsp fit` and `memlsp predict` as a user runs them: the JSON keys scripts read, the text,
//! the exit status, and the one-line errors (docs/FITS.md).

mod common;

use std::path::Path;

fn cwd() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn fit_json_names_the_constructor_sun_oom_at_its_recorded_capacity() {
    let Some(f) = common::shared("torch_snapshots/real/Constructor-Sun__memory_snapshot.pickle")
    else {
        return;
    };
    let f = f.to_string_lossy().into_owned();
    // Reserved at the OOM + the free bytes it records.
    let r = common::memlsp(
        &["fit", &f, "--on", "84298432512", "--format", "json"],
        cwd(),
    );
    assert_eq!(r.code, 1, "does not fit: exit 1; {}", r.stderr);
    let doc = r.json();
    let fits = doc["captures"][0]["torch"]["fit"]
        .as_array()
        .expect("captures[].torch.fit");
    let d1 = fits.iter().find(|d| d["device"] == 1).expect("device 1");
    assert_eq!(d1["validated"], true);
    assert_eq!(d1["label"], "simulated");
    let needs = d1["needs_bytes"].as_u64().unwrap();
    assert!(needs > 84_298_432_512 && needs % (2 << 20) == 0, "{needs}");
    assert!(d1["needs_bytes_expandable"].as_u64().is_some());
    let on = &d1["on"];
    assert_eq!(on["capacity_bytes"], 84_298_432_512u64);
    assert_eq!(on["fits"], false);
    let ff = &on["first_failure"];
    assert_eq!(ff["entry"], 421);
    assert_eq!(ff["size"], 5_308_694_528u64);
    assert!(
        ff["site"]["file"].as_str().unwrap().ends_with("models.py"),
        "{ff}"
    );
    assert_eq!(ff["site"]["line"], 181);
    assert!(!ff["live"].as_array().unwrap().is_empty());
    // Device 0 fits there, with its spare.
    let d0 = fits.iter().find(|d| d["device"] == 0).expect("device 0");
    assert_eq!(d0["on"]["fits"], true);
    assert!(d0["on"]["spare_bytes"].as_u64().unwrap() > 0);
}

/// No OOM is recorded on Maphsge4's `ec5be110`, but the device refused memory 39 times: the
/// capacity it ran on lies between the most reserved it granted and the least it refused, and
/// what the program needs is below it.
#[test]
fn fit_states_the_capacity_a_device_that_refused_memory_had() {
    let Some(f) = common::shared("torch_snapshots/real/Maphsge4__ec5be110_snapshot.pickle") else {
        return;
    };
    let f = f.to_string_lossy().into_owned();
    let r = common::memlsp(&["fit", &f, "--format", "json"], cwd());
    assert_eq!(r.code, 0, "{}", r.stderr);
    let d = &r.json()["captures"][0]["torch"]["fit"][0];
    assert_eq!(d["recorded_capacity_bytes"], serde_json::Value::Null);
    assert_eq!(
        d["recorded_capacity_range_bytes"],
        serde_json::json!([22_519_218_176u64, 22_556_966_911u64])
    );
    assert!(d["needs_bytes"].as_u64().unwrap() < 22_519_218_176, "{d}");
    let r = common::memlsp(&["fit", &f], cwd());
    assert!(
        r.stdout.contains(
            "  the recorded device had 20.97 GiB to 21.01 GiB (no OOM recorded: the most it \
             granted and the least it refused)  [inferred]\n"
        ),
        "{}",
        r.stdout
    );
    // It needs 20.45 GiB (simulated): it ran about half a GiB below that device's edge.
    assert!(
        r.stdout
            .contains("    so the run had 536.00 MiB to 572.00 MiB to spare there  [inferred]\n"),
        "{}",
        r.stdout
    );
    // A device with a recorded OOM has no range.
    let Some(c) = common::shared("torch_snapshots/real/Constructor-Sun__memory_snapshot.pickle")
    else {
        return;
    };
    let r = common::memlsp(&["fit", &c.to_string_lossy(), "--format", "json"], cwd());
    for d in r.json()["captures"][0]["torch"]["fit"].as_array().unwrap() {
        assert!(d.get("recorded_capacity_range_bytes").is_none(), "{d}");
    }
}

#[test]
fn fit_text_on_a_named_gpu_states_the_context_reserve_and_labels() {
    let Some(f) =
        common::shared("torch_snapshots/real/silmont2000__memory_forward_bf16_128.pickle")
    else {
        return;
    };
    let f = f.to_string_lossy().into_owned();
    let r = common::memlsp(&["fit", &f, "--on", "T4"], cwd());
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("needs "), "{}", r.stdout);
    assert!(r.stdout.contains("[simulated]"), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("T4 (16 GB) (14.50 GiB after a 512.00 MiB CUDA context): fits"),
        "{}",
        r.stdout
    );
    // Too small: exit 1 and the failing request's line.
    let r = common::memlsp(&["fit", &f, "--on", "700MiB", "--reserve", "0"], cwd());
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stdout.contains("OOM — this run needs"), "{}", r.stdout);
    assert!(r.stdout.contains("first failing request:"), "{}", r.stdout);
    common::memlsp(&["fit", &f, "--on", "A100"], cwd()).assert_one_line_error("A100-40GB");
}

#[test]
fn predict_json_holds_on_the_xiaolin_series() {
    let Some(dir) = common::shared("torch_snapshots/series/xiaolin2004_forward_only_fp32") else {
        return;
    };
    let p = |n: &str| format!("ctx={n}:{}", dir.join(format!("ctx{n}.pickle")).display());
    let r = common::memlsp(
        &[
            "predict",
            &p("128"),
            &p("256"),
            "--at",
            "ctx=512",
            "--on",
            "40GiB",
            "--format",
            "json",
        ],
        cwd(),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc = r.json();
    let q = &doc["prediction"];
    for k in [
        "at",
        "device",
        "peak_allocated_bytes",
        "reserved_bytes",
        "needs_bytes",
        "largest_fitting",
        "basis",
    ] {
        assert!(q.get(k).is_some(), "prediction.{k} missing: {q}");
    }
    assert_eq!(q["at"], 512.0);
    assert_eq!(q["label"], "simulated");
    // The real ctx512 capture: peak allocated 7,692,086,272 B (its replay, absolute), reserved at
    // the end 7,885,291,520 B (its oracle).
    let peak = q["peak_allocated_bytes"].as_f64().unwrap();
    let reserved = q["reserved_bytes"].as_f64().unwrap();
    assert!((peak / 7_692_086_272.0 - 1.0).abs() < 0.02, "{peak}");
    assert!(
        (reserved / 7_885_291_520.0 - 1.0).abs() < 0.05,
        "{reserved}"
    );
    assert_eq!(
        q["basis"],
        "232 requests constant, 6,100 linear, 876 quadratic in ctx"
    );
    let largest = q["largest_fitting"].as_f64().unwrap();
    assert!(largest > 512.0, "{largest}");
    // The page: a curve per capture and the predicted one (dashed), the capacity line.
    let r = common::memlsp(
        &[
            "predict",
            &p("128"),
            &p("256"),
            "--at",
            "ctx=512",
            "--on",
            "8GiB",
            "--format",
            "html",
        ],
        cwd(),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout.matches("<polyline").count(), 3, "{}", r.stdout);
    assert_eq!(r.stdout.matches("stroke-dasharray=\"6 3\"").count(), 1);
    assert!(r.stdout.contains("capacity 8.00 GiB (simulated: fits)"));
    assert!(r.stdout.contains("ctx=512 predicted [simulated]"));
}

#[test]
fn predict_refuses_captures_of_different_programs_with_where_they_differ() {
    let (Some(dir), Some(other)) = (
        common::shared("torch_snapshots/series/xiaolin2004_forward_only_fp32"),
        common::shared("torch_snapshots/real/LINYUNLinYun__08d334d8_xl_ctx128_forward_none.pickle"),
    ) else {
        return;
    };
    let a = format!("ctx=128:{}", dir.join("ctx128.pickle").display());
    let b = format!("ctx=256:{}", other.display());
    common::memlsp(&["predict", &a, &b, "--at", "ctx=512"], cwd())
        .assert_one_line_error("cannot predict");
    let b = format!("ctx=128:{}", dir.join("ctx256.pickle").display());
    common::memlsp(&["predict", &a, &b, "--at", "ctx=512"], cwd())
        .assert_one_line_error("the same ctx");
    common::memlsp(&["predict", &a, "seq=2:x.pickle", "--at", "ctx=512"], cwd())
        .assert_one_line_error("give one parameter");
}

/// `report --on`: the "Will it fit" section (`torch.fit`, the same entries as `memlsp fit`) and
/// PT017 on the first failing request's line.
#[test]
fn report_on_a_capacity_has_the_fit_section_and_pt013() {
    let Some(f) =
        common::shared("torch_snapshots/real/silmont2000__memory_forward_bf16_128.pickle")
    else {
        return;
    };
    let f = f.to_string_lossy().into_owned();
    let r = common::memlsp(&["report", &f, "--on", "700MiB", "--format", "json"], cwd());
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc = r.json();
    let c = &doc["captures"][0];
    let d = &c["torch"]["fit"][0];
    assert_eq!(d["needs_bytes"], 818u64 << 20, "{d}");
    assert_eq!(d["on"]["first_failure"]["entry"], 1704, "{d}");
    let pt013: Vec<_> = c["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["code"] == "PT017")
        .collect();
    assert_eq!(pt013.len(), 1, "{c}");
    assert!(
        pt013[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("OOM here on 700.00 MiB: this step needs 818.00 MiB")
    );
    let r = common::memlsp(&["report", &f, "--fit"], cwd());
    assert!(
        r.stdout
            .contains("Will it fit (docs/FITS.md)\n  device 0\n    needs 818.00 MiB"),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("PT017"), "{}", r.stdout);
    // Without the flags the report is as before: no section.
    let r = common::memlsp(&["report", &f], cwd());
    assert!(!r.stdout.contains("Will it fit"), "{}", r.stdout);
}
