//! Presenters shared by the front ends: the HTML page with the pictures (`memlsp report --format
//! html`, the editor's timeline webview), the JSON document of reports (`--format json`, the MCP
//! tools' structured content), the words a finding shows at the end of its line (`hint`), and the
//! escaping of capture strings for each place they are shown (`escape`), and what both servers
//! answer to a message they cannot take (`jsonrpc`).

pub mod capacity;
pub mod categories;
pub mod compare;
pub mod editor;
pub mod escape;
pub mod fit;
pub mod github;
pub mod hint;
pub mod hover;
pub mod html;
pub mod json;
pub mod jsonrpc;
pub mod mcp_text;
pub mod sarif;
pub mod stages;
pub mod text;
pub mod trend;
