//! Every real snapshot in `../shared/torch_snapshots/real/`: the report's engine JSON
//! (the `torch` value of the JSON contract) agrees with `oracle/<file>.json` exactly — memory totals overall and per
//! device, trace counts and trace-relative peaks, OOM events, and the top allocation sites
//! (site, bytes, requested bytes, blocks, percent to the last bit).

mod common;

use common::ReportExt;

use std::path::Path;

use memlsp::options::Options;
use serde_json::Value;

/// Assert that every key of `expected` (recursively) has the same value in `actual`.
fn subset(expected: &Value, actual: &Value, at: &str, errors: &mut Vec<String>) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                match a.get(k) {
                    Some(av) => subset(v, av, &format!("{at}.{k}"), errors),
                    None => errors.push(format!("{at}.{k}: missing (expected {v})")),
                }
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            if e.len() != a.len() {
                errors.push(format!("{at}: {} items, expected {}", a.len(), e.len()));
            }
            for (i, (ev, av)) in e.iter().zip(a.iter()).enumerate() {
                subset(ev, av, &format!("{at}[{i}]"), errors);
            }
        }
        // Floats are checked bit for bit from the oracle's text, below.
        (Value::Number(e), Value::Number(a)) if e.is_f64() || a.is_f64() => {}
        (e, a) => {
            if e != a {
                errors.push(format!("{at}: {a}, expected {e}"));
            }
        }
    }
}

/// Equal as values (no extra keys either way).
fn exact(expected: &Value, actual: &Value, at: &str, errors: &mut Vec<String>) {
    if expected != actual {
        errors.push(format!("{at}: {actual}, expected {expected}"));
    }
}

/// `percent_of_allocated` values as written in the oracle file, parsed with correct rounding.
fn raw_percents(text: &str) -> Vec<Option<f64>> {
    let key = "\"percent_of_allocated\": ";
    text.match_indices(key)
        .map(|(i, _)| {
            let rest = &text[i + key.len()..];
            let end = rest.find([',', '\n', '}']).unwrap_or(rest.len());
            let v = rest[..end].trim();
            if v == "null" {
                None
            } else {
                Some(v.parse::<f64>().unwrap())
            }
        })
        .collect()
}

fn check(path: &Path, oracle_text: &str) -> Vec<String> {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let o: Value = serde_json::from_str(oracle_text).unwrap();
    let opts = Options::default();
    let report = memlsp::analyze::run_file(path, &opts)
        .unwrap_or_else(|e| panic!("{name}: analysis failed: {e}"));
    let j = &report.engine();
    let mut errors = Vec::new();

    // Memory, overall and per device.
    subset(&o["memory"]["overall"], &j["totals"], "totals", &mut errors);
    let devices = j["devices"].as_array().unwrap();
    let oracle_devices = o["devices"].as_array().unwrap();
    assert_eq!(
        devices
            .iter()
            .map(|d| d["device"].clone())
            .collect::<Vec<_>>(),
        *oracle_devices,
        "{name}: device list"
    );
    for d in devices {
        let dev = d["device"].to_string();
        subset(
            &o["memory"]["per_device"][&dev],
            d,
            &format!("devices[{dev}]"),
            &mut errors,
        );
    }

    // Trace.
    let t = &o["trace"];
    if t["present"] == Value::Bool(true) {
        let ov = &t["overall"];
        let tot = &j["totals"];
        for (ok, mk) in [
            ("entries", "trace_entries"),
            ("actions", "trace_actions"),
            ("first_time_us", "first_time_us"),
            ("last_time_us", "last_time_us"),
            (
                "peak_active_bytes_trace_relative",
                "peak_active_bytes_trace_relative",
            ),
        ] {
            exact(&ov[ok], &tot[mk], &format!("totals.{mk}"), &mut errors);
        }
        assert_eq!(
            tot["oom_events"].as_array().map(|a| a.len() as u64),
            ov["oom_count"].as_u64(),
            "{name}: oom count"
        );
        for (dev, pd) in t["per_device"].as_object().unwrap() {
            let Some(d) = devices
                .iter()
                .find(|d| d["device"].as_i64().map(|x| x.to_string()).as_deref() == Some(dev))
            else {
                errors.push(format!("trace device {dev} missing"));
                continue;
            };
            for (ok, mk) in [
                ("entries", "trace_entries"),
                ("actions", "trace_actions"),
                ("first_time_us", "first_time_us"),
                ("last_time_us", "last_time_us"),
                (
                    "peak_active_bytes_trace_relative",
                    "peak_active_bytes_trace_relative",
                ),
                (
                    "peak_reserved_bytes_trace_relative",
                    "peak_reserved_bytes_trace_relative",
                ),
            ] {
                exact(
                    &pd[ok],
                    &d[mk],
                    &format!("devices[{dev}].{mk}"),
                    &mut errors,
                );
            }
        }
        subset(&t["oom"], &tot["oom_events"], "oom_events", &mut errors);
    } else {
        assert_eq!(j["totals"]["trace_present"], Value::Bool(false), "{name}");
        assert_eq!(j["totals"]["trace_entries"], 0, "{name}");
    }

    // Allocation sites. The oracle's rule (ORACLE.md §5) counts Inductor's generated files as
    // user frames; memlsp skips them for the model line behind (DESIGN.md), so on a compiled
    // model's snapshot the sites regroup: the same blocks and bytes in all, no generated site.
    let sites = &o["allocation_sites"];
    if common::has_generated_frames(path) {
        let total = |v: &Value| -> (u64, u64) {
            v["by_kind"]
                .as_object()
                .unwrap()
                .values()
                .fold((0, 0), |a, k| {
                    (a.0 + u64_of(&k["blocks"]), a.1 + u64_of(&k["bytes"]))
                })
        };
        if total(sites) != total(&j["allocation_sites"]) {
            errors.push(format!(
                "regrouped sites hold {:?} (blocks, bytes), the oracle's {:?}",
                total(&j["allocation_sites"]),
                total(sites)
            ));
        }
        for s in &report.sites {
            if let Some(l) = &s.location
                && l.file.contains("torchinductor_")
            {
                errors.push(format!("a site is generated code: {}:{}", l.file, l.line));
            }
        }
        return errors.into_iter().map(|e| format!("{name}: {e}")).collect();
    }
    subset(
        sites,
        &j["allocation_sites"],
        "allocation_sites",
        &mut errors,
    );
    let mine: Vec<Option<f64>> = j["allocation_sites"]["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["percent_of_allocated"].as_f64())
        .collect();
    let want = raw_percents(oracle_text);
    assert_eq!(mine.len(), want.len(), "{name}: number of top sites");
    for (i, (m, w)) in mine.iter().zip(want.iter()).enumerate() {
        if m.map(f64::to_bits) != w.map(f64::to_bits) {
            errors.push(format!(
                "allocation_sites.top[{i}].percent: {m:?}, expected {w:?}"
            ));
        }
    }
    // With one device holding every block, that device's top sites are the overall ones.
    let holders: Vec<&Value> = devices
        .iter()
        .filter(|d| d["block_count"]["active_allocated"].as_u64().unwrap_or(0) > 0)
        .collect();
    if holders.len() == 1 {
        subset(
            &sites["top"],
            &holders[0]["allocation_sites"]["top"],
            "device allocation_sites.top",
            &mut errors,
        );
    }
    // The report's `sites` list the same top sites as the engine JSON.
    for (i, s) in report.sites.iter().enumerate() {
        let top = &sites["top"][i];
        assert_eq!(s.bytes, top["bytes"].as_u64().unwrap(), "{name}: site {i}");
        assert_eq!(
            s.blocks,
            top["blocks"].as_u64().unwrap(),
            "{name}: site {i}"
        );
        match &s.location {
            Some(l) => {
                assert_eq!(Value::from(l.file.clone()), top["filename"], "{name}");
                assert_eq!(Value::from(l.line), top["line"], "{name}");
            }
            None => assert_eq!(top["kind"], "no_stack", "{name}"),
        }
    }
    errors.into_iter().map(|e| format!("{name}: {e}")).collect()
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

#[test]
fn every_real_snapshot_matches_its_oracle() {
    let Some(dir) = common::shared("torch_snapshots") else {
        return;
    };
    let mut files: Vec<_> = std::fs::read_dir(dir.join("real"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no real snapshots found");
    let mut errors = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(dir.join("oracle").join(format!("{name}.json")))
            .unwrap_or_else(|e| panic!("{name}: no oracle: {e}"));
        errors.extend(check(path, &text));
    }
    assert!(
        errors.is_empty(),
        "{} mismatches:\n{}",
        errors.len(),
        errors.join("\n")
    );
    eprintln!("{} real snapshots match their oracle", files.len());
}
