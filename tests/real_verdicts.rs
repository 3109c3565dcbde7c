//! The verdict table: `tests/real_verdicts.toml` says, for every real PyTorch snapshot in
//! `../shared`, which findings (information or above) an expert expects — code, line and the
//! gist of the fix — with the trace evidence in a comment. A finding nobody expected fails, an
//! expected one that is missing fails, a file the table does not judge fails.

mod common;

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

/// The table's subset of TOML: `[[snapshot]]`, `[[snapshot.finding]]`, `key = "str"` or
/// `key = int`, comments.
fn parse(text: &str) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line {
            "[[snapshot]]" => out.push(Entry::default()),
            "[[snapshot.finding]]" => out
                .last_mut()
                .unwrap_or_else(|| panic!("line {}: finding before a snapshot", n + 1))
                .findings
                .push(Expected::default()),
            _ => {
                let (k, v) = line
                    .split_once('=')
                    .unwrap_or_else(|| panic!("line {}: not `key = value`: {line}", n + 1));
                let (k, v) = (k.trim(), v.trim());
                let s = v.trim_matches('"').to_string();
                let e = out.last_mut().expect("a key before any snapshot");
                match (k, e.findings.last_mut()) {
                    ("file", _) => e.file = s,
                    ("code", Some(f)) => f.code = s,
                    ("line", Some(f)) => f.line = v.parse().expect("line is a number"),
                    ("fix", Some(f)) => f.fix = s,
                    _ => panic!("line {}: unknown key {k}", n + 1),
                }
            }
        }
    }
    out
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
    let judged: BTreeSet<String> = table.iter().map(|e| e.file.clone()).collect();
    let unjudged: Vec<_> = on_disk.difference(&judged).collect();
    assert!(
        unjudged.is_empty(),
        "not in real_verdicts.toml: {unjudged:?}"
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
