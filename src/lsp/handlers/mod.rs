//! Request handlers, one file per LSP method: plain functions of the last published `View` and
//! the request's parameters (the server does the waiting and the I/O around them).

pub mod code_action;
pub mod code_lens;
pub mod diagnostic;
pub mod hover;
pub mod inlay_hint;
pub mod timeline;
