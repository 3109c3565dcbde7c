//! memlsp: GPU memory evidence pinned to Python source lines.
//!
//! Data flows one way: **decode → model → analyse → locate → present**. See
//! `docs/ARCHITECTURE.md` for the map.

pub mod analyze;
pub mod cli;
pub mod error;
pub mod findings;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod hugepages;
pub mod lsp;
pub mod pickle;
pub mod report;
pub mod sigbus;
pub mod source;
#[doc(hidden)]
pub mod testdata;
pub mod torch;
pub mod xla;
