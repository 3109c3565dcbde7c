//! `memlsp baseline` and `memlsp --check --baseline`: real captures of one program before and
//! after a change. JAX: `c_mlp_donate` (donates its state) is the baseline, `b_mlp_nodonate` (the
//! same step without `donate_argnums`) the change: its plan total peak grew 56 %, BL001 on the
//! `jax.jit` line 57; the reverse passes. PyTorch: two snapshots of one FlexGen run at two model
//! sizes (`Yiyi-philosophy__a228b8e3_1.3b_snapshot` → `…oom_snapshot`).

mod common;

use std::path::Path;

use common::{arg, memlsp};
use serde_json::Value;

fn shared(rel: &str) -> Option<std::path::PathBuf> {
    common::shared(rel)
}

/// The BL001 findings of a `--check --format json` run, as (file, line, message).
fn bl001(json: &Value) -> Vec<(String, u64, String)> {
    json["captures"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["findings"].as_array().cloned().unwrap_or_default())
        .filter(|f| f["code"] == "BL001")
        .map(|f| {
            (
                f["file"].as_str().unwrap_or("").to_string(),
                f["line"].as_u64().unwrap_or(0),
                f["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn a_dropped_donation_fails_the_check_on_the_jit_line_and_the_reverse_passes() {
    let (Some(c), Some(b)) = (
        shared("jax_cpu_captures/c_mlp_donate"),
        shared("jax_cpu_captures/b_mlp_nodonate"),
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The workspace holds the program, so the plan total lands on its `jax.jit` line.
    std::fs::copy(b.join("b_mlp_nodonate.py"), dir.join("b_mlp_nodonate.py")).unwrap();
    let base = dir.join("memlsp-baseline.json");
    let r = memlsp(
        &[
            "baseline",
            arg(&c.join("c_mlp_donate.xplane.pb")),
            "-o",
            arg(&base),
        ],
        dir,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&base).unwrap()).unwrap();
    let numbers = &saved["captures"]["jax/jit_train_step"]["numbers"];
    let total = numbers
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["what"] == "plan total peak")
        .unwrap();
    // xprof's peak_total_bytes of c_mlp_donate, read from the plan.
    let oracle: Value =
        serde_json::from_slice(&std::fs::read(c.join("oracle.json")).unwrap()).unwrap();
    assert_eq!(total["bytes"], oracle["modules"][0]["peak_total_bytes"]);
    assert_eq!(total["label"], "read");

    let capture = b.join("b_mlp_nodonate.xplane.pb");
    let r = memlsp(
        &[
            "--check",
            arg(&capture),
            "--baseline",
            arg(&base),
            "--format",
            "json",
        ],
        dir,
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    let found = bl001(&r.json());
    let jit = found
        .iter()
        .find(|f| f.2.contains("plan total peak"))
        .unwrap_or_else(|| panic!("{found:#?}"));
    assert!(jit.0.ends_with("b_mlp_nodonate.py"), "{jit:?}");
    assert_eq!(jit.1, 57, "the jax.jit line: {jit:?}");
    assert!(
        jit.2
            .starts_with("+56% vs baseline: 186.09 MiB → 290.16 MiB"),
        "{}",
        jit.2
    );
    assert!(r.stderr.contains("number(s) compared with"), "{}", r.stderr);

    // Text, SARIF and GitHub say the same on the same line.
    let text = memlsp(&["--check", arg(&capture), "--baseline", arg(&base)], dir);
    assert_eq!(text.code, 1);
    assert!(
        text.stdout.contains(
            "b_mlp_nodonate.py:57: error[BL001] +56% vs baseline: 186.09 MiB → 290.16 MiB"
        ),
        "{}",
        text.stdout
    );
    let sarif = memlsp(
        &[
            "--check",
            arg(&capture),
            "--baseline",
            arg(&base),
            "--format",
            "sarif",
        ],
        dir,
    )
    .json();
    let res = sarif["runs"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| {
            x["ruleId"] == "BL001"
                && x["message"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("plan total peak"))
        })
        .cloned()
        .expect("BL001 in SARIF");
    assert_eq!(res["level"], "error");
    assert_eq!(
        res["locations"][0]["physicalLocation"]["region"]["startLine"],
        57
    );
    let gh = memlsp(
        &[
            "--check",
            arg(&capture),
            "--baseline",
            arg(&base),
            "--format",
            "github",
        ],
        dir,
    );
    assert!(
        gh.stdout
            .lines()
            .any(|l| l.starts_with("::error file=b_mlp_nodonate.py,line=57,title=memlsp BL001::")),
        "{}",
        gh.stdout
    );

    // Allowing the growth passes; without --baseline nothing is compared.
    let loose = memlsp(
        &[
            "--check",
            arg(&capture),
            "--baseline",
            arg(&base),
            "--max-growth",
            "60%",
            "--fail-on",
            "error",
        ],
        dir,
    );
    assert_eq!(loose.code, 0, "{}", loose.stdout);

    // The reverse: the donating run against the non-donating baseline passes.
    let base_b = dir.join("b.json");
    assert_eq!(
        memlsp(&["baseline", arg(&capture), "-o", arg(&base_b)], dir).code,
        0
    );
    let rev = memlsp(
        &[
            "--check",
            arg(&c.join("c_mlp_donate.xplane.pb")),
            "--baseline",
            arg(&base_b),
            "--format",
            "json",
        ],
        dir,
    );
    assert_eq!(rev.code, 0, "{}", rev.stdout);
    assert!(bl001(&rev.json()).is_empty());
}

#[test]
fn a_bigger_model_of_one_run_grows_its_lines_and_totals() {
    let (Some(small), Some(big)) = (
        shared("torch_snapshots/real/Yiyi-philosophy__a228b8e3_1.3b_snapshot.pickle"),
        shared("torch_snapshots/real/Yiyi-philosophy__oom_snapshot.pickle"),
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let base = dir.join("base.json");
    assert_eq!(
        memlsp(&["baseline", arg(&small), "-o", arg(&base)], dir).code,
        0
    );
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&base).unwrap()).unwrap();
    let entry = &saved["captures"]["torch"];
    assert!(
        entry.is_object(),
        "one snapshot: the key is `torch`: {saved:#}"
    );
    // The live bytes at the snapshot are the oracle's allocated bytes (measured).
    let name = small.file_name().unwrap().to_str().unwrap();
    let oracle: Value = serde_json::from_slice(
        &std::fs::read(
            small
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .join(format!("oracle/{name}.json")),
        )
        .unwrap(),
    )
    .unwrap();
    let live = entry["numbers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["what"] == "live at the snapshot (device 0)")
        .unwrap();
    assert_eq!(
        live["bytes"],
        oracle["memory"]["overall"]["allocated_bytes"]
    );
    let reserved = entry["numbers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["what"] == "reserved (device 0)")
        .unwrap();
    assert_eq!(reserved["timing"], true);

    let r = memlsp(
        &[
            "--check",
            arg(&big),
            "--baseline",
            arg(&base),
            "--format",
            "json",
        ],
        dir,
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    let found = bl001(&r.json());
    // The FlexGen allocator line that holds the weights grew 3.6 → 11.0 GiB.
    assert!(
        found
            .iter()
            .any(|f| f.0.ends_with("flexgen/pytorch_backend.py")
                && f.1 == 190
                && f.2.starts_with("+206% vs baseline: 3.60 GiB → 11.03 GiB")),
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|f| f.2.contains("live at the snapshot (device 0)"))
    );
    // Reserved bytes are timing-dependent: left out unless asked.
    assert!(
        !found.iter().any(|f| f.2.contains("reserved")),
        "{found:#?}"
    );
    assert!(
        r.stderr.contains("1 timing-dependent left out"),
        "{}",
        r.stderr
    );
    let timed = memlsp(
        &[
            "--check",
            arg(&big),
            "--baseline",
            arg(&base),
            "--timing",
            "--format",
            "json",
        ],
        dir,
    );
    assert!(
        bl001(&timed.json())
            .iter()
            .any(|f| f.2.contains("reserved (device 0)") && f.2.contains("timing-dependent")),
        "{}",
        timed.stdout
    );

    // The smaller model against the bigger one's baseline passes.
    let base_big = dir.join("big.json");
    assert_eq!(
        memlsp(&["baseline", arg(&big), "-o", arg(&base_big)], dir).code,
        0
    );
    let rev = memlsp(&["--check", arg(&small), "--baseline", arg(&base_big)], dir);
    assert_eq!(rev.code, 0, "{}", rev.stdout);
}

#[test]
fn bad_baselines_and_flags_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch/pt002_retained_graph.pickle");
    std::fs::write(dir.join("bad.json"), "{\"captures\": 3}").unwrap();
    memlsp(&["--check", arg(&fixture), "--baseline", "bad.json"], dir)
        .assert_one_line_error("bad.json: at byte 13: not a memlsp baseline");
    memlsp(
        &["--check", arg(&fixture), "--baseline", "missing.json"],
        dir,
    )
    .assert_one_line_error("cannot read the baseline");
    memlsp(&["--check", arg(&fixture), "--max-growth", "5%"], dir)
        .assert_one_line_error("need --baseline");
    memlsp(
        &[
            "--check",
            arg(&fixture),
            "--baseline",
            "bad.json",
            "--max-growth",
            "lots",
        ],
        dir,
    )
    .assert_one_line_error("--max-growth");
    // A capture that cannot be read: no baseline is written.
    std::fs::write(dir.join("broken.pickle"), b"\x80\x04garbage").unwrap();
    let r = memlsp(&["baseline", "broken.pickle", "-o", "out.json"], dir);
    assert_eq!(r.code, 2);
    assert!(!dir.join("out.json").exists());
}

/// A baseline recorded from several snapshots checks one of them alone (and the reverse): a lone
/// snapshot is keyed `torch`, one of several `torch/<file name>`, and the two meet on the file
/// name. `snap.pickle` is a small fixture before and one with 10× its live memory after (what
/// is under test is the key, not the program), `other.pickle` the same on both sides.
#[test]
fn a_baseline_of_several_snapshots_checks_one_alone_and_the_reverse() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch");
    let tmp = tempfile::tempdir().unwrap();
    let (before, after) = (tmp.path().join("before"), tmp.path().join("after"));
    for (dir, snap) in [
        (&before, "pt011_step10.pickle"),
        (&after, "pt002_retained_graph.pickle"),
    ] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::copy(fixtures.join(snap), dir.join("snap.pickle")).unwrap();
        std::fs::copy(
            fixtures.join("pt011_step20.pickle"),
            dir.join("other.pickle"),
        )
        .unwrap();
    }
    let check = |base: &Path, files: &[&Path]| {
        let mut args = vec!["--check"];
        args.extend(files.iter().map(|f| arg(f)));
        args.extend([
            "--baseline",
            arg(base),
            "--max-growth",
            "0.1%",
            "--format",
            "json",
        ]);
        let r = memlsp(&args, tmp.path());
        (r.code, bl001(&r.json()))
    };
    let record = |files: &[&Path], out: &Path| {
        let mut args = vec!["baseline"];
        args.extend(files.iter().map(|f| arg(f)));
        args.extend(["-o", arg(out)]);
        let r = memlsp(&args, tmp.path());
        assert_eq!(r.code, 0, "{}", r.stderr);
    };
    let (snap_before, other) = (before.join("snap.pickle"), before.join("other.pickle"));
    let snap_after = after.join("snap.pickle");

    // Recorded from two, checked alone: the leak's growth is found.
    let two = tmp.path().join("two.json");
    record(&[&snap_before, &other], &two);
    let (code, found) = check(&two, &[&snap_after]);
    assert_eq!(code, 1, "{found:?}");
    assert!(
        found.iter().any(|f| f.2.contains("live at the snapshot")),
        "{found:?}"
    );
    // Unchanged, it passes.
    assert_eq!(check(&two, &[&snap_before]).1, vec![]);

    // Recorded alone, checked beside another snapshot: the same.
    let one = tmp.path().join("one.json");
    record(&[&snap_before], &one);
    let (code, found) = check(&one, &[&snap_after, &after.join("other.pickle")]);
    assert_eq!(code, 1, "{found:?}");
    assert!(
        found.iter().any(|f| f.2.contains("live at the snapshot")),
        "{found:?}"
    );
}
