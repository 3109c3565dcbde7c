//! Presenters shared by the front ends: the HTML page with the pictures (`memlsp report --format
//! html`, the editor's timeline webview), the JSON document of reports (`--format json`, the MCP
//! tools' structured content), the words a finding shows at the end of its line (`hint`), and the
//! escaping of capture strings for each place they are shown (`escape`), and what both servers
//! answer to a message they cannot take (`jsonrpc`).

pub mod capacity;
pub mod categories;
pub mod compare;
pub mod compile_regions;
pub mod escape;
pub mod fit;
pub mod hint;
pub mod html;
pub mod json;
pub mod jsonrpc;
pub mod stages;
pub mod trend;
