//! `memlsp fit` and `memlsp predict` as text, JSON and an HTML page. Every number is
//! `simulated` (a replay of the recorded requests through the validated allocator model) and
//! says so; a device whose replay does not validate says why and shows none.

use serde_json::{Value, json};

use crate::findings::fmt_bytes;
use crate::torch::replay::fit_sites::{
    FailureEntry, FitEntry, OnEntry, PredictionReport, SiteEntry,
};
use crate::torch::replay::predict::show_value;

/// One capture's fit, as `memlsp fit` shows it.
pub struct FitCapture<'a> {
    pub file: &'a str,
    pub devices: &'a [FitEntry],
}

/// The inputs of a prediction, as `memlsp predict` shows them.
pub struct PredictInputs<'a> {
    /// (value, file) of each capture.
    pub points: &'a [(f64, String)],
    pub capacity_shown: Option<&'a str>,
}

fn site_text(l: &Option<SiteEntry>) -> String {
    match l {
        Some(l) => format!("{}:{} ({})", l.file, l.line, l.function),
        None => "<no user frame>".into(),
    }
}

/// `{"memlsp": version, "captures": [{"file", "kind": "torch", "torch": {"fit": [...]}}]}`,
/// written.
pub fn fit_json(captures: &[FitCapture]) -> String {
    crate::present::json::render(&fit_document(captures))
}

/// The document of [`fit_json`] (the MCP tool `fit` answers with it).
pub fn fit_document(captures: &[FitCapture]) -> Value {
    json!({
        "memlsp": crate::present::json::VERSION,
        "captures": captures.iter().map(|c| json!({
            "file": c.file,
            "kind": "torch",
            "torch": {"fit": c.devices},
        })).collect::<Vec<_>>(),
    })
}

fn failure_text(out: &mut String, f: &FailureEntry, indent: &str) {
    match f.entry {
        Some(e) => out.push_str(&format!(
            "{indent}first failing request: {} at trace entry {e}, {}\n",
            fmt_bytes(f.size),
            site_text(&f.site)
        )),
        None => out.push_str(&format!(
            "{indent}the blocks live at the first trace entry do not fit by themselves\n"
        )),
    }
    out.push_str(&format!(
        "{indent}then: {} reserved, {} allocated; live by site and role:\n",
        fmt_bytes(f.reserved_bytes),
        fmt_bytes(f.allocated_bytes)
    ));
    for s in &f.live {
        out.push_str(&format!(
            "{indent}  {:>11}  {}  {} ({} block{})\n",
            fmt_bytes(s.bytes),
            site_text(&s.site),
            s.role,
            s.blocks,
            if s.blocks == 1 { "" } else { "s" }
        ));
    }
}

fn on_text(out: &mut String, o: &OnEntry, needs: u64) {
    let cap = o
        .capacity
        .clone()
        .unwrap_or_else(|| fmt_bytes(o.capacity_bytes));
    if o.fits {
        out.push_str(&format!(
            "  on {cap}: fits, {} spare  [simulated]\n",
            fmt_bytes(o.spare_bytes.unwrap_or(0))
        ));
        return;
    }
    out.push_str(&format!(
        "  on {cap}: OOM — this run needs {}  [simulated]\n",
        fmt_bytes(needs)
    ));
    if let Some(f) = &o.first_failure {
        failure_text(out, f, "    ");
    }
    if o.fits_with.is_empty() {
        out.push_str("    no allocator setting tried makes it fit there\n");
    } else {
        out.push_str(&format!(
            "    fits there with PYTORCH_CUDA_ALLOC_CONF={}  [simulated]\n",
            o.fits_with.join(" or ")
        ));
    }
}

/// The lines of one device's fit (also the "Will it fit" section of `memlsp report --on`).
pub fn device_text(out: &mut String, f: &FitEntry) {
    out.push_str(&format!("device {}\n", f.device));
    let Some(needs) = f.needs_bytes else {
        out.push_str(&format!(
            "  {}\n",
            f.note.as_deref().unwrap_or("not simulated")
        ));
        return;
    };
    out.push_str(&format!(
        "  needs {}: the smallest device on which it runs without an OOM, exact to 2 MiB  [simulated]\n",
        fmt_bytes(needs)
    ));
    if let (Some(a), Some(r)) = (f.peak_allocated_bytes, f.peak_reserved_bytes) {
        out.push_str(&format!(
            "    peak allocated {}, peak reserved {} without a limit  [simulated]\n",
            fmt_bytes(a),
            fmt_bytes(r)
        ));
    }
    if let Some(e) = f.needs_bytes_expandable {
        out.push_str(&format!(
            "  with expandable_segments:True: {}  [simulated]\n",
            fmt_bytes(e)
        ));
    }
    if let (Some(mb), Some(b)) = (f.best_max_split_size_mb, f.needs_bytes_max_split) {
        out.push_str(&format!(
            "  with max_split_size_mb:{mb} (the best of 20, 32, 64, 128, 256, 512): {}  [simulated]\n",
            fmt_bytes(b)
        ));
    }
    if let Some(cap) = f.recorded_capacity_bytes {
        out.push_str(&format!(
            "  the recorded device had {} (reserved + free at its OOM)  [read]\n",
            fmt_bytes(cap)
        ));
    }
    if let Some([low, high]) = f.recorded_capacity_range_bytes {
        out.push_str(&format!(
            "  the recorded device had {} to {} (no OOM recorded: the most it granted and the \
             least it refused)  [inferred]\n",
            fmt_bytes(low),
            fmt_bytes(high)
        ));
        // The run fit there (no OOM): how close it came, at either end of the range.
        out.push_str(&format!(
            "    so the run had {} to {} to spare there  [inferred]\n",
            fmt_bytes(low.saturating_sub(needs)),
            fmt_bytes(high.saturating_sub(needs))
        ));
    }
    if let Some(o) = &f.on {
        on_text(out, o, needs);
    }
    if let Some(note) = &f.note {
        out.push_str(&format!("  note: {note}\n"));
    }
}

/// The text of `memlsp fit`.
pub fn fit_text(captures: &[FitCapture]) -> String {
    let mut out = String::new();
    for c in captures {
        out.push_str(&format!("{}\n", c.file));
        if c.devices.is_empty() {
            out.push_str("  no device trace: memory history was not recorded, nothing to replay\n");
        }
        for d in c.devices {
            device_text(&mut out, d);
        }
    }
    out
}

/// The top-level `prediction` object.
pub fn prediction_json(p: &PredictionReport, inputs: &PredictInputs) -> String {
    let q = &p.prediction;
    let mut v = json!({
        "parameter": q.parameter,
        "at": q.at,
        "device": q.device,
        "label": "simulated",
        "peak_allocated_bytes": q.peak_allocated_bytes,
        "peak_reserved_bytes": q.peak_reserved_bytes,
        "reserved_bytes": q.reserved_bytes,
        "needs_bytes": q.needs_bytes,
        "largest_fitting": q.largest_fitting,
        "basis": q.basis.describe(),
        "basis_counts": q.basis,
        "inputs": inputs.points.iter().map(|(v, f)| json!({"value": v, "file": f})).collect::<Vec<_>>(),
        "note": q.note,
    });
    if let Some(o) = &q.on {
        v["on"] = serde_json::to_value(OnEntry::of(
            o,
            p.first_failure.as_ref(),
            inputs.capacity_shown,
        ))
        .unwrap_or(Value::Null);
    }
    crate::present::json::render(&json!({
        "memlsp": crate::present::json::VERSION,
        "prediction": v,
    }))
}

/// The text of `memlsp predict`.
pub fn prediction_text(p: &PredictionReport, inputs: &PredictInputs) -> String {
    let q = &p.prediction;
    let name = &q.parameter;
    let from: Vec<String> = inputs
        .points
        .iter()
        .map(|(v, f)| format!("{name}={} ({f})", show_value(*v)))
        .collect();
    let mut out = format!(
        "predicted {name}={} from {}, device {}\n",
        show_value(q.at),
        from.join(", "),
        q.device
    );
    out.push_str(&format!("  basis: {}\n", q.basis.describe()));
    out.push_str(&format!(
        "  peak allocated {}  [simulated]\n  reserved at the end {}  [simulated]\n  needs {}  [simulated]\n",
        fmt_bytes(q.peak_allocated_bytes),
        fmt_bytes(q.reserved_bytes),
        fmt_bytes(q.needs_bytes)
    ));
    if let Some(o) = &q.on {
        let o = OnEntry::of(o, p.first_failure.as_ref(), inputs.capacity_shown);
        on_text(&mut out, &o, q.needs_bytes);
        match q.largest_fitting {
            Some(v) => out.push_str(&format!(
                "  largest {name} that fits there: {}  [simulated]\n",
                show_value(v)
            )),
            None => out.push_str(&format!("  no {name} tried fits there\n")),
        }
    }
    if let Some(n) = &q.note {
        out.push_str(&format!("  note: {n}\n"));
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A self-contained page of a text result (`--format html`).
pub fn page(title: &str, text: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:2em}}pre{{font-size:13px}}</style>\
         </head><body><h1>{t}</h1><p>Every number marked [simulated] is a replay of the recorded \
         requests through the allocator model that reproduces the recorded segment events.</p>\
         <pre>{b}</pre></body></html>\n",
        t = esc(title),
        b = esc(text)
    )
}

/// The page of `memlsp predict --format html`: allocated bytes over the matched requests for
/// each capture and for the prediction, the capacity and `needs` lines (an inline SVG), then the
/// text.
pub fn prediction_page(p: &PredictionReport, inputs: &PredictInputs) -> String {
    let q = &p.prediction;
    let (w, h, pad) = (900.0f64, 320.0f64, 70.0f64);
    let n = q
        .curves
        .iter()
        .flat_map(|c| c.points.last())
        .map(|x| x[0])
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let mut ymax = q
        .curves
        .iter()
        .flat_map(|c| c.points.iter().map(|x| x[1]))
        .max()
        .unwrap_or(1)
        .max(q.needs_bytes);
    if let Some(o) = &q.on {
        ymax = ymax.max(o.capacity_bytes);
    }
    let ymax = ymax.max(1) as f64;
    let x = |k: u64| pad + (w - pad - 10.0) * k as f64 / n;
    let y = |v: u64| 10.0 + (h - 30.0) * (1.0 - v as f64 / ymax);
    const COLORS: [&str; 6] = [
        "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
    ];
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\" \
         aria-label=\"allocated bytes over the requests\">"
    );
    for k in 0..=4u64 {
        let v = (ymax as u64) * k / 4;
        svg.push_str(&format!(
            "<line x1=\"{pad}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ccc\"/>\
             <text x=\"2\" y=\"{:.1}\" font-size=\"10\">{}</text>",
            w - 10.0,
            y(v) + 3.0,
            esc(&fmt_bytes(v)),
            y = y(v)
        ));
    }
    let mut legend = String::new();
    for (i, c) in q.curves.iter().enumerate() {
        let color = if c.predicted {
            "#8250df"
        } else {
            COLORS[i % COLORS.len()]
        };
        let pts: Vec<String> = c
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p[0]), y(p[1])))
            .collect();
        svg.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"{} points=\"{}\"/>",
            if c.predicted {
                " stroke-dasharray=\"6 3\""
            } else {
                ""
            },
            pts.join(" ")
        ));
        legend.push_str(&format!(
            "<li><span style=\"color:{color}\">■</span> {}={} {}</li>",
            esc(&q.parameter),
            show_value(c.value),
            if c.predicted {
                "predicted [simulated]"
            } else {
                "its recorded sizes, replayed from an empty device [simulated]"
            }
        ));
    }
    let mut hline = |v: u64, color: &str, label: String| {
        svg.push_str(&format!(
            "<line x1=\"{pad}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{color}\" \
             stroke-dasharray=\"3 3\"/><text x=\"{}\" y=\"{:.1}\" font-size=\"11\" \
             fill=\"{color}\">{}</text>",
            w - 10.0,
            pad + 4.0,
            y(v) - 3.0,
            esc(&label),
            y = y(v)
        ));
    };
    hline(
        q.needs_bytes,
        "#1a7f37",
        format!("needs {} (simulated)", fmt_bytes(q.needs_bytes)),
    );
    if let Some(o) = &q.on {
        hline(
            o.capacity_bytes,
            "#bf8700",
            format!(
                "capacity {} (simulated: {})",
                fmt_bytes(o.capacity_bytes),
                if o.fits { "fits" } else { "OOM" }
            ),
        );
    }
    svg.push_str("</svg>");
    let title = format!("memlsp predict {}={}", q.parameter, show_value(q.at));
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:2em}}pre{{font-size:13px}}\
         ul{{list-style:none;padding:0}}</style></head><body><h1>{t}</h1>\
         <h2>Allocated bytes over the matched requests</h2>{svg}<ul>{legend}</ul>\
         <pre>{b}</pre></body></html>\n",
        t = esc(&title),
        b = esc(&prediction_text(p, inputs))
    )
}
