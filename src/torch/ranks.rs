//! Per-rank snapshots: a comparison of all ranks (peak, live, inactive, OOMs, top site) that
//! every rank's report carries, so imbalance and replication are visible from any one of them,
//! and PT012 (rank skew): a site where some ranks hold far more than the median rank.
//!
//! The comparison needs only each rank's [`RankSummary`] (totals and largest sites), which every
//! report's JSON carries (`torch.rank_summary`): ranks analysed where their snapshots were
//! written can be compared from their summaries alone (`memlsp compare`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::findings::{Code, Evidence, Finding, Label, Location, Severity, fmt_bytes};
use crate::torch::Analysis;
use crate::torch::model::Snapshot;

/// Sites a rank summary lists (the largest); a site a rank does not list holds less there than
/// its smallest listed one.
pub const SUMMARY_SITES: usize = 64;

/// What one rank contributes to a comparison of ranks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankSummary {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub inactive_bytes: u64,
    /// Reconstructed live peak over the trace (largest device), when the trace allows.
    pub peak_live_bytes_reconstructed: Option<u64>,
    pub oom_events: u64,
    /// Its largest live sites (measured), at most [`SUMMARY_SITES`].
    pub sites: Vec<RankSite>,
}

/// One site of a rank summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankSite {
    /// `<file>:<line>:<function>` or `<no stack>`: the key sites are matched by across ranks.
    pub site: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    pub bytes: u64,
}

impl RankSummary {
    /// The summary of one analysed snapshot.
    pub fn of(snap: &Snapshot, a: &Analysis) -> RankSummary {
        let o = &a.totals.overall;
        RankSummary {
            allocated_bytes: o.allocated,
            reserved_bytes: o.reserved,
            inactive_bytes: o.inactive,
            peak_live_bytes_reconstructed: a
                .timeline
                .devices
                .iter()
                .filter(|t| t.live_peak_index.is_some())
                .map(|t| t.live_peak.max(0) as u64)
                .max(),
            oom_events: a.totals.oom_events().count() as u64,
            sites: a
                .sites
                .sites
                .iter()
                .take(SUMMARY_SITES)
                .map(|s| {
                    let l = s.key.and_then(|k| crate::torch::stacks::location(snap, k));
                    RankSite {
                        site: s.site.clone(),
                        file: l.as_ref().map(|l| l.file.clone()),
                        line: l.as_ref().map(|l| l.line),
                        function: l.map(|l| l.function),
                        bytes: s.bytes,
                    }
                })
                .collect(),
        }
    }
}

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
    /// The rank number: from the file name (`rank3_…`), else its place in the comparison.
    pub rank: usize,
    /// The rank's largest sites (for PT012; not repeated in every report's comparison).
    #[serde(skip)]
    pub sites: Vec<RankSite>,
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
    /// Each listed site across the ranks, built once: PT012 asks it for every site of every
    /// rank (1,024 ranks × 64 sites would otherwise scan every other rank's list each time).
    #[serde(skip)]
    across: std::collections::HashMap<String, Across>,
}

/// One site across the ranks: who lists it with how many bytes, and the median over all ranks
/// (a rank that does not list it counted as 0).
#[derive(Clone, Debug, PartialEq)]
struct Across {
    /// (row, bytes), by row.
    held: Vec<(usize, u64)>,
    median: u64,
}

impl Across {
    fn of(rows: &[RankRow]) -> std::collections::HashMap<String, Across> {
        let mut by: std::collections::HashMap<String, Across> = Default::default();
        for (j, r) in rows.iter().enumerate() {
            for s in &r.sites {
                let a = by.entry(s.site.clone()).or_insert(Across {
                    held: Vec::new(),
                    median: 0,
                });
                // A site listed twice by one rank: its first entry, as a lookup would find.
                if a.held.last().is_none_or(|h| h.0 != j) {
                    a.held.push((j, s.bytes));
                }
            }
        }
        let n = rows.len();
        for a in by.values_mut() {
            let mut b: Vec<u64> = a.held.iter().map(|h| h.1).collect();
            b.sort_unstable();
            // Sorted over all ranks: the unlisted ranks' zeros first, then `b`.
            let zeros = n - b.len();
            let at = |k: usize| if k < zeros { 0 } else { b[k - zeros] };
            a.median = if n % 2 == 1 {
                at(n / 2)
            } else {
                (at(n / 2 - 1) + at(n / 2)) / 2
            };
        }
        by
    }

    /// This site's bytes on row `j`, if that rank lists it.
    fn on(&self, j: usize) -> Option<u64> {
        self.held
            .binary_search_by_key(&j, |h| h.0)
            .ok()
            .map(|k| self.held[k].1)
    }
}

impl RankRow {
    /// The row of rank `rank` from its summary.
    pub fn of(path: &Path, rank: usize, s: &RankSummary) -> RankRow {
        let top = s.sites.first();
        RankRow {
            path: path.to_path_buf(),
            allocated: s.allocated_bytes,
            reserved: s.reserved_bytes,
            inactive: s.inactive_bytes,
            peak: s.peak_live_bytes_reconstructed,
            ooms: s.oom_events,
            top_site: top.map(|t| t.site.clone()).unwrap_or_else(|| "–".into()),
            top_percent: top.and_then(|t| {
                (s.allocated_bytes > 0).then(|| 100.0 * t.bytes as f64 / s.allocated_bytes as f64)
            }),
            rank,
            sites: s.sites.clone(),
        }
    }
}

/// The rank number in a file name (`rank3_snapshot.pickle`, `snapshot_rank_12.pkl`).
pub fn rank_in_name(p: &Path) -> Option<usize> {
    number_in_name(p, "rank").and_then(|n| usize::try_from(n).ok())
}

/// The number after `key` in a file name (`rank3_snapshot_step10.pickle`: rank 3, step 10).
pub fn number_in_name(p: &Path, key: &str) -> Option<u64> {
    let name = p.file_name()?.to_string_lossy().to_ascii_lowercase();
    let i = name.find(key)?;
    let digits: String = name[i + key.len()..]
        .trim_start_matches(['_', '-'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

impl RankComparison {
    /// The comparison of the ranks whose rows are given, in rank order.
    pub fn with_rows(rows: Vec<RankRow>) -> RankComparison {
        let imbalance = imbalance(&rows);
        let across = if rows.len() < 2 {
            Default::default()
        } else {
            Across::of(&rows)
        };
        RankComparison {
            rows,
            imbalance,
            across,
        }
    }

    /// Every rank holds about the same live bytes (within 5 %).
    pub fn uniform(&self) -> bool {
        self.rows.len() > 1 && self.imbalance.is_some_and(|r| r <= 1.05)
    }

    /// Scope and evidence the comparison adds to the findings of row `i`, and its PT012s.
    pub fn annotate(&self, i: usize, findings: &mut Vec<Finding>) {
        let rank = self.rows.get(i).map_or(i, |r| r.rank);
        findings.extend(self.skew(i));
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

impl RankComparison {
    /// PT012 for row `i`: each site where this rank holds far more than the median rank (at
    /// least 50 % more and 64 MiB more). A rank that does not list a site holds less there than
    /// its smallest listed site: counted as 0 (the median is then a lower bound, said so).
    pub fn skew(&self, i: usize) -> Vec<Finding> {
        let n = self.rows.len();
        let Some(row) = self.rows.get(i) else {
            return Vec::new();
        };
        if n < 2 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for s in &row.sites {
            let Some(across) = self.across.get(&s.site) else {
                continue;
            };
            let median = across.median;
            let excess = s.bytes.saturating_sub(median);
            if excess < SKEW_MIN_BYTES || (s.bytes as f64) < SKEW_RATIO * median as f64 {
                continue;
            }
            let mut per: Vec<(usize, Option<u64>)> = self
                .rows
                .iter()
                .enumerate()
                .map(|(j, r)| (r.rank, across.on(j)))
                .collect();
            let shown = |b: Option<u64>| b.map_or("below its listed sites".to_string(), fmt_bytes);
            per.sort_by_key(|p| std::cmp::Reverse(p.1.unwrap_or(0)));
            let listed: Vec<String> = per
                .iter()
                .take(16)
                .map(|(r, b)| format!("rank {r}: {}", shown(*b)))
                .collect();
            let more = if n > 16 {
                format!(", … {} more", n - 16)
            } else {
                String::new()
            };
            let unlisted = per.iter().filter(|p| p.1.is_none()).count();
            let place = match (&s.file, s.line) {
                (Some(f), Some(l)) => format!("{f}:{l}"),
                _ => s.site.clone(),
            };
            let mut f = Finding::new(
                Code::PT012,
                Severity::Warning,
                format!(
                    "rank {} holds {} more at {place} than the median rank ({} vs {} across {n} ranks)",
                    row.rank,
                    fmt_bytes(excess),
                    fmt_bytes(s.bytes),
                    fmt_bytes(median)
                ),
            )
            .bytes(excess, None, Label::Measured)
            .evidence(Evidence::measured(format!(
                "live bytes at this site per rank, largest first: {}{more}",
                listed.join(", ")
            )));
            if unlisted > 0 {
                f = f.evidence(Evidence::inferred(format!(
                    "{unlisted} rank(s) do not list this site among their largest {SUMMARY_SITES}: counted as 0, so the median is a lower bound"
                )));
            }
            f = f.evidence(Evidence::inferred(
                "uneven data (sequence lengths, a rank-0-only step: logging, evaluation, checkpointing) or state placed on one rank; \
                 compare what this line does on that rank",
            ));
            if let (Some(file), Some(line)) = (&s.file, s.line) {
                let l = Location::new(file.clone(), line, s.function.clone().unwrap_or_default());
                f = f.at(Some(l.clone()), vec![l]);
            }
            out.push(f);
        }
        out
    }
}

/// PT012 needs this much more than the median…
const SKEW_MIN_BYTES: u64 = 64 << 20;
/// …and this ratio to it.
const SKEW_RATIO: f64 = 1.5;

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
            rank: 0,
            sites: Vec::new(),
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

    /// The median over an even number of ranks, one of which does not list the site (a 0).
    #[test]
    fn skew_is_measured_against_the_median_with_unlisted_ranks_as_zero() {
        const MIB: u64 = 1 << 20;
        let site = |bytes: u64| RankSite {
            site: "m.py:7:f".into(),
            file: Some("m.py".into()),
            line: Some(7),
            function: Some("f".into()),
            bytes,
        };
        let ranks: Vec<RankRow> = [Some(1024 * MIB), Some(100 * MIB), None, Some(300 * MIB)]
            .iter()
            .enumerate()
            .map(|(r, b)| RankRow {
                rank: r,
                sites: b.map(site).into_iter().collect(),
                ..row(2048 * MIB)
            })
            .collect();
        let cmp = RankComparison::with_rows(ranks);
        // Sorted 0, 100, 300, 1024 MiB: the median is 200 MiB.
        let f = cmp.skew(0);
        assert_eq!(f.len(), 1);
        assert_eq!(
            f[0].message,
            "rank 0 holds 824.00 MiB more at m.py:7 than the median rank (1.00 GiB vs 200.00 MiB across 4 ranks)"
        );
        assert_eq!(
            f[0].evidence[0].text,
            "live bytes at this site per rank, largest first: rank 0: 1.00 GiB, rank 3: 300.00 MiB, rank 1: 100.00 MiB, rank 2: below its listed sites"
        );
        assert!(
            f[0].evidence[1]
                .text
                .starts_with("1 rank(s) do not list this site")
        );
        // Rank 3: 100 MiB over the median (≥ 64 MiB) and exactly 1.5× it: flagged. Rank 1 is
        // below the median, rank 2 lists nothing.
        assert_eq!(cmp.skew(3).len(), 1);
        assert!(cmp.skew(1).is_empty());
        assert!(cmp.skew(2).is_empty());
    }
}
