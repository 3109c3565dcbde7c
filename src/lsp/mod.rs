//! The language server (the only module that sees LSP types).
