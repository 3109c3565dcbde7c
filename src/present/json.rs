//! The JSON contract of DESIGN.md (`--format json` of `report` and `--check`, and the structured
//! content of the MCP tools): serde over the located reports. Keys listed in the contract are
//! never renamed; extra keys (`function`, `stack`, `scope`, `cost`, `errors`, …) are additions.

use serde_json::{Map, Value, json};

use crate::error::CaptureError;
use crate::report::CaptureReport;

/// The version written into JSON and SARIF output.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `{"memlsp": version, "captures": [...]}`, plus `"errors"` when some captures were unreadable.
pub fn document(reports: &[CaptureReport], errors: &[CaptureError]) -> Value {
    let mut doc = Map::new();
    doc.insert("memlsp".into(), json!(VERSION));
    doc.insert(
        "captures".into(),
        serde_json::to_value(reports).unwrap_or(Value::Null),
    );
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
