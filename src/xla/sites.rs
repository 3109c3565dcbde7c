//! Buffers at the peak grouped by Python line: the "By Python line" rows and the editor's
//! `% of heap peak` hints.
//!
//! Two kinds of rows, never mixed. **Read** rows are xprof's own mapping: each buffer at the
//! line its memory viewer shows (the op's source line, or none), so the read rows alone equal
//! `peak_bytes_by_source`. **Inferred** rows are attributions of ours, for buffers whose read
//! line is no line of the user's: a buffer without a line that a scan's `while` loop carries
//! goes to the scan's call; a buffer whose line is library code goes to the first user frame of
//! its stack. Each inferred row names what xprof shows instead.

use super::diagnose::pct;
use super::plan::{PeakBuffer, Plan, Role, SMALL_BUFFER_BYTES};
use crate::findings::{Label, Location};
use crate::frames::FrameFilter;
use crate::site::{PercentOf, Site, SiteFrame};

/// One row being summed: the site, whether all its buffers are heap buffers, bytes per role.
struct Acc {
    site: Site,
    heap_only: bool,
    roles: Vec<(Role, u64)>,
}

impl Acc {
    fn add(&mut self, b: &PeakBuffer) {
        self.site.bytes += b.size;
        self.site.blocks += 1;
        self.heap_only &= b.heap;
        let role = if b.heap { b.role } else { Role::Other };
        match self.roles.iter_mut().find(|r| r.0 == role) {
            Some(r) => r.1 += b.size,
            None => self.roles.push((role, b.size)),
        }
        if !b.heap && self.site.role.is_none() {
            self.site.role = Some(b.category.site_role());
        }
    }
}

/// The line xprof shows for a buffer.
fn read_line(b: &PeakBuffer) -> Option<Location> {
    b.source.as_ref().map(|f| f.location())
}

/// Our attribution of a buffer whose read line is not the user's.
struct Attribution {
    line: Location,
    stack: Vec<Location>,
    /// What xprof shows instead (library code), if anything.
    reference: Option<Location>,
    /// The loop that carries the buffer.
    via: Option<String>,
}

fn inferred_line(b: &PeakBuffer, filter: &FrameFilter) -> Option<Attribution> {
    match &b.source {
        Some(src) if !filter.is_user(&src.file) => {
            let stack: Vec<Location> = b.stack.iter().map(|f| f.location()).collect();
            let (i, _) = filter.pick(stack.iter().map(|l| l.file.as_str()))?;
            let user = stack.get(i).filter(|l| filter.is_user(&l.file))?.clone();
            Some(Attribution {
                line: user,
                stack,
                reference: Some(src.location()),
                via: None,
            })
        }
        None if !b.via_stack.is_empty() => {
            let stack: Vec<Location> = b.via_stack.iter().map(|f| f.location()).collect();
            let (i, _) = filter.pick(stack.iter().map(|l| l.file.as_str()))?;
            Some(Attribution {
                line: stack[i].clone(),
                stack,
                reference: None,
                via: b.via.clone(),
            })
        }
        _ => None,
    }
}

fn new_site(plan: &Plan, location: Option<Location>, stack: Vec<Location>, label: Label) -> Site {
    Site {
        frame: if location.is_some() {
            SiteFrame::User
        } else {
            SiteFrame::None
        },
        location,
        bytes: 0,
        requested_bytes: None,
        blocks: 0,
        percent: 0.0,
        percent_of: PercentOf::HeapPeak,
        label,
        stack: stack.into(),
        callers: Vec::new(),
        role: None,
        scope: Some(plan.module.clone()),
        reference_line: None,
        carried_by: None,
    }
}

fn same_line(a: &Option<Location>, b: &Option<Location>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.file == b.file && a.line == b.line,
        (None, None) => true,
        _ => false,
    }
}

/// Buffers at the peak grouped by line: the read rows (largest first), then the inferred ones.
pub fn sites(plan: &Plan, filter: &FrameFilter, top: usize) -> Vec<Site> {
    let mut read: Vec<Acc> = Vec::new();
    let mut inferred: Vec<Acc> = Vec::new();
    // Rows under 16 KiB are lumped as `small` by xprof; its by-line table counts named rows only.
    for b in plan.at_peak.iter().filter(|b| b.size >= SMALL_BUFFER_BYTES) {
        let loc = read_line(b);
        let i = match read.iter().position(|a| same_line(&a.site.location, &loc)) {
            Some(i) => i,
            None => {
                let stack = b.stack.iter().map(|f| f.location()).collect();
                read.push(Acc {
                    site: new_site(plan, loc, stack, Label::Read),
                    heap_only: true,
                    roles: Vec::new(),
                });
                read.len() - 1
            }
        };
        read[i].add(b);
        if let Some(Attribution {
            line,
            stack,
            reference,
            via,
        }) = inferred_line(b, filter)
        {
            let loc = Some(line);
            let i = match inferred
                .iter()
                .position(|a| same_line(&a.site.location, &loc) && a.site.carried_by == via)
            {
                Some(i) => i,
                None => {
                    let mut site = new_site(plan, loc, stack, Label::Inferred);
                    site.reference_line = reference;
                    site.carried_by = via;
                    inferred.push(Acc {
                        site,
                        heap_only: true,
                        roles: Vec::new(),
                    });
                    inferred.len() - 1
                }
            };
            inferred[i].add(b);
        }
    }
    let finish = |rows: Vec<Acc>| -> Vec<Site> {
        let mut sites: Vec<Site> = rows
            .into_iter()
            .map(|a| {
                let mut s = a.site;
                if a.heap_only {
                    s.percent = pct(s.bytes, plan.heap_peak_bytes);
                    s.role = a.roles.iter().max_by_key(|r| r.1).map(|r| r.0.site_role());
                } else {
                    s.percent = pct(s.bytes, plan.total_peak_bytes);
                    s.percent_of = PercentOf::Peak;
                }
                s
            })
            .collect();
        sites.sort_by_key(|s| std::cmp::Reverse(s.bytes));
        sites.truncate(top.max(1));
        sites
    };
    let mut out = finish(read);
    out.extend(finish(inferred));
    out
}
