//! The JSON contract of DESIGN.md (`--format json` of `report` and `--check`). Keys listed there
//! are never renamed; extra keys (`function`, `stack`, `scope`, `cost`, `errors`, …) are additions.

use serde_json::{Map, Value, json};

use crate::error::CaptureError;
use crate::findings::{Finding, Fix, Location, TextEdit};
use crate::report::{CaptureReport, EngineData, Site};
use crate::source::paths::Resolver;

use super::VERSION;

/// `{"memlsp": version, "captures": [...]}`, plus `"errors"` when some captures were unreadable.
pub(super) fn document(
    reports: &[CaptureReport],
    resolver: &Resolver,
    errors: &[CaptureError],
) -> Value {
    let mut doc = Map::new();
    doc.insert("memlsp".into(), json!(VERSION));
    doc.insert(
        "captures".into(),
        reports.iter().map(|r| capture(r, resolver)).collect(),
    );
    if !errors.is_empty() {
        doc.insert(
            "errors".into(),
            errors
                .iter()
                .map(|e| json!({"path": e.path.to_string_lossy(), "offset": e.offset, "message": e.to_string()}))
                .collect(),
        );
    }
    Value::Object(doc)
}

/// Pretty JSON with a final newline.
pub(super) fn render(doc: &Value) -> String {
    let mut s = serde_json::to_string_pretty(doc).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s
}

/// The capture's path as shown to the user: workspace-relative when inside it.
pub(super) fn capture_path(report: &CaptureReport, resolver: &Resolver) -> String {
    resolver.relative(&super::absolute(&report.path))
}

fn capture(r: &CaptureReport, resolver: &Resolver) -> Value {
    let mut m = Map::new();
    m.insert("path".into(), json!(capture_path(r, resolver)));
    m.insert("kind".into(), json!(r.kind.as_str()));
    m.insert("headline".into(), json!(r.headline));
    match &r.engine {
        EngineData::Torch(v) => {
            m.insert("torch".into(), v.clone());
        }
        EngineData::Xla(v) => {
            m.insert("xla".into(), v.clone());
        }
        EngineData::None => {}
    }
    m.insert(
        "sites".into(),
        r.sites.iter().map(|s| site(s, resolver)).collect(),
    );
    m.insert(
        "findings".into(),
        r.findings.iter().map(|f| finding(f, resolver)).collect(),
    );
    Value::Object(m)
}

/// `file`, `line`, `function` of a location (nulls when there is none).
fn place(m: &mut Map<String, Value>, loc: Option<&Location>, resolver: &Resolver) {
    m.insert(
        "file".into(),
        json!(loc.map(|l| resolver.display_path(&l.file))),
    );
    m.insert("line".into(), json!(loc.map(|l| l.line)));
    m.insert("function".into(), json!(loc.map(|l| l.function.as_str())));
}

fn stack(frames: &[Location], resolver: &Resolver) -> Value {
    frames
        .iter()
        .map(|l| {
            let mut m = Map::new();
            place(&mut m, Some(l), resolver);
            Value::Object(m)
        })
        .collect()
}

fn site(s: &Site, resolver: &Resolver) -> Value {
    let mut m = Map::new();
    place(&mut m, s.location.as_ref(), resolver);
    m.insert("bytes".into(), json!(s.bytes));
    m.insert("blocks".into(), json!(s.blocks));
    m.insert("percent".into(), json!(s.percent));
    m.insert("percent_of".into(), json!(s.percent_of));
    if let Some(req) = s.requested_bytes {
        m.insert("requested_bytes".into(), json!(req));
    }
    if let Some(role) = &s.role {
        m.insert("role".into(), json!(role));
    }
    if let Some(scope) = &s.scope {
        m.insert("scope".into(), json!(scope));
    }
    m.insert("stack".into(), stack(&s.stack, resolver));
    Value::Object(m)
}

fn finding(f: &Finding, resolver: &Resolver) -> Value {
    let mut m = Map::new();
    m.insert("code".into(), json!(f.code));
    m.insert("pattern".into(), json!(f.code.pattern()));
    m.insert("severity".into(), json!(f.severity.as_str()));
    m.insert("message".into(), json!(f.message));
    place(&mut m, f.location.as_ref(), resolver);
    m.insert("bytes".into(), json!(f.bytes));
    m.insert("percent".into(), json!(f.percent));
    if let Some(scope) = &f.scope {
        m.insert("scope".into(), json!(scope));
    }
    m.insert(
        "evidence".into(),
        f.evidence
            .iter()
            .map(|e| json!({"label": e.label.as_str(), "text": e.text}))
            .collect(),
    );
    m.insert(
        "fixes".into(),
        f.fixes.iter().map(|x| fix(x, resolver)).collect(),
    );
    m.insert("stack".into(), stack(&f.stack, resolver));
    m.insert("docs".into(), json!(f.code.docs_url()));
    Value::Object(m)
}

fn fix(x: &Fix, resolver: &Resolver) -> Value {
    let mut m = Map::new();
    m.insert("title".into(), json!(x.title));
    if let Some(saving) = x.saving_bytes {
        m.insert("saving_bytes".into(), json!(saving));
    }
    if let Some(cost) = &x.cost {
        m.insert("cost".into(), json!(cost));
    }
    if let Some(edits) = &x.edit {
        m.insert(
            "edit".into(),
            edits.iter().map(|e| edit(e, resolver)).collect(),
        );
    }
    Value::Object(m)
}

fn edit(e: &TextEdit, resolver: &Resolver) -> Value {
    json!({
        "file": resolver.relative(std::path::Path::new(&e.file)),
        "line": e.line,
        "start_col": e.start_col,
        "end_col": e.end_col,
        "new_text": e.new_text,
    })
}
