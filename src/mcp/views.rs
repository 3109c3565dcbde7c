//! The PyTorch views over MCP beside `analyze`: its `categories` and `range` arguments (as
//! `report --category`, `--range`) and the `trend` tool (`report --trend A B C…`). Their answers
//! are the JSON document the other front ends write; stages, categories, `compile_contexts` and
//! the trend are keys of each capture's `torch` object there.

use std::path::PathBuf;

use rmcp::schemars::JsonSchema;
use serde::Deserialize;

use super::tools::{Ctx, Output};
use crate::analyze;
use crate::options::{Category, Options, Range};
use crate::present::json as doc;

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
    paths: Vec<PathBuf>,
    /// Directory source paths are resolved against and relative paths are taken from (default:
    /// the server's current directory)
    workspace: Option<PathBuf>,
}

pub(super) const TREND: &str = "Trend over three or more PyTorch snapshots of one run, oldest first \
     (`memlsp report --trend A B C`): the last one's report with `torch.trend` (per-site bytes \
     and blocks at each snapshot, measured; slope per step and the leak verdict, inferred) and \
     PT011 for a site that grew at every snapshot.";

pub(super) fn trend(a: TrendArgs, ctx: &Ctx) -> Result<Output, String> {
    if a.paths.len() < 3 {
        return Err(format!(
            "trend: needs three or more snapshots of one run, oldest first ({} given; two: the \
             diff tool)",
            a.paths.len()
        ));
    }
    let ws = ctx.workspace(a.workspace.as_deref())?;
    let opts = ctx.options(&ws);
    let paths = a
        .paths
        .iter()
        .map(|p| ctx.path(&ws, p))
        .collect::<Result<Vec<_>, _>>()?;
    ctx.meter.admit_all(&paths)?;
    let report = analyze::run_trend(&paths, &opts).map_err(|e| e.to_string())?;
    let reports = [report];
    let mut summary = super::tools::summary(&reports);
    if let Some(crate::report::Engine::Torch(t)) = reports.first().map(|r| &r.engine)
        && let Some(tr) = &t.trend
    {
        let growing = tr.sites.iter().filter(|s| s.grows_every_step).count();
        summary.push_str(&format!(
            "\n  trend over {} snapshots: {} site(s) grew at every one [measured bytes, inferred verdict]",
            tr.steps.len(),
            growing
        ));
    }
    Ok(Output {
        structured: doc::document(&reports, &[]),
        summary,
    })
}
