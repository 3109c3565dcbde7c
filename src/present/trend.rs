//! The trend view in text: three or more snapshots of one run, each site's live bytes per step,
//! its slope and whether it grew at every snapshot (the series' PT011). The same values are
//! `captures[].torch.trend` in JSON.

use std::fmt::Write as _;

use crate::findings::fmt_bytes;
use crate::torch::summary::Summary;

pub fn text(t: &Summary) -> String {
    let mut s = String::new();
    let Some(tr) = &t.trend else { return s };
    let steps = tr
        .steps
        .iter()
        .map(|x| format!("step {x}"))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(s, "Trend over {} snapshots ({steps})", tr.steps.len());
    let bytes = |v: &[u64]| {
        v.iter()
            .map(|b| fmt_bytes(*b))
            .collect::<Vec<_>>()
            .join(" → ")
    };
    let _ = writeln!(s, "  live      {} [measured]", bytes(&tr.allocated_bytes));
    let _ = writeln!(s, "  reserved  {} [measured]", bytes(&tr.reserved_bytes));
    let growing: Vec<_> = tr.sites.iter().filter(|x| x.grows_every_step).collect();
    if growing.is_empty() {
        let _ = writeln!(
            s,
            "  no site grew at every snapshot [measured]: no leak verdict"
        );
    }
    for x in tr.sites.iter().take(8) {
        let _ = writeln!(
            s,
            "  {} {}\n      {} [measured]; slope {}{} per step [inferred]",
            if x.grows_every_step {
                "grows every step:"
            } else {
                "changed:"
            },
            x.site,
            bytes(&x.bytes),
            if x.slope_bytes_per_step < 0.0 {
                "-"
            } else {
                "+"
            },
            fmt_bytes(x.slope_bytes_per_step.abs() as u64)
        );
    }
    s.push('\n');
    s
}
