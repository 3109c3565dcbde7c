//! Presenters shared by the front ends: the HTML page with the pictures (`memlsp report --format
//! html`, the editor's timeline webview), the JSON document of reports (`--format json`, the MCP
//! tools' structured content), and the words a finding shows at the end of its line (`hint`).

pub mod capacity;
pub mod fit;
pub mod hint;
pub mod html;
pub mod json;
