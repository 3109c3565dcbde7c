//! Per-rank snapshots: one report per rank, each with a comparison of all ranks (peak, live,
//! inactive, OOMs, top site) so imbalance and replication are visible from any one of them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::analyze::Options;
use crate::error::CaptureError;
use crate::findings::{Code, Evidence, fmt_bytes};
use crate::report::{CaptureReport, EngineData};
use crate::torch::load::{LoadOptions, load_snapshot};
use crate::torch::{Analysis, analyze_snapshot, build_report, text};

/// One rank's row in the comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct RankRow {
    pub path: PathBuf,
    pub allocated: u64,
    pub reserved: u64,
    pub inactive: u64,
    /// Reconstructed live peak over the trace (largest device), when the trace allows.
    pub peak: Option<u64>,
    pub ooms: u64,
    pub top_site: String,
    pub top_percent: Option<f64>,
}

/// The comparison of all ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct RankComparison {
    pub rows: Vec<RankRow>,
}

impl RankComparison {
    pub fn from(analyses: &[(PathBuf, &Analysis)]) -> RankComparison {
        let rows = analyses
            .iter()
            .map(|(p, a)| {
                let o = &a.totals.overall;
                let top = a.sites.sites.first();
                RankRow {
                    path: p.clone(),
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
            })
            .collect();
        RankComparison { rows }
    }

    /// Largest / smallest live bytes across ranks (None when a rank holds nothing).
    pub fn imbalance(&self) -> Option<f64> {
        let max = self.rows.iter().map(|r| r.allocated).max()?;
        let min = self.rows.iter().map(|r| r.allocated).min()?;
        if min == 0 {
            return None;
        }
        Some(max as f64 / min as f64)
    }

    /// Every rank holds about the same live bytes (within 5 %).
    pub fn uniform(&self) -> bool {
        self.rows.len() > 1 && self.imbalance().is_some_and(|r| r <= 1.05)
    }

    pub fn render(&self, s: &mut String) {
        let _ = writeln!(s, "Ranks ({} snapshots)", self.rows.len());
        for (i, r) in self.rows.iter().enumerate() {
            let name = r
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  rank {i} {name}: live {} · reserved {} · inactive {} · peak {} · {} OOM · top {} ({}) [measured]",
                fmt_bytes(r.allocated),
                fmt_bytes(r.reserved),
                fmt_bytes(r.inactive),
                r.peak
                    .map(|p| format!("≈{} [inferred]", fmt_bytes(p)))
                    .unwrap_or_else(|| "–".into()),
                r.ooms,
                r.top_site,
                r.top_percent
                    .map(|p| format!("{p:.1}%"))
                    .unwrap_or_else(|| "–".into()),
            );
        }
        match self.imbalance() {
            Some(x) if x > 1.2 => {
                let _ = writeln!(
                    s,
                    "  imbalance: the fullest rank holds {x:.2}× the live memory of the emptiest [measured]"
                );
            }
            Some(_) => {
                let _ = writeln!(
                    s,
                    "  ranks are balanced (live memory within 20%) [measured]"
                );
            }
            None => {}
        }
        s.push('\n');
    }

    pub fn to_json(&self) -> Value {
        json!({
            "ranks": self.rows.iter().map(|r| json!({
                "path": r.path.display().to_string(),
                "allocated_bytes": r.allocated,
                "reserved_bytes": r.reserved,
                "inactive_bytes": r.inactive,
                "peak_live_bytes_reconstructed": r.peak,
                "oom_events": r.ooms,
                "top_site": r.top_site,
                "top_percent": r.top_percent,
            })).collect::<Vec<_>>(),
            "imbalance": self.imbalance(),
        })
    }
}

/// Load and analyse every rank, then attach the comparison to each report.
pub fn analyze(paths: &[&Path], opts: &Options) -> Result<Vec<CaptureReport>, CaptureError> {
    let lo = LoadOptions {
        max_trace_events: opts.max_trace_events,
    };
    let mut loaded = Vec::new();
    for p in paths {
        let snap = load_snapshot(p, &lo)?;
        let a = analyze_snapshot(&snap, opts);
        loaded.push((p.to_path_buf(), snap, a));
    }
    let cmp = RankComparison::from(
        &loaded
            .iter()
            .map(|(p, _, a)| (p.clone(), a))
            .collect::<Vec<_>>(),
    );
    let mut out = Vec::new();
    for (i, (path, snap, mut a)) in loaded.into_iter().enumerate() {
        for f in a.findings.iter_mut() {
            f.scope = Some(format!("rank {i}"));
            if f.code == Code::PT006 && cmp.uniform() {
                f.evidence.push(Evidence::measured(format!(
                    "all {} ranks hold the same live memory within 5%: the model state is replicated, not sharded",
                    cmp.rows.len()
                )));
            }
        }
        let mut r = build_report(&path, &snap, &a, opts);
        r.text = text::render(&snap, &a, opts, None, Some(&cmp));
        if let Some(x) = cmp.imbalance()
            && x > 1.2
        {
            r.headline = format!(
                "{} (rank {i} of {}; ranks imbalanced: {x:.2}× live memory between fullest and emptiest)",
                r.headline.trim_end_matches('.'),
                cmp.rows.len()
            );
        }
        if let EngineData::Torch(Value::Object(o)) = &mut r.engine {
            o.insert("rank".into(), json!(i));
            o.insert("rank_comparison".into(), cmp.to_json());
        }
        out.push(r);
    }
    Ok(out)
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
        let even = RankComparison {
            rows: vec![row(100), row(103)],
        };
        assert!(even.uniform());
        let mut s = String::new();
        even.render(&mut s);
        assert!(s.contains("balanced"), "{s}");
        let skewed = RankComparison {
            rows: vec![row(100), row(150)],
        };
        assert!(!skewed.uniform());
        assert_eq!(skewed.imbalance(), Some(1.5));
        let mut s = String::new();
        skewed.render(&mut s);
        assert!(s.contains("1.50×"), "{s}");
        let empty = RankComparison {
            rows: vec![row(0), row(10)],
        };
        assert_eq!(empty.imbalance(), None, "no ratio against an empty rank");
    }
}
