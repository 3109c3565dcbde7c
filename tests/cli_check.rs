//! `--check` on real captures and on the bundled fixtures: exit codes, formats, the oracle's
//! numbers through the CLI.

mod common;

use std::path::{Path, PathBuf};

use common::shared;
use common::{arg, memlsp};
use serde_json::Value;

/// A workspace with the JAX program under `jax/`, as a user's checkout would hold it.
fn jax_workspace(name: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    let dir = shared(&format!("jax_cpu_captures/{name}"))?;
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("jax")).unwrap();
    std::fs::copy(
        dir.join(format!("{name}.py")),
        ws.path().join(format!("jax/{name}.py")),
    )
    .unwrap();
    Some((ws, dir.join(format!("{name}.xplane.pb"))))
}

fn findings(doc: &Value) -> Vec<&Value> {
    doc["captures"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["findings"].as_array().unwrap())
        .collect()
}

#[test]
fn undonated_jit_is_a_warning_with_a_donate_edit() {
    let Some((ws, capture)) = jax_workspace("b_mlp_nodonate") else {
        return;
    };
    let run = memlsp(&["--check", arg(&capture), "--format", "json"], ws.path());
    assert_eq!(
        run.code, 1,
        "a warning fails the default --fail-on; {}",
        run.stderr
    );
    assert_eq!(run.stderr, "");
    let doc = run.json();
    let jx005: Vec<&Value> = findings(&doc)
        .into_iter()
        .filter(|f| f["code"] == "JX005")
        .collect();
    assert_eq!(jx005.len(), 1, "{doc:#}");
    let f = jx005[0];
    assert_eq!(f["severity"], "warning");
    assert_eq!(f["file"], "jax/b_mlp_nodonate.py");
    assert_eq!(f["line"], 57);
    let edits: Vec<&Value> = f["fixes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x.get("edit"))
        .flat_map(|e| e.as_array().unwrap())
        .collect();
    assert_eq!(edits.len(), 1, "{f:#}");
    assert_eq!(edits[0]["file"], "jax/b_mlp_nodonate.py");
    assert_eq!(edits[0]["line"], 57);
    assert!(
        edits[0]["new_text"]
            .as_str()
            .unwrap()
            .starts_with(", donate_argnums=("),
        "{}",
        edits[0]
    );

    let gh = memlsp(&["--check", arg(&capture), "--format", "github"], ws.path());
    assert_eq!(gh.code, 1);
    assert!(
        gh.stdout
            .lines()
            .any(|l| l
                .starts_with("::warning file=jax/b_mlp_nodonate.py,line=57,title=memlsp JX005::")),
        "{}",
        gh.stdout
    );
    let text = memlsp(&["--check", arg(&capture)], ws.path());
    assert!(
        text.stdout
            .lines()
            .any(|l| l.starts_with("jax/b_mlp_nodonate.py:57: warning[JX005] ")),
        "{}",
        text.stdout
    );
    // Only errors fail the build when asked.
    let lenient = memlsp(&["--check", arg(&capture), "--fail-on", "error"], ws.path());
    let has_error = findings(&doc).iter().any(|f| f["severity"] == "error");
    assert_eq!(lenient.code, i32::from(has_error));
}

#[test]
fn donated_twin_passes() {
    let Some((ws, capture)) = jax_workspace("c_mlp_donate") else {
        return;
    };
    let run = memlsp(&["--check", arg(&capture), "--format", "json"], ws.path());
    let doc = run.json();
    assert!(
        findings(&doc).iter().all(|f| f["code"] != "JX005"),
        "a donated step has no JX005: {doc:#}"
    );
    assert_eq!(run.code, 0, "{doc:#}");
}

/// Every SARIF result names a rule of the run, with a location and a valid level.
fn assert_valid_sarif(doc: &Value) {
    assert_eq!(doc["version"], "2.1.0");
    let run = &doc["runs"][0];
    let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
    for r in rules {
        let id = r["id"].as_str().unwrap();
        assert_eq!(
            r["helpUri"],
            memlsp::findings::Code::parse(id).unwrap().docs_url()
        );
    }
    for res in run["results"].as_array().unwrap() {
        let idx = res["ruleIndex"].as_u64().unwrap() as usize;
        assert_eq!(rules[idx]["id"], res["ruleId"]);
        assert!(["error", "warning", "note"].contains(&res["level"].as_str().unwrap()));
        assert!(!res["message"]["text"].as_str().unwrap().is_empty());
        let loc = &res["locations"][0]["physicalLocation"];
        assert!(loc["artifactLocation"]["uri"].as_str().is_some(), "{res}");
        if let Some(line) = loc["region"]["startLine"].as_u64() {
            assert!(line >= 1);
        }
    }
}

#[test]
fn all_jax_captures_as_sarif() {
    let Some(dir) = shared("jax_cpu_captures") else {
        return;
    };
    let ws = tempfile::tempdir().unwrap();
    let run = memlsp(&["--check", arg(&dir), "--format", "sarif"], ws.path());
    assert_ne!(run.code, 2, "{}", run.stderr);
    let doc = run.json();
    assert_valid_sarif(&doc);
    assert_eq!(
        doc["runs"][0]["invocations"][0]["executionSuccessful"],
        true
    );
}

/// Torch totals of every real snapshot equal the oracle's `memory.overall`.
#[test]
fn real_torch_snapshots_match_the_oracle() {
    let (Some(real), Some(oracle)) = (
        shared("torch_snapshots/real"),
        shared("torch_snapshots/oracle"),
    ) else {
        return;
    };
    let ws = tempfile::tempdir().unwrap();
    let run = memlsp(&["--check", arg(&real), "--format", "json"], ws.path());
    assert_ne!(run.code, 2, "{}", run.stderr);
    let doc = run.json();
    let captures = doc["captures"].as_array().unwrap();
    assert_eq!(captures.len(), 39);
    for c in captures {
        let path = c["path"].as_str().unwrap();
        assert_eq!(c["kind"], "torch-snapshot");
        assert!(!c["headline"].as_str().unwrap().is_empty(), "{path}");
        let name = Path::new(path).file_name().unwrap().to_str().unwrap();
        let want: Value = serde_json::from_str(
            &std::fs::read_to_string(oracle.join(format!("{name}.json"))).unwrap(),
        )
        .unwrap();
        let (got, want) = (&c["torch"]["totals"], &want["memory"]["overall"]);
        for key in [
            "reserved_bytes",
            "allocated_bytes",
            "pending_free_bytes",
            "inactive_bytes",
            "requested_bytes",
            "segment_count",
        ] {
            assert_eq!(got[key], want[key], "{name}: {key}");
        }
        for f in c["findings"].as_array().unwrap() {
            assert!(f["code"].as_str().unwrap().starts_with("PT"), "{f}");
            for e in f["evidence"].as_array().unwrap() {
                // DESIGN.md's four labels (a replayed setting is `simulated` evidence).
                assert!(
                    ["measured", "read", "inferred", "simulated"]
                        .contains(&e["label"].as_str().unwrap()),
                    "{e}"
                );
            }
        }
    }
    assert_valid_sarif(&memlsp(&["--check", arg(&real), "--format", "sarif"], ws.path()).json());
}

#[test]
fn path_map_overrides_the_suffix_match() {
    let Some((ws, capture)) = jax_workspace("b_mlp_nodonate") else {
        return;
    };
    std::fs::create_dir(ws.path().join("src")).unwrap();
    std::fs::copy(
        ws.path().join("jax/b_mlp_nodonate.py"),
        ws.path().join("src/b_mlp_nodonate.py"),
    )
    .unwrap();
    let jx005 = |extra: &[&str]| -> Option<(String, String)> {
        let mut args = vec!["--check", arg(&capture), "--format", "json"];
        args.extend_from_slice(extra);
        let run = memlsp(&args, ws.path());
        let doc = run.json();
        let f = findings(&doc).into_iter().find(|f| f["code"] == "JX005")?;
        let notes = f["evidence"].to_string();
        Some((f["file"].as_str()?.to_string(), notes))
    };
    let jx005_file = |extra: &[&str]| jx005(extra).map(|(file, _)| file);
    let Some((guessed, notes)) = jx005(&[]) else {
        return;
    };
    // Two workspace files share the recorded file name and nothing else: no guess, a note
    // naming both.
    assert_eq!(guessed, "/srv/jaxdemo/b_mlp_nodonate.py");
    assert!(
        notes.contains("only its file name matches, and 2 files share it (jax/b_mlp_nodonate.py, src/b_mlp_nodonate.py)"),
        "{notes}"
    );
    assert_eq!(
        jx005_file(&["--path-map", "/srv/jaxdemo=src"]).as_deref(),
        Some("src/b_mlp_nodonate.py")
    );
}
