//! `--diff LATER`: which sites grew between two snapshots of one run (PT011).
//!
//! A site whose live bytes AND block count both grew between two snapshots taken k steps apart is
//! leaking or retaining; bytes alone can grow from a larger batch, blocks alone from splitting.

use rustc_hash::FxHashMap;

use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes, fmt_signed_bytes};
use crate::torch::Analysis;
use crate::torch::model::{Snapshot, StackId};
use crate::torch::stacks::culprit;
use crate::torch::stacks::{Role, SiteKey};

/// One site compared between the two snapshots.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteDelta {
    pub site: String,
    /// Key and stack in the later snapshot.
    pub key: SiteKey,
    pub stack: Option<StackId>,
    pub role: Role,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub blocks_before: u64,
    pub blocks_after: u64,
}

impl SiteDelta {
    pub fn byte_delta(&self) -> i128 {
        i128::from(self.bytes_after) - i128::from(self.bytes_before)
    }
    pub fn block_delta(&self) -> i128 {
        i128::from(self.blocks_after) - i128::from(self.blocks_before)
    }
    pub fn grew(&self) -> bool {
        self.bytes_after > self.bytes_before && self.blocks_after > self.blocks_before
    }
}

/// The comparison of two snapshots.
#[derive(Clone, Debug, PartialEq)]
pub struct Diff {
    pub allocated_before: u64,
    pub allocated_after: u64,
    pub reserved_before: u64,
    pub reserved_after: u64,
    /// Sites that grew in bytes and blocks, largest byte growth first.
    pub grown: Vec<SiteDelta>,
    /// Sites present before and gone (or shrunk) after, largest shrink first.
    pub shrunk: Vec<SiteDelta>,
}

/// Compare the sites of two analysed snapshots (matched by `<file>:<line>:<name>`).
pub fn diff(_before: &Snapshot, a: &Analysis, _after: &Snapshot, b: &Analysis) -> Diff {
    let old: FxHashMap<&str, (u64, u64)> = a
        .sites
        .sites
        .iter()
        .map(|s| (s.site.as_str(), (s.bytes, s.blocks)))
        .collect();
    let mut seen: FxHashMap<&str, ()> = FxHashMap::default();
    let mut all = Vec::new();
    for s in &b.sites.sites {
        let (bb, nb) = old.get(s.site.as_str()).copied().unwrap_or((0, 0));
        seen.insert(s.site.as_str(), ());
        all.push(SiteDelta {
            site: s.site.clone(),
            key: s.key,
            stack: s.stack,
            role: s.role(),
            bytes_before: bb,
            bytes_after: s.bytes,
            blocks_before: nb,
            blocks_after: s.blocks,
        });
    }
    for s in &a.sites.sites {
        if !seen.contains_key(s.site.as_str()) {
            all.push(SiteDelta {
                site: s.site.clone(),
                key: None,
                stack: None,
                role: s.role(),
                bytes_before: s.bytes,
                bytes_after: 0,
                blocks_before: s.blocks,
                blocks_after: 0,
            });
        }
    }
    let mut grown: Vec<SiteDelta> = all.iter().filter(|d| d.grew()).cloned().collect();
    grown.sort_by(|x, y| {
        y.byte_delta()
            .cmp(&x.byte_delta())
            .then(x.site.cmp(&y.site))
    });
    let mut shrunk: Vec<SiteDelta> = all.into_iter().filter(|d| d.byte_delta() < 0).collect();
    shrunk.sort_by(|x, y| {
        x.byte_delta()
            .cmp(&y.byte_delta())
            .then(x.site.cmp(&y.site))
    });
    Diff {
        allocated_before: a.totals.overall.allocated,
        allocated_after: b.totals.overall.allocated,
        reserved_before: a.totals.overall.reserved,
        reserved_after: b.totals.overall.reserved,
        grown,
        shrunk,
    }
}

/// PT011 for the sites that grew (at most 5, user-attributed ones only get a location).
pub fn findings(after: &Snapshot, d: &Diff) -> Vec<Finding> {
    let mut out = Vec::new();
    for g in d.grown.iter().take(5) {
        let (loc, stack) = culprit(after, g.key, g.stack);
        let new_optimizer = g.role == Role::OptimizerState && g.bytes_before == 0;
        let severity = if new_optimizer {
            Severity::Information
        } else {
            Severity::Warning
        };
        let mut f = Finding::new(
            Code::PT011,
            severity,
            format!(
                "{} grew by {} and {} blocks between the two snapshots{}.",
                g.site,
                fmt_signed_bytes(g.byte_delta()),
                g.block_delta(),
                if new_optimizer {
                    " — optimizer state created by the first step, expected"
                } else {
                    ": live bytes and block count both grew, so it is leaking or retained"
                }
            ),
        )
        .at(loc, stack)
        .bytes(
            u64::try_from(g.byte_delta()).unwrap_or(0),
            None,
            Label::Measured,
        )
        .evidence(Evidence::measured(format!(
            "live bytes {} → {} ({}), blocks {} → {} ({:+})",
            fmt_bytes(g.bytes_before),
            fmt_bytes(g.bytes_after),
            fmt_signed_bytes(g.byte_delta()),
            g.blocks_before,
            g.blocks_after,
            g.block_delta()
        )))
        .evidence(Evidence::inferred(format!(
            "role from the stack: {}",
            g.role.as_str()
        )));
        if !new_optimizer {
            f = f.fix(Fix::advice(
                "Find what keeps these tensors: a container appended each step (store `.detach().cpu()` \
                 or bound it) or an accumulated tensor that requires grad (`.detach()` / `.item()`)",
            ));
        }
        out.push(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::AnalysisOptions;
    use crate::torch::analyse;
    use crate::torch::model::BlockState;
    use crate::torch::stacks::tests::intern;
    use crate::torch::totals::tests::{block, segment};

    fn snap_with(blocks: &[(u64, u64, usize)]) -> Snapshot {
        // (line, size, count)
        let mut s = Snapshot::default();
        let mut bl = Vec::new();
        for (line, size, count) in blocks {
            let st = intern(&mut s, &[("/u/train.py", *line, "main")]);
            for _ in 0..*count {
                let mut b = block(*size, *size, BlockState::ActiveAllocated);
                b.stack = Some(st);
                bl.push(b);
            }
        }
        s.segments = vec![segment(0, 1 << 30, bl)];
        s
    }

    #[test]
    fn only_sites_growing_in_bytes_and_blocks_are_pt011() {
        let before = snap_with(&[(10, 4096, 2), (20, 8192, 1), (30, 512, 4)]);
        // line 10 grows in both, line 20 grows in bytes only, line 30 shrinks.
        let after = snap_with(&[(10, 4096, 5), (20, 65536, 1), (30, 512, 1)]);
        let o = AnalysisOptions::default();
        let a = analyse(&before, &o);
        let b = analyse(&after, &o);
        let d = diff(&before, &a, &after, &b);
        assert_eq!(d.grown.len(), 1);
        assert_eq!(d.grown[0].site, "/u/train.py:10:main");
        assert_eq!(d.grown[0].byte_delta(), 3 * 4096);
        assert_eq!(d.grown[0].block_delta(), 3);
        let f = findings(&after, &d);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].code, Code::PT011);
        assert_eq!(f[0].location.as_ref().map(|l| l.line), Some(10));
        assert_eq!(d.shrunk[0].site, "/u/train.py:30:main");
    }
}
