//! The verdict table: `tests/real_verdicts.toml` says, for every real PyTorch snapshot in
//! `../shared`, which findings (information or above) an expert expects — code, line and the
//! gist of the fix — with the trace evidence in a comment. A finding nobody expected fails, an
//! expected one that is missing fails, a file the table does not judge fails.

mod common;
#[path = "support/verdict_table.rs"]
mod verdict_table;

use std::collections::BTreeSet;

use memlsp::findings::Severity;
use memlsp::options::Options;

#[derive(Debug, Default)]
struct Expected {
    code: String,
    line: u32,
    fix: String,
}

#[derive(Debug, Default)]
struct Entry {
    file: String,
    findings: Vec<Expected>,
}

/// The table's rows; a key the table should not have fails.
fn parse(text: &str) -> Vec<Entry> {
    verdict_table::parse(text, "snapshot")
        .into_iter()
        .map(|t| {
            for k in t.keys.keys() {
                assert_eq!(k, "file", "unknown key {k} on a snapshot");
            }
            Entry {
                file: t.keys.get("file").cloned().unwrap_or_default(),
                findings: t
                    .findings
                    .into_iter()
                    .map(|mut f| {
                        let e = Expected {
                            code: verdict_table::take(&mut f, "code"),
                            line: verdict_table::take(&mut f, "line")
                                .parse()
                                .expect("line is a number"),
                            fix: verdict_table::take(&mut f, "fix"),
                        };
                        assert!(f.is_empty(), "unknown keys on a finding: {f:?}");
                        e
                    })
                    .collect(),
            }
        })
        .collect()
}

#[test]
fn every_real_snapshot_gets_the_findings_an_expert_expects() {
    let Some(dir) = common::shared("torch_snapshots") else {
        return;
    };
    let table = parse(include_str!("real_verdicts.toml"));
    // Every real snapshot and every series capture is judged.
    let mut on_disk = BTreeSet::new();
    for e in std::fs::read_dir(dir.join("real")).unwrap().flatten() {
        on_disk.insert(format!("real/{}", e.file_name().to_string_lossy()));
    }
    for s in std::fs::read_dir(dir.join("series")).unwrap().flatten() {
        if !s.path().is_dir() {
            continue;
        }
        for e in std::fs::read_dir(s.path()).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".pickle") {
                on_disk.insert(format!("series/{}/{name}", s.file_name().to_string_lossy()));
            }
        }
    }
    verdict_table::assert_all_judged(
        &on_disk,
        table.iter().map(|e| &e.file),
        "real_verdicts.toml",
    );
    assert!(on_disk.len() >= 42, "{} snapshots", on_disk.len());

    let mut problems = Vec::new();
    for entry in &table {
        let path = dir.join(&entry.file);
        let r = memlsp::analyze::run_file(&path, &Options::default())
            .unwrap_or_else(|e| panic!("{}: {e}", entry.file));
        let mut got: Vec<(String, u32, String)> = r
            .findings
            .iter()
            .filter(|f| f.severity >= Severity::Information)
            .map(|f| {
                (
                    f.code.to_string(),
                    f.location.as_ref().map_or(0, |l| l.line),
                    f.fixes.first().map(|x| x.title.clone()).unwrap_or_default(),
                )
            })
            .collect();
        for want in &entry.findings {
            match got
                .iter()
                .position(|(c, l, _)| *c == want.code && *l == want.line)
            {
                Some(i) => {
                    let (_, _, fix) = got.remove(i);
                    if !fix.contains(&want.fix) {
                        problems.push(format!(
                            "{}: {} at line {} fixes with {fix:?}, expected it to say {:?}",
                            entry.file, want.code, want.line, want.fix
                        ));
                    }
                }
                None => problems.push(format!(
                    "{}: expected {} at line {} is missing",
                    entry.file, want.code, want.line
                )),
            }
        }
        for (code, line, _) in got {
            problems.push(format!("{}: unexpected {code} at line {line}", entry.file));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
