//! `memlsp report` on real captures: text and JSON, `--module`, `--diff`, rank directories.

mod common;

use common::shared;
use common::{arg, memlsp};
use serde_json::Value;
use std::path::Path;

fn oracle_module<'a>(oracle: &'a Value, name: &str) -> &'a Value {
    oracle["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["module"] == name)
        .unwrap_or_else(|| panic!("oracle has no module {name}"))
}

#[test]
fn jax_report_text_and_json_agree() {
    let Some(dir) = shared("jax_cpu_captures/b_mlp_nodonate") else {
        return;
    };
    let capture = dir.join("b_mlp_nodonate.xplane.pb");
    let cwd = tempfile::tempdir().unwrap();
    let module = "jit_train_step(36)";
    let text = memlsp(&["report", arg(&capture), "--module", module], cwd.path());
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert_eq!(text.stderr, "");
    let json = memlsp(
        &[
            "report",
            arg(&capture),
            "--module",
            module,
            "--format",
            "json",
            "--top",
            "3",
        ],
        cwd.path(),
    );
    assert_eq!(json.code, 0, "{}", json.stderr);
    let doc = json.json();
    assert_eq!(doc["memlsp"], env!("CARGO_PKG_VERSION"));
    let c = &doc["captures"][0];
    assert_eq!(c["kind"], "xla-capture");
    assert!(c.get("torch").is_none());
    // The text report opens with the same headline sentence.
    let headline = c["headline"].as_str().unwrap();
    assert!(!headline.is_empty());
    assert_eq!(text.stdout.lines().next(), Some(headline));
    assert!(
        text.stdout.lines().count() > 3,
        "a body follows the headline"
    );

    let oracle: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
    let want = oracle_module(&oracle, module);
    let xla = &c["xla"];
    assert_eq!(xla["module"], module);
    assert_eq!(xla["plan"]["parameter_bytes"], want["parameter_bytes"]);
    assert_eq!(xla["plan"]["output_bytes"], want["output_bytes"]);
    assert_eq!(xla["plan"]["total_peak_bytes"], want["peak_total_bytes"]);
    let sites = c["sites"].as_array().unwrap();
    assert!(sites.len() <= 3, "--top 3 gave {} sites", sites.len());
    for s in sites {
        for key in [
            "file", "line", "function", "bytes", "blocks", "percent", "stack",
        ] {
            assert!(s.get(key).is_some(), "site lacks {key}: {s}");
        }
    }
}

#[test]
fn torch_report_totals_match_the_oracle() {
    let (Some(snap), Some(oracle)) = (
        shared("torch_snapshots/real/Yiyi-philosophy__oom_snapshot.pickle"),
        shared("torch_snapshots/oracle/Yiyi-philosophy__oom_snapshot.pickle.json"),
    ) else {
        return;
    };
    let cwd = tempfile::tempdir().unwrap();
    let run = memlsp(&["report", arg(&snap), "--format", "json"], cwd.path());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc = run.json();
    let want: Value = serde_json::from_str(&std::fs::read_to_string(oracle).unwrap()).unwrap();
    let totals = &doc["captures"][0]["torch"]["totals"];
    assert_eq!(
        totals["reserved_bytes"],
        want["memory"]["overall"]["reserved_bytes"]
    );
    assert_eq!(
        totals["allocated_bytes"],
        want["memory"]["overall"]["allocated_bytes"]
    );
    let text = memlsp(&["report", arg(&snap)], cwd.path());
    assert_eq!(text.code, 0);
    assert_eq!(
        text.stdout.lines().next(),
        doc["captures"][0]["headline"].as_str()
    );
}

#[test]
fn diff_reports_growth_between_two_snapshots() {
    let (Some(earlier), Some(later)) = (
        shared("torch_snapshots/real/Maphsge4__bdf4fe2e_snapshot.pickle"),
        shared("torch_snapshots/real/Maphsge4__ec5be110_snapshot.pickle"),
    ) else {
        return;
    };
    let cwd = tempfile::tempdir().unwrap();
    let run = memlsp(
        &[
            "report",
            arg(&earlier),
            "--diff",
            arg(&later),
            "--format",
            "json",
        ],
        cwd.path(),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc = run.json();
    let captures = doc["captures"].as_array().unwrap();
    assert_eq!(captures.len(), 1);
    let codes: Vec<&str> = captures[0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    assert!(codes.contains(&"PT011"), "{codes:?}");
    let missing = memlsp(
        &["report", arg(&earlier), "--diff", "no_such_later.pickle"],
        cwd.path(),
    );
    missing.assert_one_line_error("no_such_later.pickle");
    assert_eq!(missing.stdout, "");
}

#[test]
fn exclude_frames_moves_attribution_to_the_next_user_frame() {
    let Some(snap) = shared("torch_snapshots/real/Yiyi-philosophy__oom_snapshot.pickle") else {
        return;
    };
    let cwd = tempfile::tempdir().unwrap();
    let top_site = |extra: &[&str]| -> Option<String> {
        let mut args = vec!["report", arg(&snap), "--format", "json"];
        args.extend_from_slice(extra);
        let run = memlsp(&args, cwd.path());
        assert_eq!(run.code, 0, "{}", run.stderr);
        Some(
            run.json()["captures"][0]["sites"][0]["file"]
                .as_str()?
                .to_string(),
        )
    };
    let Some(plain) = top_site(&[]) else {
        return;
    };
    assert!(plain.ends_with("/flexgen/pytorch_backend.py"), "{plain}");
    let moved = top_site(&["--exclude-frames", "pytorch_backend.py"]).unwrap();
    assert!(
        moved.contains("/flexgen/") && !moved.ends_with("pytorch_backend.py"),
        "{moved}"
    );
}

/// A folder as `memlsp_capture.torch` fills it (`snapshot_step1`, `snapshot_step10`,
/// `snapshot_oom`): what grew between the first and the last step, and the OOM on its own — not
/// three "ranks" compared with each other. Files named `rank<N>_…` are compared as ranks, the
/// latest step of each.
#[test]
fn a_capture_folder_reads_steps_as_growth_and_ranks_as_ranks() {
    let fx = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch");
    let dir = tempfile::tempdir().unwrap();
    let caps = dir.path().join("caps");
    std::fs::create_dir_all(&caps).unwrap();
    std::fs::copy(
        fx.join("pt011_step10.pickle"),
        caps.join("snapshot_step1.pickle"),
    )
    .unwrap();
    std::fs::copy(
        fx.join("pt011_step20.pickle"),
        caps.join("snapshot_step10.pickle"),
    )
    .unwrap();
    std::fs::copy(
        fx.join("pt008_fragmentation_oom.pickle"),
        caps.join("snapshot_oom.pickle"),
    )
    .unwrap();
    let r = memlsp(&["report", "caps", "--format", "json"], dir.path());
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc = r.json();
    let caps_json = doc["captures"].as_array().unwrap();
    assert_eq!(caps_json.len(), 2, "{doc:#}");
    let growth = &caps_json[0];
    assert!(
        growth["path"]
            .as_str()
            .unwrap()
            .ends_with("snapshot_step10.pickle")
    );
    assert!(
        growth["torch"]["diff"]["earlier"]
            .as_str()
            .unwrap()
            .ends_with("snapshot_step1.pickle")
    );
    assert!(
        growth["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["code"] == "PT011")
    );
    assert!(growth["torch"]["rank"].is_null());
    let oom = &caps_json[1];
    assert!(
        oom["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["code"] == "PT008")
    );

    // Per-rank files at two steps: the ranks are compared at their latest step.
    let ranks = dir.path().join("ranks");
    std::fs::create_dir_all(&ranks).unwrap();
    for (src, dst) in [
        (
            "ranks/rank0_snapshot.pickle",
            "rank0_snapshot_step10.pickle",
        ),
        (
            "ranks/rank1_snapshot.pickle",
            "rank1_snapshot_step10.pickle",
        ),
        ("pt011_step10.pickle", "rank0_snapshot_step1.pickle"),
    ] {
        std::fs::copy(fx.join(src), ranks.join(dst)).unwrap();
    }
    let r = memlsp(&["report", "ranks", "--format", "json"], dir.path());
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc = r.json();
    let paths: Vec<&str> = doc["captures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(
        paths.iter().all(|p| p.ends_with("_step10.pickle")),
        "{paths:?}"
    );
    assert_eq!(doc["captures"][1]["torch"]["rank"], 1);
}

/// A batch job's log (`MEMLSP_PROGRESS=1`) says when a snapshot's reading starts, how far it got,
/// and when the analysis begins; the report is unchanged. Without it, and stderr not a terminal,
/// stderr stays empty.
#[test]
fn progress_of_one_snapshot_goes_to_stderr_when_asked() {
    let name = "sidsoc12__8169e1e6_mem_snapshot_ctx128_fp32_train.pickle";
    let Some(snap) = shared(&format!("torch_snapshots/real/{name}")) else {
        return;
    };
    progress_is_logged(&snap, name, "3.99 MiB");
}

/// A JAX capture's walks say how far into the file they are, as a snapshot's decoder does.
#[test]
fn progress_of_one_jax_capture_goes_to_stderr_when_asked() {
    let name = "a_transformer_adam.xplane.pb";
    let Some(cap) = shared(&format!("jax_cpu_captures/a_transformer_adam/{name}")) else {
        return;
    };
    progress_is_logged(&cap, name, "3.83 MiB");
}

/// `MEMLSP_PROGRESS=1 memlsp report FILE`: the same report, and on stderr a line when reading
/// starts, rising shares of the file between, and one when the analysis starts.
fn progress_is_logged(capture: &Path, name: &str, size: &str) {
    let cwd = tempfile::tempdir().unwrap();
    let args = ["report", arg(capture), "--format", "json"];
    let quiet = memlsp(&args, cwd.path());
    assert_eq!(quiet.code, 0, "{}", quiet.stderr);
    assert_eq!(quiet.stderr, "");
    let logged = common::memlsp_env(&args, cwd.path(), &[("MEMLSP_PROGRESS", "1")]);
    assert_eq!(logged.code, 0, "{}", logged.stderr);
    assert_eq!(logged.stdout, quiet.stdout, "the report does not change");
    let lines: Vec<&str> = logged.stderr.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(format!("memlsp: {name}: reading 0% of {size}").as_str())
    );
    assert_eq!(
        lines.last().copied(),
        Some(format!("memlsp: {name}: analysing").as_str())
    );
    // Between them, only shares of the input, rising (how many the log sees depends on timing:
    // a small capture may show none; `torch_load_real` and `xla_captures` check the publishing).
    let shares: Vec<u64> = lines[1..lines.len() - 1]
        .iter()
        .map(|l| {
            let rest = l
                .strip_prefix(&format!("memlsp: {name}: reading "))
                .unwrap_or_else(|| panic!("unexpected progress line {l:?}"));
            rest.strip_suffix(&format!("% of {size}"))
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(shares.windows(2).all(|w| w[0] < w[1]), "{shares:?}");
    assert!(shares.iter().all(|&s| s > 0 && s < 100), "{shares:?}");
}
