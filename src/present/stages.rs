//! The stages view in text: each traced device's recorded (`external_annotations`) or inferred
//! training stages with their peak, growth and the largest site live at the peak. The same
//! values are `captures[].torch.stages` in JSON and the bands of the page's timeline.

use std::fmt::Write as _;

use crate::findings::fmt_bytes;
use crate::torch::stages::summary::StageSummary;
use crate::torch::summary::Summary;

/// Stages listed per device at most (the stage holding the peak is always listed).
pub const SHOWN: usize = 12;

fn signed(v: i64) -> String {
    if v < 0 {
        format!("-{}", fmt_bytes(v.unsigned_abs()))
    } else {
        format!("+{}", fmt_bytes(v as u64))
    }
}

fn base(site: &str) -> &str {
    site.rsplit(['/', '\\']).next().unwrap_or(site)
}

fn line(s: &mut String, st: &StageSummary) {
    let repeats = if st.repeats > 1 {
        format!(" ×{}", st.repeats)
    } else {
        String::new()
    };
    let top = st
        .top_sites
        .first()
        .map(|x| {
            format!(
                "; largest live at its peak: {} {}",
                base(&x.site),
                fmt_bytes(x.bytes)
            )
        })
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "  {}step {:<3} {}{repeats} [{}]  entries {}..{}  peak {} growth {} [measured]{top}",
        if st.holds_device_peak { "► " } else { "  " },
        st.step,
        if st.source == "recorded" {
            format!("`{}`", crate::present::escape::one_line(&st.name))
        } else {
            crate::present::escape::one_line(&st.name).into_owned()
        },
        st.label,
        st.span.start_index,
        st.span.end_index,
        fmt_bytes(st.peak_bytes.max(0) as u64),
        signed(st.growth_bytes),
    );
}

/// The "Stages" section (empty when no device has a trace).
pub fn text(t: &Summary) -> String {
    let mut s = String::new();
    if t.stages.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "Stages ({}; ► holds the device's peak)",
        if t.annotations_recorded {
            "names and spans read from external_annotations, gaps inferred from the trace"
        } else {
            "no external_annotations recorded: inferred from the trace (forward growth, the frees \
             after it named by their release stacks, optimizer-state allocations)"
        }
    );
    let mut devices: Vec<i64> = t.stages.iter().map(|x| x.device).collect();
    devices.dedup();
    for d in devices {
        let all: Vec<&StageSummary> = t.stages.iter().filter(|x| x.device == d).collect();
        let _ = writeln!(s, "  device {d}: {} stages", all.len());
        let mut shown = 0;
        for st in &all {
            if shown < SHOWN || st.holds_device_peak {
                line(&mut s, st);
                shown += 1;
            }
        }
        if all.len() > shown {
            let _ = writeln!(s, "    … {} more in --format json", all.len() - shown);
        }
    }
    s.push('\n');
    s
}

/// Bands of a device's timeline picture: `[start, end, name, label, step, holds_peak,
/// peak_bytes]` of each outermost stage that holds entries (at most [`BANDS`]).
pub fn bands(t: &Summary, device: i64) -> Vec<serde_json::Value> {
    t.stages
        .iter()
        .filter(|s| s.device == device && s.depth == 0 && s.span.end_index > s.span.start_index)
        .take(BANDS)
        .map(|s| {
            serde_json::json!([
                s.span.start_index,
                s.span.end_index,
                s.name,
                s.label,
                s.step,
                s.holds_device_peak,
                s.peak_bytes
            ])
        })
        .collect()
}

/// Stage bands drawn per device at most.
pub const BANDS: usize = 400;
