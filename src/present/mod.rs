//! Every rendering of a report, one file per format, siblings the way ripgrep's printers are:
//! the front ends (`cli`, `lsp`, `mcp`) choose one and write what it returns.
//!
//! `text` (`memlsp report`'s body, the `--check` listing), `json` (`--format json`, the MCP
//! tools' structured content), `sarif`, `github`, `html` (the page with the pictures: `report
//! --format html`, the editor's timeline webview), `mcp_text` (the MCP tools' text), `hover` (the
//! editor hover's Markdown), `editor` (diagnostic messages, inlay tooltips, code-action titles),
//! `hint` (the words a finding shows at the end of its line); the views' text (`stages`,
//! `categories`, `trend`, `compare`, `fit`, `capacity`); `escape` (capture strings made safe for
//! each place they are shown) and `jsonrpc` (what both servers answer to a message they cannot
//! take).

pub mod capacity;
pub mod categories;
pub mod compare;
pub mod compile_regions;
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
