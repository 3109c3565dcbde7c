//! The plan numbers of every module of every capture equal xprof's (`oracle.json`).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memlsp::xla::Capture;
use serde_json::Value;

fn capture_dirs() -> Option<Vec<PathBuf>> {
    let mut out = Vec::new();
    for set in ["jax_cpu_captures", "jax-real-captures"] {
        let dir = common::shared(set)?;
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("oracle.json").is_file())
            .collect();
        dirs.sort();
        out.extend(dirs);
    }
    Some(out)
}

fn xplane_in(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".xplane.pb"))
        .unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

#[test]
fn plan_numbers_equal_xprof_memory_viewer_for_every_module() {
    let Some(dirs) = capture_dirs() else { return };
    assert!(
        dirs.len() >= 15,
        "expected 7 CPU + 8 real captures, found {}",
        dirs.len()
    );
    let mut checked = 0;
    let mut names_checked = 0;
    let mut failures = Vec::new();
    for dir in dirs {
        let oracle: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap())
                .unwrap();
        let path = xplane_in(&dir);
        let cap = Capture::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let spaces: Vec<i64> = oracle["memory_spaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        for color in spaces {
            let plans = memlsp::xla::plan::plans(&cap, color).unwrap();
            let by_name: BTreeMap<&str, &memlsp::xla::plan::Plan> =
                plans.iter().map(|p| (p.module.as_str(), p)).collect();
            let expected: Vec<&Value> = oracle["modules"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["memory_space"].as_i64() == Some(color))
                .collect();
            if color == 0 {
                let mut want: Vec<&str> = expected
                    .iter()
                    .map(|m| m["module"].as_str().unwrap())
                    .collect();
                want.sort();
                let got: Vec<&str> = by_name.keys().copied().collect();
                assert_eq!(got, want, "{}: module list", dir.display());
            }
            for m in expected {
                let name = m["module"].as_str().unwrap();
                let Some(p) = by_name.get(name) else {
                    failures.push(format!("{}: {name} missing", dir.display()));
                    continue;
                };
                let ctx = format!("{} {name} colour {color}", dir.display());
                let pairs = [
                    ("peak_total_bytes", p.total_peak_bytes),
                    ("peak_heap_bytes", p.heap_peak_bytes),
                    ("parameter_bytes", p.parameter_bytes),
                    ("output_bytes", p.output_bytes),
                    ("indefinite_bytes", p.indefinite_bytes),
                    ("indefinite_bytes_in_peak", p.indefinite_in_peak),
                    ("total_allocation_bytes", p.total_allocation_bytes),
                    ("non_reusable_bytes", p.non_reusable_bytes),
                    ("heap_simulator_points", p.heap_points as u64),
                ];
                for (k, got) in pairs {
                    if u(&m[k]) != got {
                        failures.push(format!("{ctx}: {k} = {got}, xprof {}", m[k]));
                    }
                }
                if m["peak_heap_bytes"].as_u64() != Some(0)
                    && m["peak_instruction"].as_str() != Some(p.peak_instruction.as_str())
                {
                    failures.push(format!(
                        "{ctx}: peak instruction {} vs {}",
                        p.peak_instruction, m["peak_instruction"]
                    ));
                }
                // Buffers at peak: named rows, the top five sizes (multiset), sources. xprof
                // lists no rows for the TPU capture's host-offload colour 5 although its totals
                // count them; memlsp analyses colour 0 in depth, so rows are compared there.
                if color != 0 {
                    checked += 1;
                    continue;
                }
                let named: Vec<_> = p
                    .at_peak
                    .iter()
                    .filter(|b| b.size >= memlsp::xla::plan::SMALL_BUFFER_BYTES)
                    .collect();
                let bp = &m["buffers_at_peak"];
                if u(&bp["named_rows"]) != named.len() as u64 {
                    failures.push(format!(
                        "{ctx}: {} named rows, xprof {}",
                        named.len(),
                        bp["named_rows"]
                    ));
                }
                if u(&bp["small_lumped_bytes"]) != p.small_lumped_bytes {
                    failures.push(format!(
                        "{ctx}: small lumped {} vs {}",
                        p.small_lumped_bytes, bp["small_lumped_bytes"]
                    ));
                }
                let want_top: Vec<u64> = m["top5_at_peak"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| u(&t["size_bytes"]))
                    .collect();
                let got_top: Vec<u64> = named.iter().take(5).map(|b| b.size).collect();
                if want_top != got_top {
                    failures.push(format!("{ctx}: top5 {got_top:?} vs {want_top:?}"));
                }
                // The rows' instructions: the value xprof shows in that memory (for a buffer
                // revived by SHARE_WITH, the sharer). xprof's order among equal sizes is
                // arbitrary, so rows above the fifth size compare as a multiset, and rows of the
                // fifth size must be among ours of that size.
                let fifth = want_top.last().copied().unwrap_or(0);
                let mut want_above: Vec<(u64, String)> = Vec::new();
                for t in m["top5_at_peak"].as_array().unwrap() {
                    let (size, instr) = (u(&t["size_bytes"]), t["instruction"].as_str().unwrap());
                    if size > fifth {
                        want_above.push((size, instr.to_string()));
                    } else if !named
                        .iter()
                        .any(|b| b.size == size && b.instruction == instr)
                    {
                        failures.push(format!(
                            "{ctx}: xprof's row {instr} ({size} B) is not among ours of that size"
                        ));
                    }
                }
                let mut got_above: Vec<(u64, String)> = named
                    .iter()
                    .filter(|b| b.size > fifth)
                    .map(|b| (b.size, b.instruction.clone()))
                    .collect();
                want_above.sort();
                got_above.sort();
                if want_above != got_above {
                    failures.push(format!(
                        "{ctx}: rows above the fifth size {got_above:?}, xprof {want_above:?}"
                    ));
                }
                names_checked += 1;
                let mut by_src: BTreeMap<Option<String>, (u64, u64)> = BTreeMap::new();
                for b in &named {
                    let key = b.source.as_ref().map(|s| format!("{}:{}", s.file, s.line));
                    let e = by_src.entry(key).or_default();
                    e.0 += b.size;
                    e.1 += 1;
                }
                for s in m["peak_bytes_by_source"].as_array().unwrap() {
                    let key = s["location"].as_str().map(|x| x.to_string());
                    let got = by_src.get(&key).copied().unwrap_or_default();
                    if got != (u(&s["bytes"]), u(&s["buffers"])) {
                        failures.push(format!(
                            "{ctx}: source {key:?} has {got:?}, xprof {} in {}",
                            s["bytes"], s["buffers"]
                        ));
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 100, "only {checked} modules checked");
    assert!(
        names_checked > 100,
        "row names of only {names_checked} modules checked"
    );
    eprintln!("{checked} modules equal xprof ({names_checked} with their rows' instructions)");
}

#[test]
fn allocator_numbers_equal_xprof_memory_profile() {
    let Some(dirs) = capture_dirs() else { return };
    let mut checked = 0;
    let mut failures = Vec::new();
    for dir in dirs {
        let oracle: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap())
                .unwrap();
        let cap = Capture::open(&xplane_in(&dir)).unwrap();
        let plans = memlsp::xla::plan::plans(&cap, 0).unwrap();
        let rt = memlsp::xla::runtime::read(&cap, &plans).unwrap();
        let mp = &oracle["memory_profile"];
        let want = mp["allocators"].as_object().unwrap();
        let got: Vec<&str> = rt.allocators.iter().map(|a| a.name.as_str()).collect();
        let want_names: Vec<&str> = want.keys().map(|k| k.as_str()).collect();
        assert_eq!(got, want_names, "{}: allocators", dir.display());
        for a in &rt.allocators {
            let w = &want[&a.name];
            let ctx = format!("{} {}", dir.display(), a.name);
            for (k, v) in [
                ("peak_bytes_in_use_window", a.peak_bytes_in_use),
                ("heap_allocated_bytes_at_peak", a.heap_allocated_at_peak),
                ("memory_capacity_bytes", a.capacity_bytes),
            ] {
                if u(&w[k]) != v {
                    failures.push(format!("{ctx}: {k} = {v}, xprof {}", w[k]));
                }
            }
            checked += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked >= 20, "only {checked} allocators checked");
}
