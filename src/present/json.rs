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
    let mut doc = Map::new();
    doc.insert("memlsp".into(), json!(VERSION));
    let mut captures = serde_json::to_value(reports).unwrap_or(Value::Null);
    let (groups, index) = crate::report::rank_groups(reports);
    if let Some(caps) = captures.as_array_mut() {
        for (c, g) in caps.iter_mut().zip(&index) {
            if let (Some(g), Some(t)) = (g, c.get_mut("torch").and_then(Value::as_object_mut)) {
                t.insert("rank_group".into(), json!(g));
            }
        }
    }
    doc.insert("captures".into(), captures);
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
    Value::Object(doc)
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
