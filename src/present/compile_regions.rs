//! The compile-regions view in text: bytes live at each device's peak per `compile_context`
//! (torch 2.8+), or that the snapshot does not record it. The same values are
//! `captures[].torch.compile_contexts` in JSON and a bar panel on the page.

use std::fmt::Write as _;

use crate::findings::fmt_bytes;
use crate::torch::summary::Summary;

/// The "Compile regions" section (empty without a trace).
pub fn text(t: &Summary) -> String {
    let mut s = String::new();
    if t.timeline.is_empty() {
        return s;
    }
    let c = &t.compile_contexts;
    if !c.recorded {
        let _ = writeln!(
            s,
            "Compile regions: not recorded (no trace entry has `compile_context`, torch 2.8+)\n"
        );
        return s;
    }
    let _ = writeln!(s, "Compile regions (compile_context) at the peak");
    for d in &c.devices {
        let _ = writeln!(
            s,
            "  device {} after entry {}: {} live allocated in the trace [measured]",
            d.device,
            d.peak_index,
            fmt_bytes(d.traced_bytes)
        );
        for r in &d.regions {
            let _ = writeln!(
                s,
                "    {:<40} {:>11}  {} blocks [measured]",
                crate::present::escape::one_line(&r.compile_context),
                fmt_bytes(r.bytes),
                r.blocks
            );
        }
        if d.regions.is_empty() {
            let _ = writeln!(
                s,
                "    no block live at the peak was allocated inside a torch.compile region [measured]"
            );
        }
        let _ = writeln!(
            s,
            "    {:<40} {:>11}  {} blocks [measured]",
            "outside any region (N/A)",
            fmt_bytes(d.outside_bytes),
            d.outside_blocks
        );
    }
    s.push('\n');
    s
}
