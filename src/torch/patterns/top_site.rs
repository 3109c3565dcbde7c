//! PT001: the top site by live memory, as a hint on its line.

use super::*;

/// PT001: the site that holds the most live memory (attribution hint).
pub(super) fn top_site(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    let allocated = a.totals.overall.allocated;
    // A tiny site beside mostly stackless memory is no answer: PT015 says so instead.
    if crate::torch::capture_limits::top_is_tiny(a) {
        return;
    }
    let Some(s) = a.sites.sites.iter().find(|s| s.key.is_some()) else {
        return;
    };
    let (loc, stack) = culprit(snap, s.key, s.stack);
    let p = s.percent_of(allocated);
    let site_role = crate::torch::site_role(a, out, s);
    let known = site_role != SiteRole::Unknown;
    let role = site_role.as_str();
    let mut f = Finding::new(
        Code::PT001,
        Severity::Hint,
        format!(
            "{} of live memory ({}) was allocated at {}{}.",
            pct_text(p),
            fmt_bytes(s.bytes),
            where_(snap, s.key),
            if known {
                format!(" ({role})")
            } else {
                String::new()
            }
        ),
    )
    .at(loc, stack)
    .bytes(s.bytes, p, Label::Measured)
    .evidence(Evidence::measured(format!(
        "{} active_allocated blocks, {} B ({} B requested)",
        s.blocks, s.bytes, s.requested_bytes
    )));
    if site_role == SiteRole::UserContainer {
        f = f.evidence(Evidence::inferred(
            "role: user container (the trace shows this line growing every step, PT003)",
        ));
    } else if known {
        f = f.evidence(Evidence::inferred(format!("role from the stack: {role}")));
    }
    out.push(f);
}
