//! The JAX verdict table: `tests/real_verdicts_jax.toml` says, for every JAX capture in
//! `../shared`, which module the report must diagnose and which findings (information or above)
//! an expert expects — code, line, severity and the gist of the fix — with the plan evidence in
//! a comment. A finding nobody expected fails, an expected one that is missing fails, a capture
//! the table does not judge fails, and a finding marked `known_wrong` that is no longer emitted
//! fails (the table must then drop it).

mod common;
#[path = "support/verdict_table.rs"]
mod verdict_table;

use std::collections::BTreeSet;
use std::path::Path;

use memlsp::findings::Severity;
use memlsp::options::Options;

#[derive(Debug, Default)]
struct Expected {
    code: String,
    line: u32,
    severity: String,
    fix: String,
    known_wrong: Option<String>,
}

#[derive(Debug, Default)]
struct Entry {
    file: String,
    module: String,
    findings: Vec<Expected>,
}

/// The table's rows; a key the table should not have fails.
fn parse(text: &str) -> Vec<Entry> {
    verdict_table::parse(text, "capture")
        .into_iter()
        .map(|mut t| {
            let file = verdict_table::take(&mut t.keys, "file");
            let module = verdict_table::take(&mut t.keys, "module");
            assert!(t.keys.is_empty(), "unknown keys on a capture: {:?}", t.keys);
            Entry {
                file,
                module,
                findings: t
                    .findings
                    .into_iter()
                    .map(|mut f| {
                        let e = Expected {
                            code: verdict_table::take(&mut f, "code"),
                            line: verdict_table::take(&mut f, "line")
                                .parse()
                                .expect("line is a number"),
                            severity: verdict_table::take(&mut f, "severity"),
                            fix: verdict_table::take(&mut f, "fix"),
                            known_wrong: f.remove("known_wrong"),
                        };
                        assert!(f.is_empty(), "unknown keys on a finding: {f:?}");
                        e
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Every `.xplane.pb` under `dir`, relative to `root`.
fn captures(root: &Path, dir: &str, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return;
    };
    for e in entries.flatten() {
        let rel = format!("{dir}/{}", e.file_name().to_string_lossy());
        if e.path().is_dir() {
            captures(root, &rel, out);
        } else if rel.ends_with(".xplane.pb") {
            out.insert(rel);
        }
    }
}

#[test]
fn every_jax_capture_gets_the_findings_an_expert_expects() {
    let Some(root) = common::shared_dir() else {
        common::skip("../shared is absent (set MEMLSP_SHARED to the shared folder)");
        return;
    };
    if common::shared("jax_cpu_captures").is_none() || common::shared("jax-real-captures").is_none()
    {
        return;
    }
    let table = parse(include_str!("real_verdicts_jax.toml"));
    let mut on_disk = BTreeSet::new();
    captures(&root, "jax_cpu_captures", &mut on_disk);
    captures(&root, "jax-real-captures", &mut on_disk);
    verdict_table::assert_all_judged(
        &on_disk,
        table.iter().map(|e| &e.file),
        "real_verdicts_jax.toml",
    );
    assert!(on_disk.len() >= 16, "{} captures", on_disk.len());

    let mut problems = Vec::new();
    for entry in &table {
        let r = memlsp::analyze::run_file(&root.join(&entry.file), &Options::default())
            .unwrap_or_else(|e| panic!("{}: {e}", entry.file));
        let diagnosed = module(&r);
        let scopes: BTreeSet<&str> = r
            .findings
            .iter()
            .filter_map(|f| f.scope.as_deref())
            .collect();
        if diagnosed != entry.module || scopes.iter().any(|m| *m != entry.module) {
            problems.push(format!(
                "{}: diagnosed {diagnosed:?} (findings on {scopes:?}), expected {:?}",
                entry.file, entry.module
            ));
        }
        let mut got: Vec<(String, u32, Severity, String)> = r
            .findings
            .iter()
            .filter(|f| f.severity >= Severity::Information)
            .map(|f| {
                (
                    f.code.to_string(),
                    f.location.as_ref().map_or(0, |l| l.line),
                    f.severity,
                    f.fixes.first().map(|x| x.title.clone()).unwrap_or_default(),
                )
            })
            .collect();
        for want in &entry.findings {
            let Some(i) = got
                .iter()
                .position(|(c, l, _, _)| *c == want.code && *l == want.line)
            else {
                problems.push(match &want.known_wrong {
                    Some(_) => format!(
                        "{}: {} at line {} (known wrong) is no longer emitted: drop it from the \
                         table",
                        entry.file, want.code, want.line
                    ),
                    None => format!(
                        "{}: expected {} at line {} is missing",
                        entry.file, want.code, want.line
                    ),
                });
                continue;
            };
            let (_, _, severity, fix) = got.remove(i);
            if severity.as_str() != want.severity {
                problems.push(format!(
                    "{}: {} at line {} is {}, expected {}",
                    entry.file,
                    want.code,
                    want.line,
                    severity.as_str(),
                    want.severity
                ));
            }
            if !fix.contains(&want.fix) {
                problems.push(format!(
                    "{}: {} at line {} fixes with {fix:?}, expected it to say {:?}",
                    entry.file, want.code, want.line, want.fix
                ));
            }
        }
        for (code, line, _, _) in got {
            problems.push(format!("{}: unexpected {code} at line {line}", entry.file));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The module the report diagnosed (`xla.module` in the JSON); empty without a plan.
fn module(r: &memlsp::report::CaptureReport) -> String {
    match &r.engine {
        memlsp::report::Engine::Xla(s) => s.module.clone().unwrap_or_default(),
        memlsp::report::Engine::Torch(_) => panic!("{}: not a JAX capture", r.path.display()),
    }
}

/// The JX010 saving on h_eval_and_train is a bound read from the plan: the 128 MiB output, less
/// at most one 4-byte value per row, and the finding's numbers carry their labels.
#[test]
fn the_eval_output_finding_states_a_bound_from_the_plan() {
    let Some(path) = common::shared("jax_cpu_captures/h_eval_and_train/h_eval_and_train.xplane.pb")
    else {
        return;
    };
    let r = memlsp::analyze::run_file(&path, &Options::default()).unwrap();
    let f = r
        .findings
        .iter()
        .find(|f| f.code.as_str() == "JX010")
        .expect("JX010 on h_eval_and_train");
    assert_eq!(f.bytes, Some(128 << 20));
    assert_eq!(f.bytes_label, Some(memlsp::findings::Label::Read));
    assert!(f.message.contains("f32[8192,4096]"), "{}", f.message);
    assert!(f.message.contains("line 43"), "{}", f.message);
    let fix = &f.fixes[0];
    assert_eq!(fix.saving_range, Some(((128 << 20) - 8192 * 4, 128 << 20)));
    assert!(fix.title.contains("at most 128.00 MiB"), "{}", fix.title);
}

/// JX010 is specific: over every module with a plan in every shared JAX capture (184 modules:
/// train steps, initialisers, eager per-op jits, a matmul and a conv benchmark whose only output
/// is their matrix) it fires on h_eval_and_train's eval step alone.
#[test]
fn the_eval_output_finding_fires_on_the_eval_step_alone() {
    let Some(root) = common::shared_dir() else {
        common::skip("../shared is absent (set MEMLSP_SHARED to the shared folder)");
        return;
    };
    let mut files = BTreeSet::new();
    captures(&root, "jax_cpu_captures", &mut files);
    captures(&root, "jax-real-captures", &mut files);
    let (mut modules, mut hits) = (0, Vec::new());
    for file in &files {
        let path = root.join(file);
        let r = memlsp::analyze::run_file(&path, &Options::default()).unwrap();
        let memlsp::report::Engine::Xla(s) = &r.engine else {
            panic!("{file}: not a JAX capture")
        };
        let memlsp::xla::summary::Modules::List(rows) = &s.modules else {
            continue;
        };
        for row in rows {
            modules += 1;
            let mut opts = Options::default();
            opts.analysis.module = Some(row.module.clone());
            let r = memlsp::analyze::run_file(&path, &opts).unwrap();
            if r.findings.iter().any(|f| f.code.as_str() == "JX010") {
                hits.push(format!("{file} {}", row.module));
            }
        }
    }
    assert!(modules >= 150, "{modules} modules");
    assert_eq!(
        hits,
        ["jax_cpu_captures/h_eval_and_train/h_eval_and_train.xplane.pb jit_eval_step(34)"]
    );
}
