//! `--format html`: the report as one self-contained page (inline CSS and JS, no network) with
//! the pictures: memory over the trace stacked by site, the allocator's segments (at the
//! snapshot, and replayed at the trace's peak and first OOM), growth between snapshots, ranks
//! side by side (PyTorch); the heap over the program order and the buffers at its peak (JAX). The data is downsampled in the engines (`torch::series`,
//! `xla::summary::downsample`); the page receives only what it draws. Every number keeps its
//! label. Works from `file://` and inside a VS Code webview (a click on a band posts
//! `{command: "reveal", file, line}` to the extension).

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use serde_json::{Value, json};

use super::escape;
use crate::findings::{Finding, Location};
use crate::report::{CaptureReport, Engine};

const TEMPLATE: &str = include_str!("page.html");

/// A place the page can open: the local file when the recorded path resolved.
fn place(l: &Location) -> Value {
    json!({
        "file": l.local().map(|p| p.display().to_string()).unwrap_or_else(|| l.file.clone()),
        "shown": l.shown(),
        "line": l.line,
        "function": l.function,
        "local": l.local().is_some(),
    })
}

#[derive(Serialize)]
struct PageFinding {
    code: String,
    pattern: &'static str,
    severity: &'static str,
    message: String,
    /// What the message is (an OOM's restates the recorded entry: read).
    message_label: &'static str,
    at: Option<Value>,
    fixes: Vec<Value>,
}

fn finding(f: &Finding) -> PageFinding {
    PageFinding {
        code: f.code.to_string(),
        pattern: f.code.pattern(),
        severity: f.severity.as_str(),
        message: f.message.clone(),
        message_label: f.code.message_label().as_str(),
        at: f.location.as_ref().map(place),
        fixes: f
            .fixes
            .iter()
            .map(|x| {
                json!({
                    "title": x.title,
                    "saving": x.saving_bytes,
                    "range": x.saving_range,
                    "simulated": x.simulated,
                })
            })
            .collect(),
    }
}

/// Items of `list` grouped by device, in their order (one pass: a page of many devices stays
/// linear in them).
fn by_device<T>(list: &[T], device: impl Fn(&T) -> i64) -> HashMap<i64, Vec<&T>> {
    let mut m: HashMap<i64, Vec<&T>> = HashMap::new();
    for x in list {
        m.entry(device(x)).or_default().push(x);
    }
    m
}

fn torch(r: &CaptureReport, t: &crate::torch::summary::Summary) -> Value {
    let mut segment_bars = HashMap::new();
    for (d, v) in &t.segment_bars {
        segment_bars.entry(*d).or_insert(v);
    }
    let fragmentation = by_device(&t.fragmentation, |f| f.device);
    let states = by_device(&t.state_bars, |p| p.device);
    let mut validated: HashMap<i64, bool> = HashMap::new();
    for d in &t.replay.devices {
        *validated.entry(d.device).or_default() |= d.validated;
    }
    let traced: HashSet<i64> = t.series.iter().map(|s| s.device).collect();
    let devices: Vec<Value> = t
        .series
        .iter()
        .map(|s| {
            let segs = segment_bars
                .get(&s.device)
                .map(|v| (*v).clone())
                .unwrap_or_default();
            json!({
                "device": s.device,
                "entries": s.entries,
                "bands": s.bands.iter().map(|b| json!({
                    "kind": b.kind,
                    "at": b.location.as_ref().map(place),
                    "stack": b.stack.iter().map(|l| format!("{}:{} {}", l.shown(), l.line, l.function)).collect::<Vec<_>>(),
                    "bytes_at_peak": b.bytes_at_peak,
                })).collect::<Vec<_>>(),
                "columns": s.columns.iter().map(|c| json!([c.first, c.last, c.at, c.total_min, c.total_max, c.reserved, c.values, c.time_us])).collect::<Vec<_>>(),
                "peak": s.peak,
                "stages": crate::present::stages::bands(t, s.device),
                "ooms": s.ooms,
                "segments": segs,
                "fragmentation": fragmentation.get(&s.device).map_or(&[][..], Vec::as_slice),
                // The allocator at the peak and at the first OOM, replayed where the replay of
                // this device validates.
                "validated": validated.get(&s.device).copied().unwrap_or(false),
                "states": states.get(&s.device).map_or(&[][..], Vec::as_slice),
            })
        })
        .collect();
    let simulated: Vec<Value> = r
        .findings
        .iter()
        .flat_map(|f| f.fixes.iter().map(move |x| (f, x)))
        .filter_map(|(f, x)| {
            let s = x.simulated.as_ref()?;
            Some(json!({"code": f.code.as_str(), "device": s.device, "title": x.title, "after": s.peak_allocated_after, "before": s.peak_allocated_before, "oom_avoided": s.oom_avoided}))
        })
        .collect();
    // Devices whose allocator state has no timeline (no trace recorded): their segments alone.
    let untraced: Vec<Value> = t
        .segment_bars
        .iter()
        .filter(|(d, _)| !traced.contains(d))
        .map(|(d, segs)| {
            json!({
                "device": d,
                "segments": segs,
                "fragmentation": fragmentation.get(d).map_or(&[][..], Vec::as_slice),
            })
        })
        .collect();
    json!({
        "devices": devices,
        "untraced": untraced,
        "simulated": simulated,
        // `report --fit` / `--on`: needs, the capacity line and the first failing request.
        "fit": t.fit,
        "diff": t.diff.as_ref().map(|d| json!({
            "earlier": d.earlier,
            "grown": d.grown.iter().take(20).map(|g| json!({"site": g.site, "before": g.bytes_before, "after": g.bytes_after, "blocks": g.blocks_delta})).collect::<Vec<_>>(),
        })),
        "rank": t.rank,
        "categories": t.categories,
        "compile_contexts": t.compile_contexts,
        // The page's search: each device's largest allocations (`torch::trace_index`).
        "trace_index": t.trace_index,
        "totals": {
            "reserved": t.totals.memory.reserved_bytes,
            "allocated": t.totals.memory.allocated_bytes,
            "inactive": t.totals.memory.inactive_bytes,
        },
    })
}

fn xla(r: &CaptureReport, x: &crate::xla::summary::Summary) -> Value {
    let plan = x.plan.as_ref();
    json!({
        "module": x.module,
        "heap": x.heap_columns,
        "peak_position": x.peak_position,
        "heap_peak": plan.map(|p| p.heap_peak_bytes),
        "total_peak": plan.map(|p| p.total_peak_bytes),
        "parameters": plan.map(|p| p.parameter_bytes),
        "outputs": plan.map(|p| p.output_bytes),
        "buffers": plan.map(|p| p.rows.iter().take(40).map(|b| json!({
            "bytes": b.bytes, "shape": b.shape, "instruction": b.instruction, "role": b.role,
            "role_text": b.role_text, "category": b.category, "heap": b.heap,
            "at": b.file.as_ref().map(|f| {
                let l = Location::new(f.clone(), b.line.unwrap_or(0), "");
                let located = r.sites.iter().filter_map(|s| s.location.as_ref()).find(|s| s.file == l.file && s.line == l.line);
                place(located.unwrap_or(&l))
            }),
        })).collect::<Vec<_>>()).unwrap_or_default(),
        "sites": r.sites.iter().map(|s| json!({
            "at": s.location.as_ref().map(place), "bytes": s.bytes, "label": s.label, "percent": s.percent,
            "of": s.percent_of.as_str(),
        })).collect::<Vec<_>>(),
        "capacity": x.runtime.capacity_bytes,
        "executions": x.runtime.executions.iter().filter(|e| Some(&e.module) == x.module.as_ref()).map(|e| json!([e.start_ps, e.bytes_in_use_at_start, e.temp_bytes_allocated])).collect::<Vec<_>>(),
    })
}

/// The page data of located reports.
fn data(reports: &[CaptureReport]) -> Value {
    let (groups, index) = crate::report::rank_groups(reports);
    json!({
        "memlsp": env!("CARGO_PKG_VERSION"),
        // Each comparison of ranks once; a rank's capture names it (`torch.rank_group`).
        "rank_groups": groups.iter().map(|c| c.rows.iter().map(|row| json!({
            "name": row.path.file_name().map(|n| n.to_string_lossy().into_owned()),
            "allocated": row.allocated, "reserved": row.reserved, "inactive": row.inactive, "peak": row.peak,
        })).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "captures": reports.iter().zip(&index).map(|(r, group)| {
            let mut c = json!({
                "path": r.display_path(),
                "headline": r.headline(),
                "kind": r.kind().as_str(),
                "findings": r.findings.iter().map(finding).collect::<Vec<_>>(),
            });
            match &r.engine {
                Engine::Torch(t) => {
                    c["torch"] = torch(r, t);
                    c["torch"]["rank_group"] = json!(group);
                }
                Engine::Xla(x) => c["xla"] = xla(r, x),
            }
            c
        }).collect::<Vec<_>>(),
    })
}

/// The page: the template with the data inlined (every `<`, `>`, `&`, U+2028/2029 of the JSON
/// escaped, `present::escape::script_json`: no capture string can close the data block or put the
/// HTML tokenizer in another state) and the title escaped as HTML text.
pub fn render(reports: &[CaptureReport]) -> String {
    let json =
        escape::script_json(&serde_json::to_string(&data(reports)).unwrap_or_else(|_| "{}".into()));
    let title = escape::html_text(
        &reports
            .first()
            .map(|r| r.display_path())
            .unwrap_or_default(),
    );
    // Each marker of the template replaced once, in the template itself (never in what was
    // inserted: a path holding a marker's name stays text).
    let (head, rest) = TEMPLATE
        .split_once("__MEMLSP_TITLE__")
        .unwrap_or((TEMPLATE, ""));
    let (mid, tail) = rest.split_once("__MEMLSP_DATA__").unwrap_or((rest, ""));
    let mut page = String::with_capacity(TEMPLATE.len() + title.len() + json.len());
    for part in [head, &title, mid, &json, tail] {
        page.push_str(part);
    }
    page
}
