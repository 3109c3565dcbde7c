//! The language server (the only module that sees LSP types).

/// Run the language server on stdio (stub until the server lands).
pub fn run_stdio() -> anyhow::Result<()> {
    anyhow::bail!("the language server is not built yet")
}
