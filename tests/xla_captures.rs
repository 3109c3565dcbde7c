//! What a user sees for the labelled JAX captures (`shared/jax_cpu_captures/README.md`) and the
//! third-party ones: module choice, diagnosis codes, culprit lines, fixes, numbers.

mod common;

use common::ReportExt;

use std::path::PathBuf;

use memlsp::error::ErrorKind;
use memlsp::findings::{Code, Finding, FixKind, Severity};
use memlsp::options::Options;
use memlsp::report::CaptureReport;
use serde_json::Value;

fn cpu(name: &str) -> Option<PathBuf> {
    common::shared(&format!("jax_cpu_captures/{name}/{name}.xplane.pb"))
}

fn report(name: &str, module: Option<&str>) -> Option<CaptureReport> {
    let path = cpu(name)?;
    let opts = {
        let mut o = Options::default();
        o.analysis.module = module.map(str::to_string);
        o
    };
    Some(memlsp::analyze::run_file(&path, &opts).unwrap_or_else(|e| panic!("{e}")))
}

fn oracle_module(name: &str, module: &str) -> Value {
    let p = common::shared(&format!("jax_cpu_captures/{name}/oracle.json")).unwrap();
    let o: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    o["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["module"] == module && m["memory_space"] == 0)
        .cloned()
        .unwrap()
}

fn xla(r: &CaptureReport) -> Value {
    r.engine()
}

fn find<'a>(r: &'a CaptureReport, code: &str) -> Option<&'a Finding> {
    r.findings.iter().find(|f| f.code.as_str() == code)
}

fn warnings(r: &CaptureReport) -> Vec<&'static str> {
    r.findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .map(|f| f.code.as_str())
        .collect()
}

#[test]
fn missing_donation_points_at_the_jit_line_with_argnums() {
    let Some(r) = report("b_mlp_nodonate", None) else {
        return;
    };
    assert_eq!(xla(&r)["module"], "jit_train_step(36)");
    let f = find(&r, "JX005").expect("JX005 for b_mlp_nodonate");
    assert_eq!(f.severity, Severity::Warning);
    let loc = f.location.as_ref().unwrap();
    assert_eq!(
        (loc.file.as_str(), loc.line),
        ("/srv/jaxdemo/b_mlp_nodonate.py", 57)
    );
    let fix = &f.fixes[0];
    assert!(
        matches!(&fix.kind, FixKind::DonateArgnums { argnums, .. } if argnums == &[0, 1]),
        "{:?}",
        fix.kind
    );
    // params + opt_state = every parameter but the batch x, y (f32[256,1024] each) could be
    // donated; the saving is bounded below that, as XLA:CPU had lent the outputs' memory to
    // temporaries (tests/jax_savings.rs checks the range against c_mlp_donate).
    let o = oracle_module("b_mlp_nodonate", "jit_train_step(36)");
    let batch = 2 * 256 * 1024 * 4;
    let (lo, hi) = fix.saving_range.expect("a saving range");
    assert!(hi < o["parameter_bytes"].as_u64().unwrap() - batch);
    assert_eq!(fix.saving_bytes, Some(lo));
    assert_eq!(r.findings[0].code, Code::JX005);
    assert!(
        r.headline().contains("donate_argnums=(0, 1)"),
        "{}",
        r.headline()
    );
    assert!(r.text().contains("b_mlp_nodonate.py:57"), "{}", r.text());
}

#[test]
fn healthy_captures_report_no_warning() {
    for name in ["c_mlp_donate", "a_transformer_adam"] {
        let Some(r) = report(name, None) else { return };
        assert!(
            find(&r, "JX005").is_none(),
            "{name}: JX005 on a donated step"
        );
        assert_eq!(warnings(&r), Vec::<&str>::new(), "{name}: {}", r.headline());
        // The headline leads with an expected-retention note or says nothing is wrong.
        let h = r.headline();
        assert!(
            h.contains("no memory problem found") || h.contains("[JX002]") || h.contains("[JX003]"),
            "{h}"
        );
        let plan = &xla(&r)["plan"];
        assert!(
            plan["donated_bytes"].as_u64().unwrap() > 0,
            "{name} donates"
        );
    }
}

#[test]
fn attention_scores_are_forward_kept_at_the_softmax_line() {
    let Some(r) = report("e_attention_big", None) else {
        return;
    };
    assert_eq!(xla(&r)["module"], "jit_train_step(18)");
    let f = find(&r, "JX002").expect("JX002");
    assert_eq!(f.severity, Severity::Warning);
    let loc = f.location.as_ref().unwrap();
    assert_eq!(
        (loc.file.as_str(), loc.line),
        ("/srv/jaxdemo/e_attention_big.py", 31)
    );
    // xprof: 832.12 MiB in 17 buffers at the peak come from line 31.
    let o = oracle_module("e_attention_big", "jit_train_step(18)");
    let line31 = o["peak_bytes_by_source"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["location"] == "/srv/jaxdemo/e_attention_big.py:31")
        .unwrap();
    assert_eq!(f.bytes, line31["bytes"].as_u64());
    assert!(f.message.contains("17 buffer(s)"), "{}", f.message);
    assert_eq!(f.fixes[0].kind, FixKind::JaxCheckpoint);
    assert!(
        f.fixes.iter().any(|x| x.title.contains("S×S")),
        "{:?}",
        f.fixes
    );
    // The top site is line 31 with its share of the heap peak.
    let site = &r.sites[0];
    assert_eq!(site.location.as_ref().unwrap().line, 31);
    assert_eq!(site.percent_of.as_str(), "heap peak");
    let heap = o["peak_heap_bytes"].as_u64().unwrap() as f64;
    let want = line31["bytes"].as_u64().unwrap() as f64 * 100.0 / heap;
    assert!(
        (site.percent - want).abs() < 0.01,
        "{} vs {want}",
        site.percent
    );
}

#[test]
fn ineffective_remat_still_blames_line_31_and_says_so() {
    let Some(r) = report("f_attention_remat", None) else {
        return;
    };
    let f = find(&r, "JX002").expect("JX002");
    assert_eq!(f.location.as_ref().unwrap().line, 31);
    assert!(
        f.evidence
            .iter()
            .any(|e| e.text.contains("jax.checkpoint is already applied")),
        "{:?}",
        f.evidence
    );
    assert!(f.fixes.iter().all(|x| x.kind != FixKind::JaxCheckpoint));
}

#[test]
fn eval_module_is_chosen_over_the_more_frequent_train_step() {
    let Some(r) = report("h_eval_and_train", None) else {
        return;
    };
    assert_eq!(xla(&r)["module"], "jit_eval_step(34)");
    let top = find(&r, "JX009").unwrap();
    assert_eq!(top.location.as_ref().unwrap().line, 43);
    assert_eq!(top.bytes, Some(128 << 20));
    let o = oracle_module("h_eval_and_train", "jit_eval_step(34)");
    assert_eq!(xla(&r)["plan"]["total_peak_bytes"], o["peak_total_bytes"]);
    // --module picks another, by full or bare name.
    for m in ["jit_train_step(32)", "jit_train_step"] {
        let r = report("h_eval_and_train", Some(m)).unwrap();
        assert_eq!(xla(&r)["module"], "jit_train_step(32)");
    }
    let e = memlsp::analyze::run_file(&cpu("h_eval_and_train").unwrap(), &{
        let mut o = Options::default();
        o.analysis.module = Some("jit_nope".into());
        o
    })
    .unwrap_err();
    assert!(e.to_string().contains("jit_eval_step(34)"), "{e}");
}

#[test]
fn kept_gradients_show_growth_at_the_append_line() {
    let Some(r) = report("d_grads_kept", None) else {
        return;
    };
    assert_eq!(xla(&r)["module"], "jit_sgd_step(28)");
    let f = find(&r, "JX004").expect("JX004");
    assert_eq!(f.severity, Severity::Warning);
    let loc = f.location.as_ref().unwrap();
    assert_eq!(
        (loc.file.as_str(), loc.line),
        ("/srv/jaxdemo/d_grads_kept.py", 51)
    );
    assert_eq!(f.fixes[0].kind, FixKind::DeviceGetAppend);
    assert!(
        f.evidence
            .iter()
            .any(|e| e.text.contains("[1, 1, 1, 1, 1, 1]")),
        "{:?}",
        f.evidence
    );
    assert_eq!(
        f.bytes,
        xla(&r)["plan"]["non_aliased_output_bytes"].as_u64()
    );
}

#[test]
fn plan_json_matches_the_oracle_for_the_chosen_module() {
    for (name, module) in [
        ("a_transformer_adam", "jit_train_step(34)"),
        ("c_mlp_donate", "jit_train_step(36)"),
    ] {
        let Some(r) = report(name, None) else { return };
        let o = oracle_module(name, module);
        let plan = &xla(&r)["plan"];
        assert_eq!(plan["total_peak_bytes"], o["peak_total_bytes"]);
        assert_eq!(plan["heap_peak_bytes"], o["peak_heap_bytes"]);
        assert_eq!(plan["parameter_bytes"], o["parameter_bytes"]);
        assert_eq!(plan["output_bytes"], o["output_bytes"]);
        let roles = &plan["roles"];
        let sum: u64 = ["forward", "backward", "workspace", "other"]
            .iter()
            .map(|k| roles[k].as_u64().unwrap())
            .sum();
        assert_eq!(
            sum,
            o["peak_heap_bytes"].as_u64().unwrap(),
            "roles split the heap peak"
        );
    }
}

#[test]
fn every_real_capture_is_reported_without_error() {
    let Some(dir) = common::shared("jax-real-captures") else {
        return;
    };
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        for f in memlsp::analyze::captures_in_dir(&e.path()) {
            let r = memlsp::analyze::run_file(&f, &Options::default())
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(!r.headline().is_empty());
            assert!(r.text().contains("[measured]") || r.text().contains("[read]"));
            n += 1;
        }
    }
    assert_eq!(n, 8);
}

#[test]
fn tensorflow_capture_without_hlo_reports_the_allocator_only() {
    let Some(d) = common::shared("jax-real-captures/xprof_demo_gpu_multi_worker") else {
        return;
    };
    let f = memlsp::analyze::captures_in_dir(&d).remove(0);
    let r = memlsp::analyze::run_file(&f, &Options::default()).unwrap();
    assert!(r.headline().starts_with("no HLO plan"), "{}", r.headline());
    // xprof memory_profile: GPU_1_bfc peaks at 4013344768 of 15477102400.
    assert_eq!(xla(&r)["runtime"]["peak_bytes_in_use"], 4013344768u64);
    assert_eq!(xla(&r)["runtime"]["capacity_bytes"], 15477102400u64);
}

#[test]
fn truncated_and_garbage_files_are_errors_with_offsets() {
    let Some(src) = cpu("b_mlp_nodonate") else {
        return;
    };
    let bytes = std::fs::read(&src).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.xplane.pb");
    let mut truncated = 0;
    for k in 1..64 {
        let len = bytes.len() * k / 64;
        std::fs::write(&cut, &bytes[..len]).unwrap();
        match memlsp::analyze::run_file(&cut, &Options::default()) {
            Err(e) => {
                assert!(e.offset.is_some_and(|o| o <= len as u64), "{e}");
                if e.kind == ErrorKind::Truncated {
                    truncated += 1;
                }
                assert!(e.to_string().contains("cut.xplane.pb: at byte"), "{e}");
            }
            Ok(r) => panic!(
                "a cut at {len} of {} bytes was accepted: {}",
                bytes.len(),
                r.headline()
            ),
        }
    }
    assert!(
        truncated >= 60,
        "only {truncated} cuts reported as truncated"
    );
    std::fs::write(&cut, b"\x0a\xff\xff\xff\xff\x0fgarbage").unwrap();
    let e = memlsp::analyze::run_file(&cut, &Options::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Truncated);
    assert_eq!(e.offset, Some(0));
    std::fs::write(&cut, b"\x07\x07\x07").unwrap();
    let e = memlsp::analyze::run_file(&cut, &Options::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid, "{e}");
}

/// Protobuf lets a line carry its header (id, name, timestamp) after its events; no profiler
/// writes one, and memlsp walks a line once assuming the header comes first. Real captures
/// rewritten that way (each line's header moved behind its events, each plane's lines behind
/// its metadata) must read exactly as the originals.
#[test]
fn lines_whose_header_follows_their_events_read_the_same() {
    use memlsp::xla::pb::profiler::{XLine, XPlane, XSpace};
    use prost::Message;
    for rel in [
        "jax_cpu_captures/e_attention_big/e_attention_big.xplane.pb",
        "jax-real-captures/xprof_demo_gpu_multi_worker/34.83.195.179_6003.xplane.pb",
    ] {
        let Some(src) = common::shared(rel) else {
            return;
        };
        let bytes = std::fs::read(&src).unwrap();
        let space = XSpace::decode(&bytes[..]).unwrap();
        let mut moved = 0;
        let mut out = XSpace {
            planes: Vec::new(),
            ..space.clone()
        }
        .encode_to_vec();
        for plane in &space.planes {
            let mut p = XPlane {
                lines: Vec::new(),
                ..plane.clone()
            }
            .encode_to_vec();
            for line in &plane.lines {
                let mut l = XLine {
                    id: 0,
                    name: String::new(),
                    timestamp_ns: 0,
                    ..line.clone()
                }
                .encode_to_vec();
                if !line.events.is_empty() && !line.name.is_empty() {
                    moved += 1;
                }
                prost::encoding::int64::encode(1, &line.id, &mut l);
                prost::encoding::string::encode(2, &line.name, &mut l);
                prost::encoding::int64::encode(3, &line.timestamp_ns, &mut l);
                prost::encoding::bytes::encode(3, &l, &mut p);
            }
            prost::encoding::bytes::encode(1, &p, &mut out);
        }
        assert!(moved > 0, "{rel}: no named line with events to rewrite");
        assert_eq!(
            XSpace::decode(&out[..]).unwrap(),
            space,
            "the rewrite keeps the capture's content"
        );
        let name = src.file_name().unwrap().to_str().unwrap();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(a.path().join(name), &bytes).unwrap();
        std::fs::write(b.path().join(name), &out).unwrap();
        let as_written = common::memlsp(&["report", name, "--format", "json"], a.path());
        let late = common::memlsp(&["report", name, "--format", "json"], b.path());
        assert_eq!(as_written.code, 0, "{}", as_written.stderr);
        assert_eq!(late.code, 0, "{}", late.stderr);
        assert!(as_written.stdout.contains("\"executions\""), "{rel}");
        assert_eq!(late.stdout, as_written.stdout, "{rel}");
    }
}

/// The walks over a capture's planes say how far into the file they are (all of it once the
/// runtime walk, nearly all of the time, is done), and stop at the next line when the answer is
/// no longer wanted (the server: the capture changed again).
#[test]
fn the_walk_says_how_far_it_read_and_stops_when_cancelled() {
    let Some(path) =
        common::shared("jax_cpu_captures/a_transformer_adam/a_transformer_adam.xplane.pb")
    else {
        return;
    };
    let len = std::fs::metadata(&path).unwrap().len();
    let opts = memlsp::options::AnalysisOptions::default();

    let mut cap = memlsp::xla::Capture::open(&path).unwrap();
    cap.file.progress = memlsp::options::Progress::new();
    memlsp::xla::analyse(&cap, &opts).unwrap();
    assert_eq!(cap.file.progress.read(), len);

    let mut cap = memlsp::xla::Capture::open(&path).unwrap();
    cap.file.progress = memlsp::options::Progress::new();
    cap.file.cancel = memlsp::options::Cancel::new();
    cap.file.cancel.cancel();
    let Err(e) = memlsp::xla::analyse(&cap, &opts) else {
        panic!("a cancelled analysis gave its answer");
    };
    assert_eq!(e.kind, ErrorKind::Cancelled, "{e}");
    // Stopped where the first line walked begins: inside the file, short of its end.
    let at = cap.file.progress.read();
    assert!(at > 0 && at < len, "stopped at {at} of {len}");
}
