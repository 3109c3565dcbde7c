//! Trend over three or more snapshots of one run (`…step5…`, `…step10…`, `…step15…`): the live
//! bytes of each site at each snapshot, a least-squares slope in bytes per training step, and a
//! leak verdict — PT011 from the whole series — for a site whose live bytes and blocks grew from
//! every snapshot to the next. A site that is flat, or grows only once (the optimizer state of
//! the first step), gets none. Bytes are measured (each snapshot's allocator state); the slope
//! and the verdict are inferred.

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};
use crate::torch::Analysis;
use crate::torch::model::{Snapshot, StackId};
use crate::torch::stacks::culprit;
use crate::torch::stacks::{Role, SiteKey};

/// One site across the series.
#[derive(Clone, Debug, Serialize)]
pub struct SiteTrend {
    pub site: String,
    /// Live bytes and blocks at each snapshot (measured).
    pub bytes: Vec<u64>,
    pub blocks: Vec<u64>,
    /// Least-squares slope of `bytes` over the steps, in bytes per step (inferred).
    pub slope_bytes_per_step: f64,
    /// Bytes and blocks grew from every snapshot to the next.
    pub grows_every_step: bool,
    pub role: &'static str,
    #[serde(skip)]
    pub key: SiteKey,
    #[serde(skip)]
    pub stack: Option<StackId>,
    #[serde(skip)]
    role_kind: Role,
}

/// The series (`captures[].torch.trend`).
#[derive(Clone, Debug, Serialize)]
pub struct Trend {
    /// The step of each snapshot, from its name.
    pub steps: Vec<u64>,
    pub paths: Vec<String>,
    /// Live memory at each snapshot (measured).
    pub allocated_bytes: Vec<u64>,
    pub reserved_bytes: Vec<u64>,
    /// Sites that changed, growing ones first (at most 20), then by slope.
    pub sites: Vec<SiteTrend>,
}

/// Least-squares slope of `ys` over `xs`.
pub fn slope(xs: &[u64], ys: &[u64]) -> f64 {
    let n = xs.len() as f64;
    if xs.len() < 2 {
        return 0.0;
    }
    let mx = xs.iter().map(|&x| x as f64).sum::<f64>() / n;
    let my = ys.iter().map(|&y| y as f64).sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (&x, &y) in xs.iter().zip(ys) {
        num += (x as f64 - mx) * (y as f64 - my);
        den += (x as f64 - mx) * (x as f64 - mx);
    }
    if den == 0.0 { 0.0 } else { num / den }
}

/// The trend of a series, oldest first: each snapshot's step, path and analysis.
pub fn compute(series: &[(u64, String, &Analysis)]) -> Trend {
    let n = series.len();
    let mut by: FxHashMap<&str, SiteTrend> = FxHashMap::default();
    for (i, (_, _, a)) in series.iter().enumerate() {
        for s in &a.sites.sites {
            let t = by.entry(s.site.as_str()).or_insert_with(|| SiteTrend {
                site: s.site.clone(),
                bytes: vec![0; n],
                blocks: vec![0; n],
                slope_bytes_per_step: 0.0,
                grows_every_step: false,
                role: s.role().as_str(),
                key: s.key,
                stack: s.stack,
                role_kind: s.role(),
            });
            t.bytes[i] = s.bytes;
            t.blocks[i] = s.blocks;
            // The latest snapshot's frame and stack.
            t.key = s.key;
            t.stack = s.stack;
        }
    }
    let steps: Vec<u64> = series.iter().map(|s| s.0).collect();
    let mut sites: Vec<SiteTrend> = by
        .into_values()
        .filter(|t| t.bytes.windows(2).any(|w| w[0] != w[1]))
        .map(|mut t| {
            t.slope_bytes_per_step = slope(&steps, &t.bytes);
            t.grows_every_step = n >= 3
                && t.bytes.windows(2).all(|w| w[1] > w[0])
                && t.blocks.windows(2).all(|w| w[1] > w[0]);
            t
        })
        .collect();
    sites.sort_by(|a, b| {
        b.grows_every_step
            .cmp(&a.grows_every_step)
            .then(b.slope_bytes_per_step.total_cmp(&a.slope_bytes_per_step))
            .then(a.site.cmp(&b.site))
    });
    sites.truncate(20);
    Trend {
        steps,
        paths: series.iter().map(|s| s.1.clone()).collect(),
        allocated_bytes: series
            .iter()
            .map(|s| s.2.totals.overall.allocated)
            .collect(),
        reserved_bytes: series.iter().map(|s| s.2.totals.overall.reserved).collect(),
        sites,
    }
}

/// PT011 for the sites that grew at every snapshot of the series (at most 5).
pub fn findings(last: &Snapshot, t: &Trend) -> Vec<Finding> {
    let steps = t
        .steps
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    t.sites
        .iter()
        .filter(|s| s.grows_every_step && s.role_kind != Role::OptimizerState)
        .take(5)
        .map(|s| {
            let (loc, stack) = culprit(last, s.key, s.stack);
            let first = s.bytes.first().copied().unwrap_or(0);
            let end = s.bytes.last().copied().unwrap_or(0);
            Finding::new(
                Code::PT011,
                Severity::Warning,
                format!(
                    "{} grew at every one of {} snapshots (steps {steps}): about {} per step, so it is \
                     leaking or retained.",
                    s.site,
                    s.bytes.len(),
                    fmt_bytes(s.slope_bytes_per_step.max(0.0) as u64)
                ),
            )
            .at(loc, stack)
            .bytes(end.saturating_sub(first), None, Label::Measured)
            .evidence(Evidence::measured(format!(
                "live bytes per snapshot: {}; blocks: {}",
                s.bytes.iter().map(|b| fmt_bytes(*b)).collect::<Vec<_>>().join(" → "),
                s.blocks.iter().map(u64::to_string).collect::<Vec<_>>().join(" → ")
            )))
            .evidence(Evidence::inferred(format!(
                "least-squares slope {:.0} B per step over steps {steps}; role from the stack: {}",
                s.slope_bytes_per_step, s.role
            )))
            .fix(Fix::advice(
                "Find what keeps these tensors: a container appended each step (store `.detach().cpu()` \
                 or bound it) or an accumulated tensor that requires grad (`.detach()` / `.item()`)",
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::slope;

    #[test]
    fn slope_is_least_squares() {
        assert_eq!(slope(&[5, 10, 15], &[100, 200, 300]), 20.0);
        assert_eq!(slope(&[5, 10, 15], &[7, 7, 7]), 0.0);
        assert_eq!(slope(&[3], &[1]), 0.0);
    }
}
