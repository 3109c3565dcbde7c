//! A folder where something cannot be read (issue 31): `report DIR` and `compare DIR` report
//! the rest and name what failed, as `--check` does.

mod common;
#[path = "support/shared.rs"]
mod support;

use std::path::Path;

/// Three real snapshots as ranks 0–2 of one job, rank 1 cut in half.
fn ranks_with_a_truncated_one(dir: &Path) -> bool {
    let real = [
        "torch_snapshots/real/Charran78__dump_snapshot.pickle",
        "torch_snapshots/real/MAGMA27__memory_snapshot.pickle",
        "torch_snapshots/real/JasperSolt__snapshot.pickle",
    ];
    for (rank, rel) in real.iter().enumerate() {
        let Some(src) = support::shared(rel) else {
            return false;
        };
        let mut bytes = std::fs::read(src).unwrap();
        if rank == 1 {
            bytes.truncate(bytes.len() / 2);
        }
        std::fs::write(dir.join(format!("rank{rank}_snapshot.pickle")), bytes).unwrap();
    }
    true
}

#[test]
fn report_dir_reports_the_good_ranks_and_names_the_truncated_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("job");
    std::fs::create_dir(&dir).unwrap();
    if !ranks_with_a_truncated_one(&dir) {
        return;
    }
    let r = common::memlsp(&["report", "job", "--format", "json"], tmp.path());
    assert_eq!(r.code, 2, "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].contains("rank1_snapshot.pickle"), "{}", r.stderr);
    let doc = r.json();
    let paths: Vec<&str> = doc["captures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(paths[0].ends_with("rank0_snapshot.pickle"), "{paths:?}");
    assert!(paths[1].ends_with("rank2_snapshot.pickle"), "{paths:?}");
    // The good ranks are compared with each other.
    let rows = doc["rank_comparisons"][0]["ranks"].as_array().map(Vec::len);
    assert_eq!(rows, Some(2), "{}", doc["rank_comparisons"]);
    let errors = doc["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1);
    assert!(errors[0].to_string().contains("rank1_snapshot.pickle"));
    // The text report too, on several jobs.
    let t = common::memlsp(&["report", "job", "-j", "2"], tmp.path());
    assert_eq!(t.code, 2, "{}", t.stderr);
    assert!(t.stdout.contains("rank0_snapshot.pickle"), "{}", t.stdout);
    assert!(t.stdout.contains("rank2_snapshot.pickle"), "{}", t.stdout);
    assert!(t.stderr.contains("rank1_snapshot.pickle"), "{}", t.stderr);
}

#[test]
fn compare_dir_compares_the_readable_summaries_and_names_the_bad_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("job");
    std::fs::create_dir(&dir).unwrap();
    let sums = tmp.path().join("sums");
    std::fs::create_dir(&sums).unwrap();
    let real = [
        "torch_snapshots/real/Charran78__dump_snapshot.pickle",
        "torch_snapshots/real/MAGMA27__memory_snapshot.pickle",
        "torch_snapshots/real/JasperSolt__snapshot.pickle",
    ];
    for (rank, rel) in real.iter().enumerate() {
        let Some(src) = support::shared(rel) else {
            return;
        };
        let snap = dir.join(format!("rank{rank}_snapshot.pickle"));
        std::fs::copy(src, &snap).unwrap();
        let out = sums.join(format!("rank{rank}.json"));
        let r = common::memlsp(
            &[
                "report",
                common::arg(&snap),
                "--format",
                "json",
                "-o",
                common::arg(&out),
            ],
            tmp.path(),
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    let bad = sums.join("rank1.json");
    let text = std::fs::read(&bad).unwrap();
    std::fs::write(&bad, &text[..text.len() / 2]).unwrap();
    let r = common::memlsp(&["compare", "sums", "--format", "json"], tmp.path());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("rank1.json"), "{}", r.stderr);
    let doc = r.json();
    let ranks = doc["rank_comparison"]["ranks"].as_array().map(Vec::len);
    assert_eq!(ranks, Some(2), "{}", doc["rank_comparison"]);
}
