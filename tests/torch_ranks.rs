//! Ranks: PT012 (rank skew) on a real snapshot's ranks, one of them changed the way the bug
//! changes it; `memlsp compare` on the ranks' summaries equals `report DIR` on the snapshots;
//! `--jobs` does not change the answer; `--check` compares rank files of one folder too.

mod common;

use std::path::{Path, PathBuf};

use common::{arg, memlsp};
use memlsp::findings::Code;
use memlsp::options::AnalysisOptions;
use memlsp::torch::model::{BlockState, Snapshot};
use memlsp::torch::ranks::{RankComparison, RankRow, RankSummary};
use serde_json::Value;

const SNAP: &str = "kkaitlyn111__memory_ctx128_fullstep.pickle";

fn load(name: &str) -> Option<Snapshot> {
    let p = common::shared(&format!("torch_snapshots/real/{name}"))?;
    Some(memlsp::torch::load::load_snapshot(&p, &Default::default()).unwrap())
}

/// `snap` as a rank that also keeps a second copy of every live block allocated at
/// `file_suffix:line` (a rank that materialises state the others shard, or keeps a rank-0-only
/// buffer): each segment holding such blocks is present twice, the copy holding only those
/// blocks (the rest of the copy free).
fn with_second_copy(snap: &Snapshot, file_suffix: &str, line: u32) -> (Snapshot, u64) {
    let a = memlsp::torch::analyse(snap, &AnalysisOptions::default());
    let target = a
        .sites
        .sites
        .iter()
        .find(|s| s.site.ends_with(&format!("{file_suffix}:{line}:step")))
        .unwrap_or_else(|| panic!("no site {file_suffix}:{line}"))
        .key;
    let mut out = snap.clone();
    let mut extra = 0;
    let mut copies = Vec::new();
    for (k, seg) in snap.segments.iter().enumerate() {
        let ours = |b: &memlsp::torch::model::Block| {
            b.state == BlockState::ActiveAllocated && a.stacks.site(b.stack).0 == target
        };
        if !seg.blocks.iter().any(ours) {
            continue;
        }
        let mut c = seg.clone();
        let shift = (1u64 << 44) + (k as u64) * (1 << 36);
        c.address += shift;
        for b in &mut c.blocks {
            b.address += shift;
            if ours(b) {
                extra += b.size;
            } else {
                b.state = BlockState::Inactive;
            }
        }
        copies.push(c);
    }
    out.segments.extend(copies);
    (out, extra)
}

fn summary(snap: &Snapshot) -> RankSummary {
    let a = memlsp::torch::analyse(snap, &AnalysisOptions::default());
    RankSummary::of(snap, &a)
}

#[test]
fn pt012_names_the_line_where_one_rank_holds_a_second_copy() {
    let Some(snap) = load(SNAP) else { return };
    let same = summary(&snap);
    let (skewed, extra) = with_second_copy(&snap, "optimizers.py", 84);
    let odd = summary(&skewed);
    // Eight ranks of one data-parallel job: identical but for rank 5.
    let rows: Vec<RankRow> = (0..8)
        .map(|r| {
            let s = if r == 5 { &odd } else { &same };
            RankRow::of(Path::new(&format!("rank{r}_snapshot.pickle")), r, s)
        })
        .collect();
    let cmp = RankComparison::with_rows(rows);
    for i in (0..8).filter(|&i| i != 5) {
        assert!(cmp.skew(i).is_empty(), "rank {i}: {:?}", cmp.skew(i));
    }
    let found = cmp.skew(5);
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(f.code, Code::PT012);
    let l = f.location.as_ref().unwrap();
    assert!(
        l.file.ends_with("cs336_basics/optimizers.py") && l.line == 84,
        "{l:?}"
    );
    // The excess is exactly the copied blocks (measured), against the median rank.
    assert_eq!(f.bytes, Some(extra));
    assert!(extra > 12 << 30, "{extra}");
    assert!(
        f.message.starts_with(&format!(
            "rank 5 holds {} more at /home/c-kaitwang/assignment1/cs336_basics/optimizers.py:84 than the median rank",
            memlsp::findings::fmt_bytes(extra)
        )),
        "{}",
        f.message
    );
    assert!(f.evidence[0].text.contains("rank 5: "), "{:?}", f.evidence);
    // Within the thresholds, nothing: two ranks differing by less than 64 MiB are not skewed.
    let cmp = RankComparison::with_rows(vec![
        RankRow::of(Path::new("rank0.pickle"), 0, &same),
        RankRow::of(Path::new("rank1.pickle"), 1, &same),
    ]);
    assert!(cmp.skew(0).is_empty() && cmp.skew(1).is_empty());
}

/// Three real snapshots as the ranks of `dir/ranks`: that folder and the files.
fn rank_folder(dir: &Path) -> Option<(PathBuf, Vec<PathBuf>)> {
    let names = [
        "kkaitlyn111__memory_ctx128_fullstep.pickle",
        "kkaitlyn111__memory_ctx256_forward.pickle",
        "kkaitlyn111__memory_snapshot.pickle",
    ];
    let ranks = dir.join("ranks");
    std::fs::create_dir_all(&ranks).unwrap();
    let mut out = Vec::new();
    for (r, n) in names.iter().enumerate() {
        let src = common::shared(&format!("torch_snapshots/real/{n}"))?;
        let dst = ranks.join(format!("rank{r}_snapshot.pickle"));
        std::fs::copy(src, &dst).unwrap();
        out.push(dst);
    }
    Some((ranks, out))
}

fn pt012(findings: &Value) -> Vec<(String, Value, Value)> {
    findings
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "PT012")
        .map(|f| {
            (
                f["message"].as_str().unwrap().to_string(),
                f["file"].clone(),
                f["line"].clone(),
            )
        })
        .collect()
}

#[test]
fn compare_on_summaries_equals_report_dir_on_snapshots() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let Some((ranks, files)) = rank_folder(dir) else {
        return;
    };
    let r = memlsp(
        &["report", arg(&ranks), "--format", "json", "--jobs", "2"],
        dir,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc = r.json();
    let caps = doc["captures"].as_array().unwrap();
    assert_eq!(caps.len(), 3);
    // The comparison is written once; each rank names it.
    let groups = doc["rank_comparisons"].as_array().unwrap();
    assert_eq!(groups.len(), 1);
    for c in caps {
        assert_eq!(c["torch"]["rank_group"], 0);
        assert!(c["torch"].get("rank_comparison").is_none());
    }
    let cmp = &groups[0];
    let mut from_report = Vec::new();
    for c in caps {
        from_report.extend(pt012(&c["findings"]));
    }
    // The text prints the table once, with the first rank.
    let text = memlsp(&["report", arg(&ranks)], dir);
    assert_eq!(
        text.stdout.matches("Ranks (3 snapshots)").count(),
        1,
        "{}",
        text.stdout
    );
    assert!(
        text.stdout
            .contains("Ranks: this is rank 2 of 3 (the table is in the first rank's section)"),
        "{}",
        text.stdout
    );
    // --jobs 1 gives the same document.
    let one = memlsp(
        &["report", arg(&ranks), "--format", "json", "--jobs", "1"],
        dir,
    );
    assert_eq!(one.stdout, r.stdout);

    // Each rank analysed alone, where it was written; only the summaries move.
    let sums = dir.join("summaries");
    std::fs::create_dir_all(&sums).unwrap();
    for (i, f) in files.iter().enumerate() {
        let out = sums.join(format!("rank{i}.json"));
        let s = memlsp(
            &["report", arg(f), "--format", "json", "-o", arg(&out)],
            dir,
        );
        assert_eq!(s.code, 0, "{}", s.stderr);
        assert!(
            std::fs::metadata(&out).unwrap().len() < 1 << 20,
            "a summary is compact"
        );
    }
    let c = memlsp(&["compare", arg(&sums), "--format", "json"], dir);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let compared = c.json();
    assert_eq!(&compared["rank_comparison"], cmp);
    assert_eq!(pt012(&compared["findings"]), from_report);
    assert!(
        !from_report.is_empty(),
        "the forward-only ranks hold no optimizer state"
    );
    // The text form names the ranks and the skew.
    let t = memlsp(&["compare", arg(&sums)], dir);
    assert!(
        t.stdout
            .starts_with("Ranks (3 snapshots)\n  rank 0 rank0_snapshot.pickle"),
        "{}",
        t.stdout
    );
    assert!(
        t.stdout.contains("warning[PT012] rank 0 holds"),
        "{}",
        t.stdout
    );

    // --check on the folder compares the rank files too.
    let chk = memlsp(&["--check", arg(&ranks), "--format", "json"], dir);
    let mut from_check = Vec::new();
    for c in chk.json()["captures"].as_array().unwrap() {
        from_check.extend(pt012(&c["findings"]));
    }
    assert_eq!(from_check, from_report);
}

#[test]
fn compare_refuses_what_is_not_a_summary() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a.json"), "{\"x\": 1}").unwrap();
    std::fs::write(tmp.path().join("b.json"), "not json").unwrap();
    memlsp(&["compare", "a.json", "a.json"], tmp.path())
        .assert_one_line_error("not a `memlsp report --format json` summary");
    memlsp(&["compare", "b.json", "a.json"], tmp.path())
        .assert_one_line_error("b.json: at byte 1: not JSON");
}

/// The code blocks of docs/RANKS.md under `heading`, in order, as (language, body).
fn recipe_blocks(heading: &str) -> Vec<(String, String)> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/RANKS.md")).unwrap();
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("RANKS.md lacks {heading:?}"));
    let rest = &doc[start + heading.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut out = Vec::new();
    let mut it = section.split("```");
    it.next();
    while let (Some(block), _) = (it.next(), it.next()) {
        let (lang, body) = block.split_once('\n').unwrap();
        out.push((lang.trim().to_string(), body.to_string()));
    }
    out
}

/// The Slurm recipe of docs/RANKS.md runs as written, paths of a cluster replaced by a temporary
/// folder: the array's task script once per rank with `SLURM_ARRAY_TASK_ID`, then its
/// `compare`, giving the rank comparison `report DIR` gives on the snapshots. (The Ray recipe
/// runs on real Ray in python/tests/ray_recipe.py.)
#[test]
fn the_slurm_recipe_gives_what_report_dir_gives() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let Some((ranks, files)) = rank_folder(dir) else {
        return;
    };
    let r = memlsp(&["report", arg(&ranks), "--format", "json"], dir);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let want = r.json()["rank_comparisons"][0].clone();
    assert!(want.is_object(), "{want}");

    // memlsp on PATH, as on a cluster node.
    let bin = Path::new(env!("CARGO_BIN_EXE_memlsp")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let place = |s: &str| {
        s.replace("/scratch/job123/snapshots", arg(&ranks))
            .replace("/shared/job123", arg(&dir.join("shared")))
            .replace("range(1024)", &format!("range({})", files.len()))
    };

    let slurm = recipe_blocks("## Slurm");
    assert_eq!(slurm.len(), 2, "the task script and the compare step");
    for task in 0..files.len() {
        let out = std::process::Command::new("bash")
            .args(["-euc", &place(&slurm[0].1)])
            .env("SLURM_ARRAY_TASK_ID", task.to_string())
            .env("PATH", &path)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = std::process::Command::new("bash")
        .args(["-euc", &place(&slurm[1].1)])
        .env("PATH", &path)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.join("ranks.txt")).unwrap();
    assert!(text.starts_with("Ranks (3 snapshots)"), "{text}");
    let json: Value =
        serde_json::from_slice(&std::fs::read(dir.join("ranks.json")).unwrap()).unwrap();
    assert_eq!(json["rank_comparison"], want);

    // The Ray recipe runs on a real Ray cluster from the installed wheel, not here:
    // python/tests/ray_recipe.py, run by .ci/wheel.sh. Here: it is there, one Python block.
    let ray = recipe_blocks("## Ray");
    assert_eq!(ray.len(), 1);
    assert_eq!(ray[0].0, "python");
    assert!(ray[0].1.contains("ray.init()"), "{}", ray[0].1);
}

/// `report DIR` keeps every rank's report until all are read (each gains the comparison). Ranks
/// that run the same code keep one copy of each stack between them, not one each, and the locate
/// step keeps it one copy while it resolves the frames; what is shown does not change.
#[test]
fn ranks_running_the_same_code_keep_one_copy_of_each_stack() {
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let ranks = tmp.path().join("ranks");
    std::fs::create_dir_all(&ranks).unwrap();
    for (r, n) in [SNAP, SNAP, SNAP, "Yiyi-philosophy__oom_snapshot.pickle"]
        .iter()
        .enumerate()
    {
        let Some(src) = common::shared(&format!("torch_snapshots/real/{n}")) else {
            return;
        };
        std::fs::copy(src, ranks.join(format!("rank{r}_snapshot.pickle"))).unwrap();
    }
    // A workspace holding the training code, so the locate step resolves user frames.
    let ws = tmp.path().join("ws/cs336_basics");
    std::fs::create_dir_all(&ws).unwrap();
    for f in ["optimizers.py", "transformer.py", "training.py"] {
        std::fs::write(ws.join(f), "x = 1\n".repeat(120)).unwrap();
    }
    let mut opts = memlsp::options::Options::default();
    opts.locate.workspace = vec![tmp.path().join("ws")];
    opts.jobs = 2;
    let reports = memlsp::analyze::run(&ranks, &opts).unwrap();
    assert_eq!(reports.len(), 4);
    let alone = memlsp::analyze::run_file(&ranks.join("rank0_snapshot.pickle"), &opts).unwrap();

    let stacks = |r: &memlsp::report::CaptureReport| -> Vec<memlsp::findings::Stack> {
        let sites = r.sites.iter().map(|s| s.stack.clone());
        sites
            .chain(r.findings.iter().map(|f| f.stack.clone()))
            .collect()
    };
    let first = stacks(&reports[0]);
    assert!(first.iter().filter(|s| !s.is_empty()).count() >= 5);
    assert!(
        first
            .iter()
            .flat_map(|s| s.iter())
            .any(|l| l.resolved.is_some()),
        "the locate step resolved frames of the training code"
    );
    // As shown: the same frames, resolved the same way, as the snapshot reported alone.
    assert_eq!(first, stacks(&alone));
    for r in &reports[1..3] {
        let same = stacks(r);
        assert_eq!(same.len(), first.len());
        for (a, b) in first.iter().zip(&same) {
            assert!(
                a.is_empty() || Arc::ptr_eq(a, b),
                "{}: a stack of {} frames kept twice",
                r.path.display(),
                a.len()
            );
        }
    }
    // The other program's ranks keep their own stacks; one stack that is both a site's and a
    // finding's there (its OOM's culprit) is kept once.
    let other = stacks(&reports[3]);
    assert!(other.iter().any(|s| !s.is_empty() && !first.contains(s)));
    let r3 = &reports[3];
    let mut shared = 0;
    for f in r3.findings.iter().filter(|f| !f.stack.is_empty()) {
        if let Some(s) = r3.sites.iter().find(|s| s.stack == f.stack) {
            assert!(
                Arc::ptr_eq(&s.stack, &f.stack),
                "{:?} keeps its own copy",
                f.code
            );
            shared += 1;
        }
    }
    assert_eq!(shared, 1, "the OOM finding's stack is its site's");
}
