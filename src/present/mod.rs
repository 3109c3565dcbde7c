//! Presenters shared by the command line and the language server: the HTML page with the
//! pictures (`memlsp report --format html`, the editor's timeline webview).

pub mod html;
