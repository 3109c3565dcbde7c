//! The fixtures in `fixtures/torch/` (written by `gen_fixtures.py`): each pattern's snapshot yields
//! its finding code at the right line of `train_leak.py`, with the fix a user would apply, and the
//! format variants load and add up without lighting up warnings.

use std::path::{Path, PathBuf};

mod common;

use common::ReportExt;
use memlsp::findings::{Finding, FixKind, Severity};
use memlsp::options::Options;
use memlsp::report::CaptureReport;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/torch")
        .join(name)
}

/// 1-based line of the first line of train_leak.py containing `text`.
fn line_of(text: &str) -> u32 {
    let src = std::fs::read_to_string(fixture("train_leak.py")).unwrap();
    let i = src
        .lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("{text:?} not in train_leak.py"));
    i as u32 + 1
}

fn report(name: &str) -> CaptureReport {
    memlsp::analyze::run_file(&fixture(name), &Options::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn engine(r: &CaptureReport) -> Value {
    r.engine()
}

fn find<'a>(r: &'a CaptureReport, code: &str) -> &'a Finding {
    r.findings
        .iter()
        .find(|f| f.code.as_str() == code)
        .unwrap_or_else(|| {
            panic!(
                "{}: no {code}; findings: {:?}",
                r.path.display(),
                r.findings.iter().map(|f| f.code).collect::<Vec<_>>()
            )
        })
}

fn codes(r: &CaptureReport) -> Vec<&'static str> {
    r.findings.iter().map(|f| f.code.as_str()).collect()
}

fn assert_at(f: &Finding, text: &str) {
    let loc = f
        .location
        .as_ref()
        .unwrap_or_else(|| panic!("{} has no location", f.code));
    assert!(
        loc.file.ends_with("/train_leak.py"),
        "{}: {}",
        f.code,
        loc.file
    );
    assert_eq!(
        loc.line,
        line_of(text),
        "{} should point at {text:?}",
        f.code
    );
    assert_eq!(
        f.stack.first(),
        Some(loc),
        "{}: the stack starts at the culprit",
        f.code
    );
}

fn no_warnings(r: &CaptureReport) {
    let loud: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .map(|f| (f.code, f.message.clone()))
        .collect();
    assert!(loud.is_empty(), "{}: {loud:?}", r.path.display());
}

/// reserved = live + pending + inactive, and the text carries every section with labels.
fn consistent(r: &CaptureReport) {
    let t = &engine(r)["totals"];
    let n = |k: &str| t[k].as_u64().unwrap();
    assert_eq!(
        n("reserved_bytes"),
        n("allocated_bytes") + n("pending_free_bytes") + n("inactive_bytes"),
        "{}",
        r.path.display()
    );
    let mut at = 0;
    for section in [
        "Totals",
        "Top sites",
        "Free timeline",
        "Diagnosis",
        "Next steps",
        "Uncertainty",
    ] {
        let text = r.text();
        let i = text[at..].find(section).unwrap_or_else(|| {
            panic!(
                "{}: section {section} missing or out of order",
                r.path.display()
            )
        });
        at += i;
    }
    assert!(r.text().contains("[measured]"));
    assert!(!r.headline().is_empty() && !r.headline().contains('\n'));
}

#[test]
fn pt002_retained_graph_points_at_the_accumulation() {
    let r = report("pt002_retained_graph.pickle");
    consistent(&r);
    let f = find(&r, "PT002");
    assert_eq!(f.severity, Severity::Warning);
    assert_at(f, "total_loss += loss");
    assert_eq!(f.fixes[0].kind, FixKind::DetachAccumulated { item: false });
    assert!(
        f.fixes
            .iter()
            .any(|x| x.kind == FixKind::DetachAccumulated { item: true }),
        "an .item() alternative"
    );
    assert!(f.fixes[0].saving_bytes.unwrap_or(0) > 0);
    assert!(r.headline().starts_with("Autograd graphs are kept alive"));
    assert!(!codes(&r).contains(&"PT003"), "one diagnosis for one leak");
    assert_eq!(r.findings[0].code.as_str(), "PT002", "most severe first");
}

#[test]
fn pt003_growing_container_points_at_the_append() {
    let r = report("pt003_growing_history.pickle");
    consistent(&r);
    let f = find(&r, "PT003");
    assert_eq!(f.severity, Severity::Warning);
    assert_at(f, "history.append(out)");
    assert_eq!(f.fixes[0].kind, FixKind::DetachCpuAppend);
    assert!(f.message.contains("8 blocks"), "{}", f.message);
    assert!(!codes(&r).contains(&"PT002"));
    let site = r
        .sites
        .iter()
        .find(|s| {
            s.location
                .as_ref()
                .is_some_and(|l| l.line == line_of("history.append(out)"))
        })
        .expect("the container is a top site");
    assert_eq!(site.role.map(|r| r.as_str()), Some("user container"));
    assert_eq!(site.percent_of.as_str(), "live memory");
}

#[test]
fn pt004_first_step_optimizer_state_is_expected_retention() {
    let r = report("pt004_optimizer_state.pickle");
    consistent(&r);
    let f = find(&r, "PT004");
    assert_eq!(f.severity, Severity::Information);
    assert_at(f, "opt.step()  # PT004");
    assert!(f.message.contains("not a leak"), "{}", f.message);
    no_warnings(&r);
    assert_eq!(engine(&r)["pickle_protocol"], 2);
}

#[test]
fn pt005_activation_pressure_quantifies_checkpointing() {
    let r = report("pt005_activations.pickle");
    consistent(&r);
    let f = find(&r, "PT005");
    assert_at(f, "h = F.gelu(self.fc1(x))");
    let fix = &f.fixes[0];
    assert!(fix.title.contains("torch.utils.checkpoint"));
    // Replayed: the simulated saving (peak before − after) replaces the estimate.
    assert!(
        memlsp::findings::fix_saving(fix).unwrap_or(0) > 1 << 30,
        "{fix:?}"
    );
    assert!(fix.cost.as_deref().unwrap_or("").contains("forward"));
    assert!(f.percent.unwrap_or(0.0) > 90.0);
    no_warnings(&r);
}

#[test]
fn pt006_ddp_replication_per_rank_with_comparison() {
    let a = fixture("ranks/rank0_snapshot.pickle");
    let b = fixture("ranks/rank1_snapshot.pickle");
    let (reports, errors) = memlsp::analyze::analyze_ranks(&[&a, &b], &Options::default());
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(reports.len(), 2);
    for (i, r) in reports.iter().enumerate() {
        consistent(r);
        let f = find(r, "PT006");
        assert_at(f, "ddp = torch.nn.parallel.DistributedDataParallel");
        assert!(f.fixes[0].title.contains("FSDP"));
        assert!(
            f.evidence.iter().any(|e| e.text.contains("all 2 ranks")),
            "{:?}",
            f.evidence
        );
        assert_eq!(f.scope.as_deref(), Some(format!("rank {i}").as_str()));
        assert!(r.text().contains("Ranks (2 snapshots)"));
        assert_eq!(engine(r)["rank"], i);
        no_warnings(r);
    }
    // A directory of rank files goes through the same path.
    let dir = memlsp::analyze::analyze_path(&fixture("ranks"), &Options::default()).unwrap();
    assert_eq!(dir.len(), 2);
}

#[test]
fn pt007_gc_batched_frees_suggest_warn_tensor_cycles() {
    let r = report("pt007_gc_cycles.pickle");
    consistent(&r);
    let f = find(&r, "PT007");
    assert_eq!(f.severity, Severity::Warning);
    assert_at(f, "return self.head(x)");
    assert!(f.fixes[0].title.contains("warn_tensor_cycles"));
    assert!(
        f.evidence
            .iter()
            .any(|e| e.text.contains("garbage collector"))
    );
}

#[test]
fn pt008_fragmentation_oom_recommends_allocator_settings_in_order() {
    let r = report("pt008_fragmentation_oom.pickle");
    consistent(&r);
    assert_eq!(r.findings[0].code.as_str(), "PT008", "the cause leads");
    let f = &r.findings[0];
    assert_eq!(f.severity, Severity::Error);
    assert_at(f, "seq = torch.randn(");
    assert_eq!(
        f.fixes[0].kind,
        FixKind::AllocConf {
            value: "expandable_segments:True".into()
        }
    );
    // The replay of the recorded requests decides: expandable segments serve the failed request,
    // no max_split_size_mb tried does (the fix says so instead of offering the edit).
    let sim = f.fixes[0]
        .simulated
        .as_ref()
        .expect("expandable_segments simulated");
    assert_eq!(sim.oom_avoided, Some(true), "{sim:?}");
    assert_eq!(f.fixes[1].kind, FixKind::Advice);
    assert!(
        f.fixes[1]
            .title
            .starts_with("max_split_size_mb would not avoid this OOM"),
        "{}",
        f.fixes[1].title
    );
    assert_eq!(
        f.fixes[1].simulated.as_ref().and_then(|s| s.oom_avoided),
        Some(false)
    );
    assert!(r.headline().starts_with("Fragmentation caused the OOM"));
    let pt9 = find(&r, "PT009");
    assert_at(pt9, "seq = torch.randn(");
    assert!(
        r.text()
            .contains("PYTORCH_ALLOC_CONF=expandable_segments:True")
    );
}

#[test]
fn pt009_oom_near_capacity_says_fragmentation_is_not_the_problem() {
    let r = report("pt009_oom_capacity.pickle");
    consistent(&r);
    let f = find(&r, "PT009");
    assert_eq!(f.severity, Severity::Error);
    assert_at(f, "torch.empty(1 << 30");
    assert!(
        f.evidence
            .iter()
            .any(|e| e.text.starts_with("not fragmentation")),
        "{:?}",
        f.evidence
    );
    assert!(!codes(&r).contains(&"PT008"));
    let oom = &engine(&r)["totals"]["oom_events"][0];
    assert_eq!(oom["device_free"], 490 << 20);
    assert_eq!(oom["size"], 1u64 << 30);
    assert_eq!(
        oom["first_user_frame"]["line"],
        line_of("torch.empty(1 << 30")
    );
}

#[test]
fn pt010_pending_free_points_at_the_release() {
    let r = report("pt010_pending_free.pickle");
    consistent(&r);
    let f = find(&r, "PT010");
    // 8 MiB pending of a 100 MiB peak, and the replay of the fix (each pending free completed
    // when requested) leaves the peak unchanged: acting saves < 10 % of the peak and no OOM,
    // so information, not a warning (issue 25 item 5).
    assert_eq!(f.severity, Severity::Information);
    let sim = f.fixes[0].simulated.as_ref().expect("replayed");
    assert_eq!(sim.peak_allocated_before, sim.peak_allocated_after);
    assert_at(f, "del buf");
    let j = engine(&r);
    assert_eq!(j["totals"]["pending_free_bytes"], 8 << 20);
    assert_eq!(j["timeline"][0]["pending_frees"]["count"], 1);
    assert!(j["timeline"][0]["delayed_frees"]["count"].as_u64().unwrap() >= 5);
    assert_eq!(j["pickle_protocol"], 5);
}

#[test]
fn pt011_diff_names_the_site_that_grew() {
    let r = memlsp::analyze::run_diff(
        &fixture("pt011_step10.pickle"),
        &fixture("pt011_step20.pickle"),
        &Options::default(),
    )
    .unwrap();
    consistent(&r);
    let f = find(&r, "PT011");
    assert_eq!(f.severity, Severity::Warning);
    assert_at(f, "CACHE[step] = model.head.weight.grad.clone()");
    assert_eq!(f.bytes, Some(10 * 40 * 1024));
    let grown = &engine(&r)["diff"]["grown"];
    assert_eq!(grown.as_array().map(|a| a.len()), Some(1), "{grown}");
    assert_eq!(grown[0]["blocks_delta"], 10);
    assert!(r.text().contains("Growth since"));
}

#[test]
fn format_variants_load_and_stay_quiet() {
    for name in [
        "format_torch20_history.pickle",
        "format_segment_list.pkl",
        "format_expandable_segments.pickle",
        "format_multi_device.pickle",
        "format_json_snapshot.json",
        "format_big_int_line.pickle",
    ] {
        let r = report(name);
        consistent(&r);
        no_warnings(&r);
        assert!(engine(&r)["totals"]["allocated_bytes"].as_u64().unwrap() > 0);
    }
    let seglist = report("format_segment_list.pkl");
    assert_eq!(engine(&seglist)["format"], "segment-list");
    assert_eq!(engine(&seglist)["totals"]["trace_present"], false);
    assert!(
        seglist
            .text()
            .contains("no trace (memory history was not recorded)")
    );

    let exp = report("format_expandable_segments.pickle");
    let t = &engine(&exp)["totals"];
    assert!(t["expandable_segment_count"].as_u64().unwrap() > 0);
    assert!(t["trace_actions"]["segment_map"].as_u64().unwrap() > 0);

    let multi = report("format_multi_device.pickle");
    let devs = engine(&multi)["devices"].as_array().unwrap().clone();
    assert_eq!(devs.len(), 3);
    assert!(devs[1]["allocated_bytes"].as_u64().unwrap() > 0);
    assert_eq!(devs[2]["trace_entries"], 0);

    let old = report("format_torch20_history.pickle");
    assert_eq!(engine(&old)["totals"]["first_time_us"], Value::Null);
    assert!(
        old.sites[0].location.is_some(),
        "2.0 history frames attribute"
    );

    let json = report("format_json_snapshot.json");
    assert_eq!(engine(&json)["pickle_protocol"], Value::Null);

    let big = report("format_big_int_line.pickle");
    let top = &engine(&big)["allocation_sites"]["top"][0];
    assert_eq!(top["line"], u64::MAX, "a 9-byte LONG1 line survives");
}

#[test]
fn max_trace_events_reports_what_was_dropped() {
    let mut opts = Options::default();
    opts.decode.max_trace_events = Some(50);
    let r = memlsp::analyze::run_file(&fixture("pt002_retained_graph.pickle"), &opts).unwrap();
    let t = &engine(&r)["totals"];
    assert_eq!(t["trace_entries"], 50);
    assert!(t["dropped_trace_entries"].as_u64().unwrap() > 0);
    assert!(r.text().contains("dropped by --max-trace-events"));
}

/// Every torch fix with a change the replay can make carries a simulated before → after, on
/// fixtures whose replay reproduces their recorded segment events.
#[test]
fn fixes_are_simulated_on_the_allocator_replay() {
    for (name, code, lower) in [
        ("pt002_retained_graph.pickle", "PT002", true),
        ("pt003_growing_history.pickle", "PT003", true),
        ("pt005_activations.pickle", "PT005", true),
        ("pt010_pending_free.pickle", "PT010", false),
    ] {
        let r = report(name);
        assert_eq!(engine(&r)["replay"]["validated"], true, "{name}");
        let f = find(&r, code);
        let sim = f.fixes[0]
            .simulated
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: {code} not simulated"));
        assert!(
            sim.peak_allocated_after <= sim.peak_allocated_before,
            "{name}: {sim:?}"
        );
        if lower {
            assert!(
                sim.peak_allocated_after < sim.peak_allocated_before,
                "{name}: {sim:?}"
            );
        }
        assert!(r.text().contains("[simulated]"), "{name}");
        let json = r.engine();
        // Simulated only on a replay that reproduced every recorded segment event.
        let replay = &json["replay"];
        assert!(
            replay["segment_events_recorded"].as_u64() > Some(0),
            "{name}"
        );
        assert_eq!(
            replay["segment_events_matched"], replay["segment_events_recorded"],
            "{name}"
        );
    }
    // PT002: the kept graphs' 576 MiB leave the peak.
    let r = report("pt002_retained_graph.pickle");
    let sim = find(&r, "PT002").fixes[0].simulated.clone().unwrap();
    assert!(
        sim.peak_allocated_before - sim.peak_allocated_after > 500 << 20,
        "{sim:?}"
    );
}
