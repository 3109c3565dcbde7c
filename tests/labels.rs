//! A label is a promise. On every capture in `../shared` and every bundled fixture, each byte
//! quantity shown with the label `read` must be a field of the capture's plan (or xprof's own
//! mapping), and each one shown as `measured` must be counted allocator state or events — never a
//! saving, a bound or a role. The read sites alone equal xprof's by-line table.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use memlsp::findings::{Label, fmt_bytes};
use memlsp::options::Options;
use serde_json::Value;

/// Every byte quantity in a text, as memlsp formats them (`12.34 MiB`, `512 B`).
fn quantities(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let words: Vec<&str> = text.split_whitespace().collect();
    for w in words.windows(2) {
        let unit = w[1].trim_end_matches([',', ';', ')', ':', '.']);
        if !matches!(unit, "B" | "KiB" | "MiB" | "GiB" | "TiB") {
            continue;
        }
        let num = w[0].trim_start_matches(['(', '≈', '~', '+', '-']);
        if !num.is_empty() && num.chars().all(|c| c.is_ascii_digit() || c == '.') {
            out.push(format!("{num} {unit}"));
        }
    }
    out
}

/// Every unsigned number anywhere in a JSON value, formatted as memlsp formats bytes.
fn collect(v: &Value, into: &mut HashSet<String>) {
    match v {
        Value::Number(n) => {
            let u = n.as_u64().or_else(|| n.as_i64().map(i64::unsigned_abs));
            if let Some(u) = u {
                into.insert(fmt_bytes(u));
                into.insert(format!("{u} B"));
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect(x, into)),
        Value::Object(o) => o.values().for_each(|x| collect(x, into)),
        _ => {}
    }
}

/// Quantities a `read` line may show: the plan, its rows, xprof's by-line table.
fn read_set(xla: &Value) -> HashSet<String> {
    let mut s = HashSet::new();
    let plan = &xla["plan"];
    for k in [
        "parameter_bytes",
        "donated_bytes",
        "output_bytes",
        "non_aliased_output_bytes",
        "temp_bytes",
        "heap_peak_bytes",
        "total_peak_bytes",
        "indefinite_bytes",
        "total_allocation_bytes",
    ] {
        collect(&plan[k], &mut s);
    }
    for b in plan["buffers_at_peak"].as_array().into_iter().flatten() {
        collect(&b["bytes"], &mut s);
    }
    collect(&xla["runtime"]["lifetime_peak_bytes"], &mut s);
    s
}

/// Quantities a `read` line of a snapshot may show: fields of its trace entries (an OOM's size
/// and `device_free`) and of its segments.
fn torch_read_set(torch: &Value) -> HashSet<String> {
    let mut s = HashSet::new();
    collect(&torch["totals"]["oom_events"], &mut s);
    s
}

/// Quantities a `measured` line may show: allocator state and events.
fn measured_set(report: &Value) -> HashSet<String> {
    let mut s = HashSet::new();
    if let Some(t) = report.get("torch") {
        for k in [
            "totals",
            "devices",
            "timeline",
            "fragmentation",
            "diff",
            "releases",
            "device_skew",
            "attention",
        ] {
            collect(&t[k], &mut s);
        }
        for site in t["allocation_sites"]["top"]
            .as_array()
            .into_iter()
            .flatten()
        {
            collect(&site["bytes"], &mut s);
            collect(&site["requested_bytes"], &mut s);
        }
    }
    if let Some(x) = report.get("xla") {
        collect(&x["runtime"], &mut s);
    }
    for site in report["sites"].as_array().into_iter().flatten() {
        if site["label"] == "measured" {
            collect(&site["bytes"], &mut s);
        }
    }
    s
}

fn captures() -> Option<Vec<PathBuf>> {
    let shared = common::shared("")?;
    let mut out = Vec::new();
    for sub in [
        "torch_snapshots/real",
        "jax_cpu_captures",
        "jax-real-captures",
    ] {
        out.extend(memlsp::analyze::captures_in_dir(&shared.join(sub)));
    }
    out.extend(memlsp::analyze::captures_in_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures"),
    ));
    Some(out)
}

#[test]
fn read_and_measured_numbers_are_what_the_label_says() {
    let Some(files) = captures() else { return };
    assert!(files.len() > 60, "{} captures", files.len());
    let mut failures = Vec::new();
    let mut lines = 0;
    for path in &files {
        let r = match memlsp::analyze::run_file(path, &Options::default()) {
            Ok(r) => r,
            // Some fixtures are broken on purpose; every real capture must analyse.
            Err(_) if path.starts_with(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures")) => {
                continue;
            }
            Err(e) => {
                failures.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let v = serde_json::to_value(&r).unwrap();
        let read = match (v.get("xla"), v.get("torch")) {
            (Some(x), _) => read_set(x),
            (_, Some(t)) => torch_read_set(t),
            _ => HashSet::new(),
        };
        let measured = measured_set(&v);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        for f in &r.findings {
            // The finding's own bytes, as the hover and hints show them with their label.
            if let (Some(b), Some(l)) = (f.bytes, f.bytes_label) {
                let allowed = match l {
                    Label::Read => Some(&read),
                    Label::Measured => Some(&measured),
                    Label::Inferred | Label::Simulated => None,
                };
                if let Some(allowed) = allowed {
                    lines += 1;
                    if !allowed.contains(&fmt_bytes(b)) {
                        failures.push(format!(
                            "{name} {}: its bytes {} are no {} quantity",
                            f.code,
                            fmt_bytes(b),
                            l.as_str()
                        ));
                    }
                }
            }
            for e in &f.evidence {
                let allowed = match e.label {
                    Label::Read => &read,
                    Label::Measured => &measured,
                    Label::Inferred | Label::Simulated => continue,
                };
                lines += 1;
                for q in quantities(&e.text) {
                    if !allowed.contains(&q) {
                        failures.push(format!(
                            "{name} {}: [{}] {q} is no {} quantity: {}",
                            f.code,
                            e.label.as_str(),
                            e.label.as_str(),
                            e.text
                        ));
                    }
                }
            }
        }
    }
    assert!(lines > 200, "only {lines} labelled evidence lines audited");
    assert!(
        failures.is_empty(),
        "{} mislabelled numbers:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The sites labelled `read` are xprof's own table: each equals the oracle's entry for its line
/// (bytes and buffers), on every module analysed in every JAX capture in `../shared`.
#[test]
fn read_sites_equal_xprof() {
    let Some(shared) = common::shared("") else {
        return;
    };
    let mut checked = 0;
    for set in ["jax_cpu_captures", "jax-real-captures"] {
        for dir in std::fs::read_dir(shared.join(set)).unwrap().flatten() {
            let oracle_path = dir.path().join("oracle.json");
            let Ok(text) = std::fs::read_to_string(&oracle_path) else {
                continue;
            };
            let oracle: Value = serde_json::from_str(&text).unwrap();
            for path in memlsp::analyze::captures_in_dir(&dir.path()) {
                let r = memlsp::analyze::run_file(&path, &Options::default()).unwrap();
                let v = serde_json::to_value(&r).unwrap();
                let Some(module) = v["xla"]["module"].as_str() else {
                    continue;
                };
                let m = oracle["modules"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|m| m["module"] == module && m["memory_space"] == 0)
                    .unwrap_or_else(|| panic!("{module} not in {}", oracle_path.display()));
                for s in r.sites.iter().filter(|s| s.label == Label::Read) {
                    let loc = s
                        .location
                        .as_ref()
                        .map(|l| format!("{}:{}", l.file, l.line));
                    let want = m["peak_bytes_by_source"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|e| e["location"].as_str().map(str::to_string) == loc)
                        .unwrap_or_else(|| {
                            panic!(
                                "{}: read site {loc:?} is not in xprof's table",
                                path.display()
                            )
                        });
                    assert_eq!(
                        (s.bytes, s.blocks),
                        (
                            want["bytes"].as_u64().unwrap(),
                            want["buffers"].as_u64().unwrap()
                        ),
                        "{} {module} {loc:?}",
                        path.display()
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 30, "only {checked} read sites checked");
}
