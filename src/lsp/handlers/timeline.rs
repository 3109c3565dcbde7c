//! `workspace/executeCommand memlsp.timeline`: the HTML page of one capture (the same page
//! `memlsp report --format html` writes), for the editor to show in a webview or a browser.
//!
//! Argument: `{"capture": path or file URI}`, or `{"file": URI, "line": n}` (1-based: the
//! capture of the finding or site on that line, else the newest capture with findings in that
//! file), or nothing (the newest capture). Answer: `{"capture", "title", "html"}`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::lsp::View;
use crate::lsp::index::capture_name;
use crate::lsp::to_proto;
use crate::source::locate::Locator;

/// Which capture the arguments name.
pub fn target(view: &View, arg: &Value) -> Result<PathBuf, String> {
    let as_path = |s: &str| -> Option<PathBuf> {
        if s.starts_with("file:") {
            to_proto::path(&s.parse().ok()?)
        } else {
            Some(PathBuf::from(s))
        }
    };
    let capture = match arg {
        Value::String(s) => Some(s.as_str()),
        v => v.get("capture").and_then(Value::as_str),
    };
    if let Some(c) = capture {
        let p = as_path(c)
            .ok_or_else(|| format!("memlsp.timeline: {c} is not a file path or file URI"))?;
        return Ok(std::fs::canonicalize(&p).unwrap_or(p));
    }
    if let Some(file) = arg.get("file").and_then(Value::as_str).and_then(as_path) {
        let file = std::fs::canonicalize(&file).unwrap_or(file);
        let line = arg.get("line").and_then(Value::as_u64).unwrap_or(0) as u32;
        if let Some(e) = view.entry_at(&file, line) {
            if let Some(c) = e
                .findings
                .first()
                .map(|f| &f.capture)
                .or_else(|| e.sites.first().map(|s| &s.capture))
            {
                return Ok(c.clone());
            }
        }
        // Any capture with something on this file: the newest.
        if let Some(fe) = view.index.files.get(&file) {
            let mut in_file: Vec<&PathBuf> = fe
                .lines
                .values()
                .flat_map(|l| {
                    l.findings
                        .iter()
                        .map(|f| &f.capture)
                        .chain(l.sites.iter().map(|s| &s.capture))
                })
                .collect();
            in_file.sort();
            in_file.dedup();
            if let Some(c) = view.captures.iter().find(|c| in_file.contains(c)) {
                return Ok(c.clone());
            }
        }
    }
    view.captures.first().cloned().ok_or_else(|| {
        "memlsp.timeline: no capture has been analysed in this workspace yet (captureGlobs)".into()
    })
}

/// Analyse `capture` with the pictures and render the page (blocking: run it on a worker); the
/// decoder says how far it read in `progress`.
pub fn page(
    view: &View,
    capture: &Path,
    progress: crate::options::Progress,
) -> Result<Value, String> {
    let mut opts = view.options.clone();
    opts.analysis.pictures = true;
    opts.decode.progress = progress;
    let mut reports = crate::analyze::analyze_path(capture, &opts).map_err(|e| e.to_string())?;
    let locator = match &view.resolver {
        Some(r) => Locator::with_resolver(r.clone(), opts.analysis.frames.clone()),
        None => Locator::new(&opts.locate, opts.analysis.frames.clone()),
    };
    for r in &mut reports {
        locator.locate(r);
    }
    let html = crate::present::html::render(&reports);
    Ok(json!({
        "capture": capture.to_string_lossy(),
        "title": format!("Memory: {}", capture_name(capture)),
        "html": html,
    }))
}
