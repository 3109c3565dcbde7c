//! The JSON contract of DESIGN.md (`--format json` of `report` and `--check`, and the structured
//! content of the MCP tools): serde over the located reports. Keys listed in the contract are
//! never renamed; extra keys (`function`, `stack`, `scope`, `cost`, `errors`, …) are additions.

use serde_json::{Map, Value, json};

use crate::error::CaptureError;
use crate::report::CaptureReport;

/// The version written into JSON and SARIF output.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `{"memlsp": version, "captures": [...]}`, plus `"errors"` when some captures were unreadable
/// and `"rank_comparisons"` when some were compared as the ranks of one job (each comparison
/// once; a rank's capture names its group with `torch.rank_group`).
pub fn document(reports: &[CaptureReport], errors: &[CaptureError]) -> Value {
    let (mut doc, index) = outline(reports, errors);
    doc["captures"] = reports
        .iter()
        .zip(&index)
        .map(|(r, g)| capture(r, *g))
        .collect();
    doc
}

/// The document without its captures (`"captures": []`), and each report's rank group.
fn outline(reports: &[CaptureReport], errors: &[CaptureError]) -> (Value, Vec<Option<usize>>) {
    let mut doc = Map::new();
    doc.insert("memlsp".into(), json!(VERSION));
    doc.insert("captures".into(), json!([]));
    let (groups, index) = crate::report::rank_groups(reports);
    if !groups.is_empty() {
        doc.insert(
            "rank_comparisons".into(),
            groups
                .iter()
                .map(|g| serde_json::to_value(&***g).unwrap_or(Value::Null))
                .collect(),
        );
    }
    if !errors.is_empty() {
        doc.insert("errors".into(), errors.iter().map(error).collect());
    }
    (Value::Object(doc), index)
}

/// One capture, naming its rank group.
fn capture(r: &CaptureReport, group: Option<usize>) -> Value {
    let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
    if let (Some(g), Some(t)) = (group, v.get_mut("torch").and_then(Value::as_object_mut)) {
        t.insert("rank_group".into(), json!(g));
    }
    v
}

/// [`render`] of [`document`], built one capture at a time: the same text, without holding
/// the whole document as a `Value` (for 1,024 ranks that tree is several times the text).
pub fn render_document(reports: &[CaptureReport], errors: &[CaptureError]) -> String {
    let mut out = Vec::with_capacity(reports.len() * 4096);
    // Writing into memory cannot fail, and serde_json writes UTF-8.
    let _ = write_document(reports, errors, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// [`render_document`] written to `w` a capture at a time, so that the text of many ranks is
/// never held whole (1,024 ranks of large snapshots write ~100 MB).
pub fn write_document(
    reports: &[CaptureReport],
    errors: &[CaptureError],
    w: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let (doc, index) = outline(reports, errors);
    // Keys come out sorted, "captures" first: write the others after the captures' array.
    let rest = render(&doc);
    let Some(after) = rest.strip_prefix("{\n  \"captures\": [],\n") else {
        return w.write_all(render(&document(reports, errors)).as_bytes());
    };
    w.write_all(b"{\n  \"captures\": [")?;
    for (i, (r, g)) in reports.iter().zip(&index).enumerate() {
        w.write_all(if i == 0 { b"\n" } else { b",\n" })?;
        let text = serde_json::to_string_pretty(&capture(r, *g)).unwrap_or_else(|_| "null".into());
        // Nested two levels deep; JSON strings hold no raw line breaks.
        for (k, line) in text.lines().enumerate() {
            if k > 0 {
                w.write_all(b"\n")?;
            }
            w.write_all(b"    ")?;
            w.write_all(line.as_bytes())?;
        }
    }
    w.write_all(if reports.is_empty() {
        b"],\n"
    } else {
        b"\n  ],\n"
    })?;
    w.write_all(after.as_bytes())
}

/// One unreadable capture: `{"path", "offset", "message"}` (the message is the one-line error).
pub fn error(e: &CaptureError) -> Value {
    json!({"path": e.path.to_string_lossy(), "offset": e.offset, "message": e.to_string()})
}

/// Pretty JSON with a final newline.
pub fn render(doc: &Value) -> String {
    let mut s = serde_json::to_string_pretty(doc).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s
}

/// `memlsp compare SUMMARY…` (ranks from their JSON summaries): the comparison and the findings
/// it raised.
pub fn rank_comparison(
    cmp: &crate::torch::ranks::RankComparison,
    reports: &[CaptureReport],
) -> Value {
    let findings: Vec<Value> = reports
        .iter()
        .flat_map(|r| r.findings.iter())
        .map(|f| serde_json::to_value(f).unwrap_or(Value::Null))
        .collect();
    json!({
        "memlsp": VERSION,
        "rank_comparison": cmp,
        "findings": findings,
    })
}
