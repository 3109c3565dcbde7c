//! `--check --format sarif`: SARIF 2.1.0, built by hand with `serde_json`.
//!
//! One run; one rule per code seen (helpUri = the code's docs page); one result per finding with
//! its location (the capture itself when the finding has no source line), a code flow for the
//! allocation stack (outermost call first) and fixes where an edit exists. Columns are Unicode
//! code points (`columnKind`), converted from the byte columns of the edits.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::error::CaptureError;
use crate::findings::{Finding, Location, Severity, TextEdit};
use crate::report::CaptureReport;

use super::json::VERSION;

const SCHEMA: &str = "https://json.schemastore.org/sarif-2.1.0.json";
const SRCROOT: &str = "%SRCROOT%";

/// The SARIF log; `root` is the workspace that relative paths are relative to.
pub(crate) fn document(reports: &[CaptureReport], root: &Path, errors: &[CaptureError]) -> Value {
    let mut rules: BTreeMap<&str, &Finding> = BTreeMap::new();
    for f in reports.iter().flat_map(|r| &r.findings) {
        rules.entry(f.code.as_str()).or_insert(f);
    }
    let rule_index: HashMap<&str, usize> = rules.keys().enumerate().map(|(i, c)| (*c, i)).collect();
    let mut lines = LineCache::default();
    let results: Vec<Value> = reports
        .iter()
        .flat_map(|r| r.findings.iter().map(move |f| (r, f)))
        .map(|(r, f)| result(r, f, rule_index[f.code.as_str()], &mut lines))
        .collect();
    let root = dir_uri(root);
    let mut run = json!({
        "tool": {"driver": {
            "name": "memlsp",
            "version": VERSION,
            "informationUri": "https://github.com/memlsp/memlsp",
            "rules": rules.values().map(|f| rule(f)).collect::<Vec<_>>(),
        }},
        "columnKind": "unicodeCodePoints",
        "results": results,
        "invocations": [{
            "executionSuccessful": errors.is_empty(),
            "toolExecutionNotifications": errors.iter().map(|e| json!({
                "level": "error",
                "message": {"text": e.to_string()},
                "locations": [{"physicalLocation": {"artifactLocation": artifact(&e.path.to_string_lossy())}}],
            })).collect::<Vec<_>>(),
        }],
    });
    run["originalUriBaseIds"] = json!({SRCROOT: {"uri": root}});
    json!({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]})
}

fn level(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Information | Severity::Hint => "note",
    }
}

fn rule(f: &Finding) -> Value {
    json!({
        "id": f.code,
        "name": f.code.pattern(),
        "shortDescription": {"text": f.code.pattern()},
        "helpUri": f.code.docs_url(),
        "help": {"text": format!("See {}", f.code.docs_url())},
    })
}

fn result(r: &CaptureReport, f: &Finding, index: usize, lines: &mut LineCache) -> Value {
    let location = match &f.location {
        Some(l) => physical(l),
        None => json!({"physicalLocation": {
            "artifactLocation": artifact(&r.display_path())
        }}),
    };
    let mut res = json!({
        "ruleId": f.code,
        "ruleIndex": index,
        "level": level(f.severity),
        "message": {"text": f.message},
        "locations": [location],
        "properties": {
            "pattern": f.code.pattern(),
            "severity": f.severity.as_str(),
            "capture": r.display_path(),
            "bytes": f.bytes,
            "bytes_label": f.bytes_label.map(|l| l.as_str()),
            "percent": f.percent,
            "scope": f.scope,
            "evidence": f.evidence.iter().map(|e| json!({"label": e.label.as_str(), "text": e.text})).collect::<Vec<_>>(),
        },
    });
    if !f.stack.is_empty() {
        let flow: Vec<Value> = f
            .stack
            .iter()
            .rev()
            .map(|l| {
                let mut loc = physical(l);
                loc["message"] = json!({"text": l.function});
                json!({"location": loc})
            })
            .collect();
        res["codeFlows"] = json!([{"threadFlows": [{"locations": flow}]}]);
    }
    let fixes: Vec<Value> = f
        .fixes
        .iter()
        .filter_map(|x| Some((x, x.edit.as_ref()?)))
        .map(|(x, edits)| {
            // Group the replacements by file, as SARIF wants one artifactChange per file.
            let mut by_file: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
            for e in edits {
                by_file
                    .entry(e.shown.as_deref().unwrap_or(&e.file))
                    .or_default()
                    .push(replacement(e, lines));
            }
            json!({
                "description": {"text": x.title},
                "artifactChanges": by_file.into_iter().map(|(file, reps)| json!({
                    "artifactLocation": artifact(file),
                    "replacements": reps,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    if !fixes.is_empty() {
        res["fixes"] = json!(fixes);
    }
    res
}

fn physical(l: &Location) -> Value {
    let line = l.line.max(1);
    json!({"physicalLocation": {
        "artifactLocation": artifact(l.shown()),
        "region": {"startLine": line},
    }})
}

/// A workspace-relative path becomes a `%SRCROOT%`-based URI; anything else a `file:` URI.
fn artifact(shown: &str) -> Value {
    let p = Path::new(shown);
    if p.is_absolute() || shown.contains('\\') {
        json!({"uri": file_uri(shown)})
    } else {
        json!({"uri": encode(shown), "uriBaseId": SRCROOT})
    }
}

fn replacement(e: &TextEdit, lines: &mut LineCache) -> Value {
    let text = lines.line(Path::new(&e.file), e.line);
    let col = |byte: u32| -> usize {
        match text {
            Some(t) => t
                .get(..byte as usize)
                .map_or(byte as usize, |s| s.chars().count()),
            None => byte as usize,
        }
    };
    json!({
        "deletedRegion": {
            "startLine": e.line,
            "startColumn": col(e.start_col) + 1,
            "endColumn": col(e.end_col) + 1,
        },
        "insertedContent": {"text": e.new_text},
    })
}

/// Source lines read once per file, for byte → code point columns.
#[derive(Default)]
struct LineCache {
    files: HashMap<PathBuf, Option<Vec<String>>>,
}

impl LineCache {
    fn line(&mut self, path: &Path, line: u32) -> Option<&str> {
        let lines = self.files.entry(path.to_path_buf()).or_insert_with(|| {
            std::fs::read_to_string(path)
                .ok()
                .map(|t| t.lines().map(str::to_owned).collect())
        });
        lines
            .as_ref()?
            .get((line as usize).checked_sub(1)?)
            .map(String::as_str)
    }
}

/// Percent-encode a path for a URI (keeps `/` and unreserved characters).
fn encode(path: &str) -> String {
    let mut out = String::new();
    for b in path.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn file_uri(path: &str) -> String {
    let p = path.replace('\\', "/");
    if p.starts_with('/') {
        format!("file://{}", encode(&p))
    } else if p.as_bytes().get(1) == Some(&b':') {
        // `C:/x` keeps its drive colon.
        format!("file:///{}:{}", &p[..1], encode(&p[2..]))
    } else {
        encode(&p)
    }
}

fn dir_uri(dir: &Path) -> String {
    let mut uri = file_uri(&dir.to_string_lossy());
    if !uri.ends_with('/') {
        uri.push('/');
    }
    uri
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_are_encoded() {
        assert_eq!(file_uri("/srv/my dir/a.py"), "file:///srv/my%20dir/a.py");
        assert_eq!(file_uri(r"C:\Users\u\a.py"), "file:///C:/Users/u/a.py");
        assert_eq!(dir_uri(Path::new("/w/proj")), "file:///w/proj/");
        assert_eq!(encode("model/ü.py"), "model/%C3%BC.py");
    }
}
