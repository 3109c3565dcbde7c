//! Buffers at the peak grouped by culprit line: the "By Python line" rows and the editor's
//! `% of heap peak` hints.

use super::diagnose::{self, pct};
use super::plan::{Plan, Role, SMALL_BUFFER_BYTES};
use crate::findings::Label;
use crate::findings::Location;
use crate::site::{PercentOf, Site, SiteFrame};

/// Buffers at the peak grouped by culprit line.
pub fn sites(plan: &Plan, pick: &dyn Fn(&[Location]) -> Option<usize>, top: usize) -> Vec<Site> {
    // (site, only heap buffers, bytes per role)
    type Acc = (Site, bool, Vec<(Role, u64)>);
    let mut out: Vec<Acc> = Vec::new();
    for b in &plan.at_peak {
        let (loc, stack) = diagnose::culprit(b, pick);
        let i = match out.iter().position(|s| s.0.location == loc) {
            Some(i) => i,
            None => {
                out.push((
                    Site {
                        frame: if loc.is_some() {
                            SiteFrame::User
                        } else {
                            SiteFrame::None
                        },
                        location: loc,
                        bytes: 0,
                        requested_bytes: None,
                        blocks: 0,
                        percent: 0.0,
                        percent_of: PercentOf::HeapPeak,
                        label: Label::Read,
                        stack,
                        callers: Vec::new(),
                        role: None,
                        scope: Some(plan.module.clone()),
                    },
                    true,
                    Vec::new(),
                ));
                out.len() - 1
            }
        };
        let s = &mut out[i];
        s.0.bytes += b.size;
        s.0.blocks += 1;
        s.1 &= b.heap;
        let role = if b.heap { b.role } else { Role::Other };
        match s.2.iter_mut().find(|r| r.0 == role) {
            Some(r) => r.1 += b.size,
            None => s.2.push((role, b.size)),
        }
        if !b.heap && s.0.role.is_none() {
            s.0.role = Some(b.category.site_role());
        }
    }
    let mut sites: Vec<Site> = out
        .into_iter()
        .map(|(mut s, heap_only, roles)| {
            if heap_only {
                s.percent = pct(s.bytes, plan.heap_peak_bytes);
                s.role = roles.iter().max_by_key(|r| r.1).map(|r| r.0.site_role());
            } else {
                s.percent = pct(s.bytes, plan.total_peak_bytes);
                s.percent_of = PercentOf::Peak;
            }
            s
        })
        .collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.bytes));
    // Lines holding only scalars are noise next to megabytes (xprof lumps them as `small`).
    if sites.iter().any(|s| s.bytes >= SMALL_BUFFER_BYTES) {
        sites.retain(|s| s.bytes >= SMALL_BUFFER_BYTES);
    }
    sites.truncate(top.max(1));
    sites
}
