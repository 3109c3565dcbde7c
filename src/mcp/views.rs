//! The PyTorch views over MCP beside `analyze`: its `categories` and `range` arguments (as
//! `report --category`, `--range`) and the `trend` tool's arguments and text (`report --trend`).
//! Answers are the JSON document the other front ends write; stages, categories,
//! `compile_contexts` and the trend are keys of each capture's `torch` object there.

use std::path::PathBuf;

use rmcp::schemars::JsonSchema;
use serde::Deserialize;

use crate::options::{Category, Options, Range};

/// `analyze`'s view arguments on `opts`: one clear message for a bad one.
pub(super) fn apply(
    opts: &mut Options,
    categories: &[String],
    range: Option<&str>,
) -> Result<(), String> {
    for c in categories {
        opts.analysis
            .categories
            .push(Category::parse(c).map_err(|e| format!("analyze: categories: {e}"))?);
    }
    if let Some(r) = range {
        opts.range = Some(Range::parse(r).map_err(|e| format!("analyze: range: {e}"))?);
    }
    Ok(())
}

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub(super) struct TrendArgs {
    /// Three or more PyTorch snapshots of one run, oldest first
    pub paths: Vec<PathBuf>,
    /// Directory source paths are resolved against and relative paths are taken from (default:
    /// the server's current directory)
    pub workspace: Option<PathBuf>,
}

pub(super) const TREND: &str = "Trend over three or more PyTorch snapshots of one run, oldest first \
     (`memlsp report --trend A B C`): the last one's report with `torch.trend` (per-site bytes \
     and blocks at each snapshot, measured; slope per step and the leak verdict, inferred) and \
     PT011 for a site that grew at every snapshot.";

/// Too few snapshots for a trend: the tool's error.
pub(super) fn too_few(n: usize) -> Option<String> {
    (n < 3).then(|| {
        format!(
            "trend: needs three or more snapshots of one run, oldest first ({n} given; two: the \
             diff tool)"
        )
    })
}
