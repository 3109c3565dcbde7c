//! `memlsp compare --label NAME=SNAPSHOT …`: two or more PyTorch snapshots side by side under the
//! user's labels ("no AC" vs "AC"): peak, reserved and live memory, categories at the peak,
//! stages and sites, each with its delta against the first label — in text, JSON and HTML.
//! Values are the reports' own (peak and bytes measured, roles and inferred stages inferred).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Value, json};

use crate::findings::fmt_bytes;
use crate::report::{CaptureReport, Engine};
use crate::torch::summary::Summary;

/// One labelled snapshot.
pub struct Side<'a> {
    pub label: &'a str,
    pub report: &'a CaptureReport,
}

/// One compared quantity: a value per side (`None`: that side has none) and its delta against
/// the first side.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub name: String,
    pub values: Vec<Option<i64>>,
    pub deltas: Vec<Option<i64>>,
    pub label: &'static str,
}

fn row(name: impl Into<String>, values: Vec<Option<i64>>, label: &'static str) -> Row {
    let base = values.first().copied().flatten();
    // A delta only where both sides have the value (a site below one side's top list is not 0).
    let deltas = values
        .iter()
        .map(|v| Some(v.as_ref()?.saturating_sub(base?)))
        .collect();
    Row {
        name: name.into(),
        values,
        deltas,
        label,
    }
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The side-by-side comparison (`labelled_comparison` in JSON).
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub labels: Vec<String>,
    pub paths: Vec<String>,
    pub headlines: Vec<String>,
    /// Peak, reserved, live.
    pub totals: Vec<Row>,
    pub categories: Vec<Row>,
    pub custom_categories: Vec<Row>,
    /// Highest peak of the stages of each name.
    pub stages: Vec<Row>,
    /// The sites listed by any side, bytes live at the snapshot.
    pub sites: Vec<Row>,
}

/// Rows of a map of (name → value per side), in the order of the largest value first.
fn rows_of(map: BTreeMap<String, Vec<Option<i64>>>, label: &'static str, limit: usize) -> Vec<Row> {
    let mut v: Vec<Row> = map
        .into_iter()
        .map(|(k, vals)| row(k, vals, label))
        .collect();
    v.sort_by_key(|r| {
        std::cmp::Reverse(r.values.iter().map(|x| x.unwrap_or(0)).max().unwrap_or(0))
    });
    v.truncate(limit);
    v
}

fn torch(r: &CaptureReport) -> Option<&Summary> {
    match &r.engine {
        Engine::Torch(t) => Some(t),
        Engine::Xla(_) => None,
    }
}

/// The peak over devices: the trace's reconstructed live peak, else live memory at the dump.
fn peak(t: &Summary) -> i64 {
    t.timeline
        .iter()
        .map(|d| d.live_bytes_reconstructed.peak)
        .max()
        .unwrap_or(signed(t.totals.memory.allocated_bytes))
}

pub fn compare(sides: &[Side]) -> Comparison {
    let n = sides.len();
    let ts: Vec<Option<&Summary>> = sides.iter().map(|s| torch(s.report)).collect();
    let each =
        |f: &dyn Fn(&Summary) -> i64| -> Vec<Option<i64>> { ts.iter().map(|t| t.map(f)).collect() };
    let totals = vec![
        row("peak live bytes", each(&peak), "measured"),
        row(
            "reserved bytes",
            each(&|t| signed(t.totals.memory.reserved_bytes)),
            "measured",
        ),
        row(
            "live bytes at the snapshot",
            each(&|t| signed(t.totals.memory.allocated_bytes)),
            "measured",
        ),
    ];
    let mut roles: BTreeMap<String, Vec<Option<i64>>> = BTreeMap::new();
    let mut custom: BTreeMap<String, Vec<Option<i64>>> = BTreeMap::new();
    let mut stages: BTreeMap<String, Vec<Option<i64>>> = BTreeMap::new();
    let mut sites: BTreeMap<String, Vec<Option<i64>>> = BTreeMap::new();
    let add = |m: &mut BTreeMap<String, Vec<Option<i64>>>, k: &str, i: usize, v: i64, max: bool| {
        let slot = &mut m.entry(k.to_string()).or_insert_with(|| vec![None; n])[i];
        *slot = Some(match (*slot, max) {
            (Some(x), true) => x.max(v),
            (Some(x), false) => x.saturating_add(v),
            (None, _) => v,
        });
    };
    for (i, t) in ts.iter().enumerate() {
        let Some(t) = t else { continue };
        for d in &t.categories {
            for p in &d.by_role {
                add(&mut roles, &p.name, i, signed(p.bytes), false);
            }
            for p in &d.custom {
                add(&mut custom, &p.name, i, signed(p.bytes), false);
            }
        }
        for s in &t.stages {
            let name = if s.source == "recorded" {
                s.name.clone()
            } else {
                format!("{} (inferred)", s.name)
            };
            add(&mut stages, &name, i, s.peak_bytes, true);
        }
        for s in &t.allocation_sites.top {
            add(&mut sites, &s.frame.site, i, signed(s.bytes), false);
        }
    }
    Comparison {
        labels: sides.iter().map(|s| s.label.to_string()).collect(),
        paths: sides.iter().map(|s| s.report.display_path()).collect(),
        headlines: sides.iter().map(|s| s.report.headline()).collect(),
        totals,
        categories: rows_of(roles, "measured", 32),
        custom_categories: rows_of(custom, "measured", 32),
        stages: rows_of(stages, "measured", 24),
        sites: rows_of(sites, "measured", 20),
    }
}

/// The JSON document: `{"memlsp", "labelled_comparison"}`.
pub fn document(c: &Comparison) -> Value {
    json!({"memlsp": crate::present::json::VERSION, "labelled_comparison": c})
}

fn cell(v: Option<i64>) -> String {
    match v {
        Some(v) if v < 0 => format!("-{}", fmt_bytes(v.unsigned_abs())),
        Some(v) => fmt_bytes(v as u64),
        None => "–".into(),
    }
}

fn delta(v: Option<i64>) -> String {
    match v {
        Some(v) if v < 0 => format!("-{}", fmt_bytes(v.unsigned_abs())),
        Some(v) => format!("+{}", fmt_bytes(v as u64)),
        None => "–".into(),
    }
}

fn table(s: &mut String, title: &str, rows: &[Row], labels: &[String]) {
    if rows.is_empty() {
        return;
    }
    let _ = write!(s, "{title}\n  {:<44}", "");
    for (i, l) in labels.iter().enumerate() {
        let _ = write!(s, " {:>13}", l);
        if i > 0 {
            let _ = write!(s, " {:>13}", format!("Δ vs {}", labels[0]));
        }
    }
    s.push('\n');
    for r in rows {
        // Long site names keep their end (file, line, function).
        let chars: Vec<char> = r.name.chars().collect();
        let name: String = if chars.len() > 44 {
            std::iter::once('…')
                .chain(chars[chars.len() - 43..].iter().copied())
                .collect()
        } else {
            r.name.clone()
        };
        let _ = write!(s, "  {name:<44}");
        for (i, v) in r.values.iter().enumerate() {
            let _ = write!(s, " {:>13}", cell(*v));
            if i > 0 {
                let _ = write!(s, " {:>13}", delta(r.deltas[i]));
            }
        }
        let _ = writeln!(s, " [{}]", r.label);
    }
    s.push('\n');
}

pub fn text(c: &Comparison) -> String {
    let mut s = String::new();
    for (l, (p, h)) in c.labels.iter().zip(c.paths.iter().zip(&c.headlines)) {
        let _ = writeln!(s, "{l}: {p}\n  {h}");
    }
    s.push('\n');
    table(&mut s, "Memory", &c.totals, &c.labels);
    table(
        &mut s,
        "Categories at the peak (by role; role inferred)",
        &c.categories,
        &c.labels,
    );
    table(
        &mut s,
        "Categories at the peak (--category)",
        &c.custom_categories,
        &c.labels,
    );
    table(
        &mut s,
        "Stages (highest peak of each name)",
        &c.stages,
        &c.labels,
    );
    table(&mut s, "Sites (live at the snapshot)", &c.sites, &c.labels);
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A self-contained page: one table per section, bars for the totals.
pub fn html(c: &Comparison) -> String {
    let mut s = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>memlsp compare</title><style>\
         body{font:14px system-ui;margin:24px}table{border-collapse:collapse;margin:8px 0 24px}\
         td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #ddd}td:first-child,th:first-child{text-align:left}\
         .up{color:#cf222e}.down{color:#1a7f37}.label{font-size:11px;border:1px solid #999;border-radius:4px;padding:0 4px}\
         .bar{display:inline-block;height:10px;background:#4e79a7;vertical-align:middle}</style></head><body>\n",
    );
    let _ = writeln!(s, "<h1>memlsp compare</h1><ul>");
    for (l, (p, h)) in c.labels.iter().zip(c.paths.iter().zip(&c.headlines)) {
        let _ = writeln!(
            s,
            "<li><b>{}</b>: {}<br><small>{}</small></li>",
            esc(l),
            esc(p),
            esc(h)
        );
    }
    s.push_str("</ul>\n");
    let max = c
        .totals
        .iter()
        .flat_map(|r| r.values.iter().flatten())
        .copied()
        .max()
        .unwrap_or(1)
        .max(1);
    for (title, rows) in [
        ("Memory", &c.totals),
        (
            "Categories at the peak (by role; role inferred)",
            &c.categories,
        ),
        ("Categories at the peak (--category)", &c.custom_categories),
        ("Stages (highest peak of each name)", &c.stages),
        ("Sites (live at the snapshot)", &c.sites),
    ] {
        if rows.is_empty() {
            continue;
        }
        let _ = write!(s, "<h2>{}</h2><table><tr><th></th>", esc(title));
        for (i, l) in c.labels.iter().enumerate() {
            let _ = write!(s, "<th>{}</th>", esc(l));
            if i > 0 {
                let _ = write!(s, "<th>Δ vs {}</th>", esc(&c.labels[0]));
            }
        }
        s.push_str("<th></th></tr>\n");
        for r in rows.iter() {
            let _ = write!(s, "<tr><td>{}</td>", esc(&r.name));
            for (i, v) in r.values.iter().enumerate() {
                let bar = if title == "Memory" {
                    format!(
                        "<span class=\"bar\" style=\"width:{}px\"></span> ",
                        v.unwrap_or(0).max(0) * 120 / max
                    )
                } else {
                    String::new()
                };
                let _ = write!(s, "<td>{bar}{}</td>", cell(*v));
                if i > 0 {
                    let d = r.deltas[i].unwrap_or(0);
                    let class = if d > 0 {
                        "up"
                    } else if d < 0 {
                        "down"
                    } else {
                        ""
                    };
                    let _ = write!(s, "<td class=\"{class}\">{}</td>", delta(r.deltas[i]));
                }
            }
            let _ = writeln!(s, "<td><span class=\"label\">{}</span></td></tr>", r.label);
        }
        s.push_str("</table>\n");
    }
    s.push_str("</body></html>\n");
    s
}
