//! The categories view in text: live memory at each device's peak by role (inferred from the
//! stacks) and by the user's `--category NAME=REGEX`. The same values are
//! `captures[].torch.categories` in JSON and a bar panel on the page.

use std::fmt::Write as _;

use crate::findings::fmt_bytes;
use crate::torch::categories::Part;
use crate::torch::summary::Summary;

fn rows(s: &mut String, parts: &[Part], label: &str) {
    for p in parts {
        let pattern = p
            .pattern
            .as_deref()
            .map(|r| format!(" /{r}/"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "    {:<28} {:>11} {:>5.1}%  {} blocks [measured]{label}",
            format!("{}{pattern}", p.name),
            fmt_bytes(p.bytes),
            p.percent,
            p.blocks
        );
    }
}

/// The "Categories" section (empty when no device has live memory).
pub fn text(t: &Summary) -> String {
    let mut s = String::new();
    if t.categories.is_empty() {
        return s;
    }
    let _ = writeln!(s, "Categories of live memory at the peak");
    for d in &t.categories {
        let at = match d.index {
            Some(i) => format!("at the trace's peak (after entry {i})"),
            None => "at the snapshot (no trace)".into(),
        };
        let _ = writeln!(
            s,
            "  device {} {at}: {} in {} blocks [measured]",
            d.device,
            fmt_bytes(d.total_bytes),
            d.total_blocks
        );
        let _ = writeln!(s, "   by role (from the stacks):");
        rows(&mut s, &d.by_role, ", role [inferred]");
        if !d.custom.is_empty() {
            let _ = writeln!(
                s,
                "   by --category (first match over frames' filename:function):"
            );
            rows(&mut s, &d.custom, "");
        }
    }
    s.push('\n');
    s
}
