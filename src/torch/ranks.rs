//! Per-rank snapshots: a comparison of all ranks (peak, live, inactive, OOMs, top site) that
//! every rank's report carries, so imbalance and replication are visible from any one of them.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::findings::{Code, Evidence, Finding};
use crate::torch::Analysis;

/// One rank's row in the comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankRow {
    #[serde(serialize_with = "display_path")]
    pub path: PathBuf,
    #[serde(rename = "allocated_bytes")]
    pub allocated: u64,
    #[serde(rename = "reserved_bytes")]
    pub reserved: u64,
    #[serde(rename = "inactive_bytes")]
    pub inactive: u64,
    /// Reconstructed live peak over the trace (largest device), when the trace allows.
    #[serde(rename = "peak_live_bytes_reconstructed")]
    pub peak: Option<u64>,
    #[serde(rename = "oom_events")]
    pub ooms: u64,
    pub top_site: String,
    pub top_percent: Option<f64>,
}

fn display_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.display().to_string())
}

/// The comparison of all ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankComparison {
    #[serde(rename = "ranks")]
    pub rows: Vec<RankRow>,
    /// Largest / smallest live bytes across ranks (None when a rank holds nothing).
    pub imbalance: Option<f64>,
}

impl RankRow {
    /// The row of one analysed rank.
    pub fn of(path: &Path, a: &Analysis) -> RankRow {
        let o = &a.totals.overall;
        let top = a.sites.sites.first();
        RankRow {
            path: path.to_path_buf(),
            allocated: o.allocated,
            reserved: o.reserved,
            inactive: o.inactive,
            peak: a
                .timeline
                .devices
                .iter()
                .filter(|t| t.live_peak_index.is_some())
                .map(|t| t.live_peak.max(0) as u64)
                .max(),
            ooms: a.totals.oom_events().count() as u64,
            top_site: top.map(|s| s.site.clone()).unwrap_or_else(|| "–".into()),
            top_percent: top.and_then(|s| s.percent_of(o.allocated)),
        }
    }
}

impl RankComparison {
    /// The comparison of the ranks whose rows are given, in rank order.
    pub fn with_rows(rows: Vec<RankRow>) -> RankComparison {
        let imbalance = imbalance(&rows);
        RankComparison { rows, imbalance }
    }

    /// Every rank holds about the same live bytes (within 5 %).
    pub fn uniform(&self) -> bool {
        self.rows.len() > 1 && self.imbalance.is_some_and(|r| r <= 1.05)
    }

    /// Scope and evidence the comparison adds to rank `rank`'s findings.
    pub fn annotate(&self, rank: usize, findings: &mut [Finding]) {
        for f in findings.iter_mut() {
            f.scope = Some(format!("rank {rank}"));
            if f.code == Code::PT006 && self.uniform() {
                f.evidence.push(Evidence::measured(format!(
                    "all {} ranks hold the same live memory within 5%: the model state is replicated, not sharded",
                    self.rows.len()
                )));
            }
        }
    }
}

/// Largest / smallest live bytes across ranks (None when a rank holds nothing).
fn imbalance(rows: &[RankRow]) -> Option<f64> {
    let max = rows.iter().map(|r| r.allocated).max()?;
    let min = rows.iter().map(|r| r.allocated).min()?;
    if min == 0 {
        return None;
    }
    Some(max as f64 / min as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(allocated: u64) -> RankRow {
        RankRow {
            path: PathBuf::from("r.pickle"),
            allocated,
            reserved: allocated,
            inactive: 0,
            peak: None,
            ooms: 0,
            top_site: "<no stack>".into(),
            top_percent: None,
        }
    }

    #[test]
    fn imbalance_is_reported_and_uniform_ranks_are_recognised() {
        let cmp = RankComparison::with_rows;
        assert!(cmp(vec![row(100), row(103)]).uniform());
        let skewed = cmp(vec![row(100), row(150)]);
        assert!(!skewed.uniform());
        assert_eq!(skewed.imbalance, Some(1.5));
        let empty = cmp(vec![row(0), row(10)]);
        assert_eq!(empty.imbalance, None, "no ratio against an empty rank");
    }
}
