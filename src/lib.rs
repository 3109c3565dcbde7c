//! memlsp: GPU memory evidence pinned to Python source lines.
//!
//! Data flows one way: **decode → model → analyse → locate → present**. See
//! `docs/ARCHITECTURE.md` for the map.

pub mod analyze;
pub mod baseline;
pub mod cli;
pub mod error;
pub mod findings;
pub mod frames;
pub mod lsp;
pub mod mcp;
pub mod options;
pub mod pickle;
pub mod present;
pub mod process_memory;
pub mod report;
pub mod sigbus;
pub mod site;
pub mod source;
#[cfg(test)]
pub(crate) mod test_rng;
pub mod timings;
pub mod torch;
pub mod xla;
