//! The few words a finding shows at the end of its own line (an editor's inlay hint): what it
//! holds, and what its fix saves when that was simulated or bounded (never a guess).

use crate::findings::{Code, Finding, fmt_bytes, fmt_range};

/// `retains 576.00 MiB · fix saves 512.00 MiB of peak (simulated)`, or `None` for the codes whose
/// line already carries the site's share (`38% live memory`).
pub fn finding_hint(f: &Finding) -> Option<String> {
    let b = f.bytes.map(fmt_bytes);
    let what = match (f.code, b) {
        (Code::PT001 | Code::JX009, _) => return None,
        // `+56% vs baseline: 186.09 MiB → 290.16 MiB`: the message's own first words.
        (Code::BL001, _) => f
            .message
            .split(" (")
            .next()
            .unwrap_or(&f.message)
            .to_string(),
        (Code::PT002, Some(b)) => format!("retains {b}"),
        (Code::PT003, Some(b)) => format!("container holds {b}"),
        (Code::PT004, Some(b)) => format!("optimizer state {b}"),
        (Code::PT005, Some(b)) => format!("activations {b}"),
        (Code::PT006, Some(b)) => format!("{b} replicated per rank"),
        (Code::PT007, Some(b)) => format!("cycle holds {b}"),
        (Code::PT008, Some(b)) => format!("OOM: {b} request, memory fragmented"),
        (Code::PT009, Some(b)) => format!("OOM: {b} request"),
        (Code::PT010, Some(b)) => format!("{b} freed late"),
        (Code::PT011, Some(b)) => format!("grew {b}"),
        (Code::JX001, Some(b)) => format!("plan {b} over capacity"),
        (Code::JX002, Some(b)) => format!("{b} kept for backward"),
        (Code::JX003, Some(b)) => format!("{b} at the heap peak"),
        (Code::JX004, Some(b)) => format!("+{b} per execution"),
        (Code::JX005, Some(b)) => format!("{b} not donated"),
        (Code::JX006, Some(b)) => format!("{b} other live arrays"),
        (code, _) => code.pattern().to_string(),
    };
    Some(match saving(f) {
        Some(s) => format!("{what} · fix {s}"),
        None => what,
    })
}

/// What the best-supported fix saves: a simulated peak first, then a bounded range.
fn saving(f: &Finding) -> Option<String> {
    if let Some(sim) = f.fixes.iter().find_map(|x| x.simulated.as_ref()) {
        let saved = sim
            .peak_allocated_before
            .saturating_sub(sim.peak_allocated_after);
        return Some(match (sim.oom_avoided, saved) {
            (Some(true), _) => "avoids the OOM (simulated)".into(),
            (_, 0) => "leaves the peak unchanged (simulated)".into(),
            (_, s) => format!("saves {} of peak (simulated)", fmt_bytes(s)),
        });
    }
    f.fixes.iter().find_map(|x| {
        let (lo, hi) = x.saving_range?;
        Some(format!("saves {} (inferred)", fmt_range(lo, hi)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::{Fix, FixKind, Severity, Simulated};

    #[test]
    fn a_hint_says_what_the_line_holds_and_what_the_simulated_fix_saves() {
        let f = Finding::new(Code::JX005, Severity::Warning, "m").bytes(
            72 << 20,
            None,
            crate::findings::Label::Inferred,
        );
        assert_eq!(finding_hint(&f).as_deref(), Some("72.00 MiB not donated"));
        let mut fix = Fix::new(
            "Accumulate `loss.detach()`",
            FixKind::DetachAccumulated { item: false },
        );
        fix.simulated = Some(Simulated {
            device: 0,
            peak_allocated_before: 1 << 30,
            peak_allocated_after: 512 << 20,
            peak_reserved_before: 1 << 30,
            peak_reserved_after: 512 << 20,
            oom_avoided: None,
            oom_retries: None,
            change: "detached".into(),
        });
        let f = Finding::new(Code::PT002, Severity::Warning, "m")
            .bytes(576 << 20, None, crate::findings::Label::Inferred)
            .fix(fix);
        assert_eq!(
            finding_hint(&f).as_deref(),
            Some("retains 576.00 MiB · fix saves 512.00 MiB of peak (simulated)")
        );
        assert_eq!(
            finding_hint(&Finding::new(Code::PT001, Severity::Hint, "m")),
            None
        );
    }
}
