//! Presenters shared by the command line and the language server: the HTML page with the
//! pictures (`memlsp report --format html`, the editor's timeline webview), and the words a
//! finding shows at the end of its line (`hint`).

pub mod hint;
pub mod html;
