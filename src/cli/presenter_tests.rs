//! The presenters on a hand-built report: what a user sees in each format.

use std::path::Path;

use serde_json::{Value, json};

use crate::findings::{Code, Evidence, Finding, Fix, FixKind, Label, Location, Severity};
use crate::frames::FrameFilter;
use crate::options::LocateOptions;
use crate::report::{CaptureReport, Engine, PercentOf, Site, SiteFrame, SiteRole};
use crate::source::locate::Locator;

use super::check::exit_code;
use crate::present::json;
use crate::present::{github, sarif, text};

const TRAIN: &str =
    "import torch\n\ntotal = 0\nfor x in data:\n    loss = model(x).sum()\n    total += loss\n";

fn loc(file: &str, line: u32, function: &str) -> Location {
    Location::new(file, line, function)
}

/// A workspace holding `train.py`, and a report whose frames were recorded on another machine.
fn fixture() -> (tempfile::TempDir, Locator, CaptureReport) {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("train.py"), TRAIN).unwrap();
    let locator = Locator::new(
        &LocateOptions {
            workspace: vec![ws.path().to_path_buf()],
            path_mappings: vec![],
        },
        FrameFilter::default(),
    );
    let culprit = loc("/home/u/proj/train.py", 6, "<module>");
    let torch_frame = loc(
        "/opt/conda/lib/python3.11/site-packages/torch/_tensor.py",
        522,
        "backward",
    );
    let leak = Finding::new(
        Code::PT002,
        Severity::Warning,
        "`loss` keeps the autograd graph alive: 1.00 GiB (40.0%) of live memory",
    )
    .at(
        Some(culprit.clone()),
        vec![culprit.clone(), loc("/home/u/proj/run.py", 3, "main")],
    )
    .bytes(1 << 30, Some(40.0), Label::Measured)
    .evidence(Evidence::measured(
        "120 activation blocks from step 1 are still live at step 5",
    ))
    .evidence(Evidence::inferred("the loss is accumulated without detach"))
    .fix(
        Fix::new(
            "Accumulate `loss.detach()`",
            FixKind::DetachAccumulated { item: false },
        )
        .saving(1 << 30)
        .preferred(),
    )
    .fix(Fix::advice("Look for retain_graph=True"));
    let oom = Finding::new(
        Code::PT009,
        Severity::Error,
        "allocation of 2.00 GiB failed with 512.00 MiB free",
    )
    .bytes(2 << 30, None, Label::Measured)
    .evidence(Evidence::measured("1 OOM event in the trace"));
    let snap = crate::torch::model::Snapshot::default();
    let a = crate::torch::analyse(&snap, &Default::default());
    let mut summary = crate::torch::summary::summarize(&snap, &a, 10);
    summary.totals.memory.reserved_bytes = 3 << 30;
    let report = CaptureReport {
        path: ws.path().join("runs/step5.pickle"),
        engine: Engine::Torch(Box::new(summary)),
        sites: vec![Site {
            location: Some(culprit.clone()),
            bytes: 1 << 30,
            requested_bytes: Some(1 << 30),
            blocks: 120,
            percent: 40.0,
            percent_of: PercentOf::LiveMemory,
            label: Label::Measured,
            stack: vec![torch_frame, culprit].into(),
            callers: vec![],
            frame: SiteFrame::User,
            role: Some(SiteRole::Activation),
            scope: None,
            reference_line: None,
            carried_by: None,
        }],
        findings: vec![oom, leak],
        shown_path: None,
    };
    (ws, locator, report)
}

#[test]
fn fixes_get_edits_against_the_workspace_file() {
    let (ws, locator, mut report) = fixture();
    locator.locate(&mut report);
    let fixes = &report.findings[1].fixes;
    let edit = fixes[0].edit.as_ref().expect("the detach fix has an edit");
    assert_eq!(edit.len(), 1);
    assert_eq!(
        Path::new(&edit[0].file),
        ws.path().join("train.py").as_path()
    );
    assert_eq!(
        (edit[0].line, edit[0].start_col, edit[0].end_col),
        (6, 17, 17)
    );
    assert_eq!(edit[0].new_text, ".detach()");
    assert_eq!(fixes[1].edit, None, "advice has no edit");
}

#[test]
fn json_follows_the_contract() {
    let (_ws, locator, mut report) = fixture();
    locator.locate(&mut report);
    let doc = json::document(std::slice::from_ref(&report), &[]);
    assert_eq!(doc["memlsp"], env!("CARGO_PKG_VERSION"));
    assert!(doc.get("errors").is_none());
    let c = &doc["captures"][0];
    assert_eq!(c["path"], "runs/step5.pickle");
    assert_eq!(c["kind"], "torch-snapshot");
    assert_eq!(c["headline"], report.headline());
    assert_eq!(c["torch"]["totals"]["reserved_bytes"], 3u64 << 30);
    assert!(c.get("xla").is_none());
    let site = &c["sites"][0];
    assert_eq!(site["file"], "train.py");
    assert_eq!(site["line"], 6);
    assert_eq!(site["function"], "<module>");
    assert_eq!(site["bytes"], 1u64 << 30);
    assert_eq!(site["blocks"], 120);
    assert_eq!(site["percent"], 40.0);
    // Framework frames keep the recorded path.
    assert_eq!(
        site["stack"][0]["file"],
        "/opt/conda/lib/python3.11/site-packages/torch/_tensor.py"
    );
    assert_eq!(site["stack"][1]["file"], "train.py");

    let oom = &c["findings"][0];
    assert_eq!(oom["code"], "PT009");
    assert_eq!(oom["severity"], "error");
    assert_eq!(oom["file"], Value::Null);
    assert_eq!(oom["line"], Value::Null);
    assert_eq!(oom["percent"], Value::Null);

    let leak = &c["findings"][1];
    for key in [
        "code", "pattern", "severity", "message", "file", "line", "bytes", "percent", "evidence",
        "fixes",
    ] {
        assert!(leak.get(key).is_some(), "finding lacks `{key}`");
    }
    assert_eq!(leak["pattern"], "retained autograd graph");
    assert_eq!(leak["severity"], "warning");
    assert_eq!(leak["file"], "train.py");
    assert_eq!(leak["line"], 6);
    assert_eq!(leak["bytes"], 1u64 << 30);
    assert_eq!(
        leak["evidence"][0],
        json!({"label": "measured", "text": "120 activation blocks from step 1 are still live at step 5"})
    );
    assert_eq!(leak["evidence"][1]["label"], "inferred");
    assert_eq!(
        leak["fixes"][0],
        json!({
            "title": "Accumulate `loss.detach()`",
            "saving_bytes": 1u64 << 30,
            "edit": [{"file": "train.py", "line": 6, "start_col": 17, "end_col": 17, "new_text": ".detach()"}],
        })
    );
    assert_eq!(
        leak["fixes"][1],
        json!({"title": "Look for retain_graph=True"})
    );
}

#[test]
fn sarif_has_rules_results_flows_and_fixes() {
    let (ws, locator, mut report) = fixture();
    locator.locate(&mut report);
    let doc = sarif::document(std::slice::from_ref(&report), ws.path(), &[]);
    assert_eq!(doc["version"], "2.1.0");
    let run = &doc["runs"][0];
    assert_eq!(run["tool"]["driver"]["name"], "memlsp");
    let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
    let ids: Vec<&str> = rules.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["PT002", "PT009"]);
    assert_eq!(rules[0]["helpUri"], Code::PT002.docs_url());
    let root = run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
        .as_str()
        .unwrap();
    assert!(
        root.starts_with("file:///") && root.ends_with('/'),
        "{root}"
    );
    assert!(root.contains(ws.path().file_name().unwrap().to_str().unwrap()));
    assert_eq!(run["invocations"][0]["executionSuccessful"], true);

    let results = run["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    let oom = &results[0];
    assert_eq!(
        (oom["ruleId"].as_str(), oom["ruleIndex"].as_u64()),
        (Some("PT009"), Some(1))
    );
    assert_eq!(oom["level"], "error");
    assert_eq!(
        oom["locations"][0]["physicalLocation"]["artifactLocation"],
        json!({"uri": "runs/step5.pickle", "uriBaseId": "%SRCROOT%"})
    );
    assert!(oom.get("codeFlows").is_none());
    assert!(oom.get("fixes").is_none());

    let leak = &results[1];
    assert_eq!(leak["level"], "warning");
    let phys = &leak["locations"][0]["physicalLocation"];
    assert_eq!(phys["artifactLocation"]["uri"], "train.py");
    assert_eq!(phys["region"]["startLine"], 6);
    // The code flow runs from the outermost call to the allocation.
    let flow = leak["codeFlows"][0]["threadFlows"][0]["locations"]
        .as_array()
        .unwrap();
    assert_eq!(flow.len(), 2);
    assert_eq!(
        flow[0]["location"]["physicalLocation"]["artifactLocation"]["uri"],
        "file:///home/u/proj/run.py"
    );
    assert_eq!(flow[1]["location"]["message"]["text"], "<module>");
    let change = &leak["fixes"][0]["artifactChanges"][0];
    assert_eq!(change["artifactLocation"]["uri"], "train.py");
    assert_eq!(
        change["replacements"][0],
        json!({"deletedRegion": {"startLine": 6, "startColumn": 18, "endColumn": 18},
               "insertedContent": {"text": ".detach()"}})
    );
}

#[test]
fn text_reads_like_a_compiler() {
    let (_ws, locator, mut report) = fixture();
    locator.locate(&mut report);
    let out = text::check(std::slice::from_ref(&report), 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "runs/step5.pickle: error[PT009] allocation of 2.00 GiB failed with 512.00 MiB free"
    );
    assert_eq!(lines[1], "  = measured: 1 OOM event in the trace");
    assert_eq!(
        lines[2],
        "train.py:6: warning[PT002] `loss` keeps the autograd graph alive: 1.00 GiB (40.0%) of live memory"
    );
    assert_eq!(
        lines[3],
        "  = measured: 120 activation blocks from step 1 are still live at step 5"
    );
    assert_eq!(
        lines[5],
        "  = fix: Accumulate `loss.detach()` (saves ~1.00 GiB, inferred) [edit available]"
    );
    assert_eq!(lines[6], "  = fix: Look for retain_graph=True");
    assert_eq!(lines[7], "  = capture: runs/step5.pickle");
    // A title that states the saving already is not repeated, but keeps its label.
    report.findings[1].fixes[0].title = "Accumulate `loss.detach()`: saves 1.00 GiB".into();
    let again = text::check(std::slice::from_ref(&report), 0);
    assert_eq!(
        again.lines().nth(5),
        Some(
            "  = fix: Accumulate `loss.detach()`: saves 1.00 GiB (saving inferred) [edit available]"
        )
    );
    assert_eq!(
        lines.last(),
        Some(&"2 findings (1 error, 1 warning) in 1 capture")
    );
    assert_eq!(
        text::check(&[], 2),
        "no findings in 0 captures (2 more could not be read)\n"
    );
}

#[test]
fn report_text_starts_with_the_headline_and_shares_the_engine_sections() {
    let (_ws, locator, mut report) = fixture();
    locator.locate(&mut report);
    let out = text::report(std::slice::from_ref(&report), 10);
    // The headline is the finding whose fix saves the most (the PT002 fix saves 1.00 GiB; the
    // OOM event states no saving), not the most severe (issue 25 item 5).
    assert!(
        out.starts_with(
            "`loss` keeps the autograd graph alive: 1.00 GiB (40.0%) of live memory [PT002] (train.py:6)\n\nTotals\n  reserved (Σ segment total_size)   3.00 GiB (3221225472 B) [measured]\n"
        ),
        "{out}"
    );
    let order = [
        "Totals",
        "Top sites",
        "Free timeline",
        "Diagnosis",
        "Next steps",
        "Uncertainty",
    ];
    let pos: Vec<usize> = order.iter().filter_map(|s| out.find(s)).collect();
    assert_eq!(pos.len(), order.len(), "{out}");
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "{out}");
    assert!(
        out.contains(
            "  PT002 retained autograd graph (warning) at /home/u/proj/train.py:6: `loss` keeps"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "  1. PT002 /home/u/proj/train.py:6: Accumulate `loss.detach()` — saves ~1.00 GiB [inferred]\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("      [measured] 1 OOM event in the trace\n"),
        "{out}"
    );
}

#[test]
fn github_annotations() {
    let (_ws, locator, mut report) = fixture();
    locator.locate(&mut report);
    let out = github::check(std::slice::from_ref(&report));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[0],
        "::error file=runs/step5.pickle,title=memlsp PT009::allocation of 2.00 GiB failed with 512.00 MiB free%0Ameasured: 1 OOM event in the trace"
    );
    assert!(
        lines[1].starts_with("::warning file=train.py,line=6,title=memlsp PT002::`loss` keeps"),
        "{}",
        lines[1]
    );
    assert!(lines[1].contains("(40.0%25) of live memory%0Ameasured: "));
    // Savings keep their label in annotations too.
    assert!(
        lines[1].ends_with(
            "%0Afix: Accumulate `loss.detach()` (saves ~1.00 GiB, inferred)%0Afix: Look for retain_graph=True"
        ),
        "{}",
        lines[1]
    );
}

#[test]
fn fail_on_decides_the_exit_code() {
    let (_ws, _locator, report) = fixture();
    let both = std::slice::from_ref(&report);
    assert_eq!(exit_code(both, false, Severity::Warning), 1);
    assert_eq!(exit_code(both, false, Severity::Error), 1);
    assert_eq!(exit_code(both, true, Severity::Warning), 2);
    let mut hint_only = fixture().2;
    hint_only.findings = vec![Finding::new(Code::PT001, Severity::Hint, "x")];
    let hint = std::slice::from_ref(&hint_only);
    assert_eq!(exit_code(hint, false, Severity::Warning), 0);
    assert_eq!(exit_code(hint, false, Severity::Information), 0);
    assert_eq!(exit_code(hint, false, Severity::Hint), 1);
    assert_eq!(exit_code(&[], false, Severity::Hint), 0);
}

/// The JSON written a capture at a time is the document's text, byte for byte: none, one, one
/// with an unreadable capture beside it, and the ranks of a folder (their comparison once).
#[test]
fn json_written_a_capture_at_a_time_is_the_document() {
    let (_ws, locator, mut report) = fixture();
    locator.locate(&mut report);
    let err = crate::error::CaptureError::new(
        Path::new("runs/broken.pickle"),
        crate::error::ErrorKind::Truncated,
        Some(120),
        "the pickle ends early",
        "wait for the writer to finish",
    );
    let ranks = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch/ranks");
    let mut ranked = crate::analyze::run(&ranks, &Default::default()).unwrap();
    for r in &mut ranked {
        locator.locate(r);
    }
    assert!(ranked.len() >= 2);
    let one = std::slice::from_ref(&report);
    let errs = std::slice::from_ref(&err);
    for (reports, errors) in [
        (&[][..], &[][..]),
        (one, &[][..]),
        (one, errs),
        (&ranked[..], errs),
    ] {
        let want = json::render(&json::document(reports, errors));
        assert_eq!(json::render_document(reports, errors), want);
    }
    assert!(json::render_document(&ranked, &[]).contains("\"rank_comparisons\""));
}
