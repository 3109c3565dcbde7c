//! Golden outputs: what a user sees from `memlsp report` (text and JSON) and `memlsp --check`
//! (text, JSON, SARIF, GitHub) on every bundled fixture and every real capture in `../shared`,
//! compared byte for byte with the files under `tests/golden/`.
//!
//! A change that alters output fails here; after checking the diff, bless it with
//! `MEMLSP_BLESS=1 cargo test --test golden` and explain it in the commit message.

mod common;

use std::path::{Path, PathBuf};

use common::memlsp;

const GOLDEN: &str = "tests/golden";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Machine-specific parts of an output replaced by stable placeholders.
fn normalise(out: &str, shared: Option<&Path>) -> String {
    let mut s = out.to_string();
    if let Some(sh) = shared {
        let abs = std::fs::canonicalize(sh).unwrap_or_else(|_| sh.to_path_buf());
        s = s.replace(&abs.to_string_lossy().into_owned(), "<shared>");
        s = s.replace(&sh.to_string_lossy().into_owned(), "<shared>");
    }
    let root = repo();
    let abs = std::fs::canonicalize(&root).unwrap_or(root);
    s.replace(&abs.to_string_lossy().into_owned(), "<repo>")
}

/// One golden file: `args` run from the repository root.
struct Case {
    name: String,
    args: Vec<String>,
}

fn case(name: impl Into<String>, args: &[&str]) -> Case {
    Case {
        name: name.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
    }
}

/// Every capture file below `dir` (sorted), relative to the repository root when possible.
fn captures(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if memlsp::analyze::detect_kind(&p).is_some() {
                out.push(p.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// The golden file name of a capture: its path below the repository or `shared`, `/` → `__`.
fn stem(path: &str, shared: Option<&Path>) -> String {
    let rel = match shared {
        Some(sh) => path
            .strip_prefix(&*sh.to_string_lossy())
            .unwrap_or(path)
            .trim_start_matches('/'),
        None => path,
    };
    rel.replace('/', "__")
}

fn report_cases(files: &[String], shared: Option<&Path>) -> Vec<Case> {
    let mut out = Vec::new();
    for f in files {
        let name = stem(f, shared);
        out.push(case(format!("report/{name}.txt"), &["report", f]));
        out.push(case(
            format!("report/{name}.json"),
            &["report", f, "--format", "json"],
        ));
    }
    out
}

fn run_cases(cases: &[Case], shared: Option<&Path>) {
    let bless = std::env::var_os("MEMLSP_BLESS").is_some();
    let mut failures = Vec::new();
    for c in cases {
        let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
        let run = memlsp(&args, &repo());
        let mut got = normalise(&run.stdout, shared);
        if !run.stderr.is_empty() || run.code != 0 {
            got.push_str(&format!(
                "--- exit {} ---\n{}",
                run.code,
                normalise(&run.stderr, shared)
            ));
        }
        let path = repo().join(GOLDEN).join(&c.name);
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(want) if want == got => {}
            Ok(want) => {
                let line = want
                    .lines()
                    .zip(got.lines())
                    .position(|(a, b)| a != b)
                    .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
                failures.push(format!(
                    "{} differs from `memlsp {}` at line {}:\n  want: {}\n  got:  {}",
                    c.name,
                    c.args.join(" "),
                    line + 1,
                    want.lines().nth(line).unwrap_or("<end>"),
                    got.lines().nth(line).unwrap_or("<end>")
                ));
            }
            Err(_) => failures.push(format!(
                "{}: no golden file (run with MEMLSP_BLESS=1)",
                c.name
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} outputs changed (bless with MEMLSP_BLESS=1 after checking):\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn fixtures_report_and_check_outputs_are_unchanged() {
    let mut files = captures(Path::new("fixtures"));
    files.retain(|f| !f.contains("/ranks/"));
    let mut cases = report_cases(&files, None);
    cases.push(case(
        "report/fixtures__torch__ranks.txt",
        &["report", "fixtures/torch/ranks"],
    ));
    cases.push(case(
        "report/fixtures__torch__ranks.json",
        &["report", "fixtures/torch/ranks", "--format", "json"],
    ));
    for format in ["text", "json"] {
        cases.push(case(
            format!(
                "report/fixtures__torch__pt011_diff.{}",
                if format == "text" { "txt" } else { "json" }
            ),
            &[
                "report",
                "fixtures/torch/pt011_step10.pickle",
                "--diff",
                "fixtures/torch/pt011_step20.pickle",
                "--format",
                format,
            ],
        ));
    }
    for format in ["text", "json", "sarif", "github"] {
        cases.push(case(
            format!("check/fixtures.{format}"),
            &[
                "--check",
                "fixtures",
                "--format",
                format,
                "--fail-on",
                "error",
            ],
        ));
    }
    run_cases(&cases, None);
}

#[test]
fn shared_captures_report_outputs_are_unchanged() {
    let Some(shared) = common::shared("") else {
        return;
    };
    let rel = if shared == repo().join("../shared/") || shared == repo().join("../shared") {
        PathBuf::from("../shared")
    } else {
        shared.clone()
    };
    let mut files = Vec::new();
    for sub in [
        "torch_snapshots/real",
        "jax_cpu_captures",
        "jax-real-captures",
    ] {
        files.extend(captures(&rel.join(sub)));
    }
    assert!(files.len() >= 39 + 8 + 8, "{} captures found", files.len());
    let cases = report_cases(&files, Some(&rel));
    run_cases(&cases, Some(&rel));
}
