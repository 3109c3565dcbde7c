//! `workspace/executeCommand memlsp.timeline`: the HTML page of one capture (the same page
//! `memlsp report --format html` writes), for the editor to show in a webview or a browser.
//!
//! Argument: `{"capture": path or file URI}`, or `{"file": URI, "line": n}` (1-based: the
//! capture of the finding or site on that line, else the newest capture with findings in that
//! file), or nothing (the newest capture). Answer: `{"capture", "title", "html"}`.
//!
//! Drawing a page analyses the capture again with the pictures (seconds for a 1 GB snapshot);
//! the last few pages are kept ([`Pages`]) and shown again while nothing they depend on changed.
//! With `memlsp.capacity` set the page also carries the fit on that capacity (docs/FITS.md).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use serde_json::{Value, json};

use crate::lsp::View;
use crate::lsp::index::capture_name;
use crate::lsp::main_loop::FileKey;
use crate::lsp::to_proto;
use crate::options::{AnalysisOptions, LocateOptions};
use crate::source::locate::Locator;
use crate::source::paths::Resolver;

/// Pages kept: each is the size of `report --format html` (~0.3 MB), whatever the capture's.
const KEEP: usize = 4;

/// What a page depends on: the capture's content (its size and modification time, as the
/// server's analysis cache), the options it was analysed with and the workspace index its
/// frames were located with (the same index, not an equal one: a new index after a workspace
/// change draws the page again).
#[derive(Clone, Debug)]
pub struct Key {
    capture: PathBuf,
    file: FileKey,
    analysis: AnalysisOptions,
    locate: LocateOptions,
    max_trace_events: Option<usize>,
    max_file_bytes: u64,
    max_model_bytes: Option<u64>,
    /// Weak: a kept page does not keep an old index alive, and the address it compares by is
    /// not reused while the key exists.
    resolver: Option<Weak<Resolver>>,
}

impl Key {
    /// The key of `capture`'s page now; `None` for what is not one file (a folder of ranks),
    /// whose pages are not kept.
    pub fn of(view: &View, capture: &Path) -> Option<Key> {
        Some(Key {
            capture: capture.to_path_buf(),
            file: FileKey::of(capture)?,
            analysis: view.options.analysis.clone(),
            locate: view.options.locate.clone(),
            max_trace_events: view.options.decode.max_trace_events,
            max_file_bytes: view.options.decode.max_file_bytes,
            max_model_bytes: view.options.decode.max_model_bytes,
            resolver: view.resolver.as_ref().map(Arc::downgrade),
        })
    }

    /// The capture is as it was when the key was made (not rewritten while its page was drawn).
    pub fn unchanged(&self) -> bool {
        FileKey::of(&self.capture) == Some(self.file)
    }

    fn same(&self, o: &Key) -> bool {
        let resolver = match (&self.resolver, &o.resolver) {
            (Some(a), Some(b)) => a.ptr_eq(b),
            (None, None) => true,
            _ => false,
        };
        resolver
            && self.capture == o.capture
            && self.file == o.file
            && self.analysis == o.analysis
            && self.locate == o.locate
            && self.max_trace_events == o.max_trace_events
            && self.max_file_bytes == o.max_file_bytes
            && self.max_model_bytes == o.max_model_bytes
    }
}

/// The last [`KEEP`] pages drawn, newest first.
#[derive(Default)]
pub struct Pages(Mutex<VecDeque<(Key, Value)>>);

impl Pages {
    /// The page drawn for `key`, if it is kept.
    pub fn get(&self, key: &Key) -> Option<Value> {
        let mut pages = self.0.lock().ok()?;
        let i = pages.iter().position(|(k, _)| k.same(key))?;
        let hit = pages.remove(i)?;
        let page = hit.1.clone();
        pages.push_front(hit);
        Some(page)
    }

    /// Forget every page (`memlsp.reanalyze`: everything is read again).
    pub fn clear(&self) {
        if let Ok(mut pages) = self.0.lock() {
            pages.clear();
        }
    }

    /// Keep `page`, drawn for `key` (replacing an older page of the same capture).
    pub fn put(&self, key: Key, page: Value) {
        let Ok(mut pages) = self.0.lock() else {
            return;
        };
        pages.retain(|(k, _)| k.capture != key.capture);
        pages.push_front((key, page));
        pages.truncate(KEEP);
    }
}

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
            let mut in_file: Vec<&PathBuf> = fe.captures().collect();
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
    // `memlsp.capacity` set: the page draws "will it fit" as `report --on` does (the capacity
    // line, `needs`, the first failing request). The capacity is in the key's options.
    opts.analysis.fit = opts.analysis.capacity.is_some();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn view(resolver: Option<Arc<Resolver>>) -> View {
        View {
            resolver,
            ..View::default()
        }
    }

    #[test]
    fn a_page_is_shown_again_until_what_it_was_drawn_from_changes() {
        let dir = tempfile::tempdir().unwrap();
        let cap = dir.path().join("snapshot.pickle");
        std::fs::write(&cap, b"first").unwrap();
        let index = Arc::new(Resolver::default());
        let v = view(Some(index.clone()));
        let pages = Pages::default();
        let key = Key::of(&v, &cap).unwrap();
        assert!(pages.get(&key).is_none());
        pages.put(key, json!({"html": "first"}));
        assert_eq!(
            pages.get(&Key::of(&v, &cap).unwrap()),
            Some(json!({"html": "first"}))
        );

        // Another workspace index (a file added or moved), even an equal one: drawn again.
        assert!(
            pages
                .get(&Key::of(&view(Some(Arc::new(Resolver::default()))), &cap).unwrap())
                .is_none()
        );
        assert!(pages.get(&Key::of(&view(None), &cap).unwrap()).is_none());
        // Other options.
        let mut other = view(Some(index.clone()));
        other.options.analysis.top = 3;
        assert!(pages.get(&Key::of(&other, &cap).unwrap()).is_none());
        // Another `memlsp.capacity` (the page draws its line and first failure).
        let mut other = view(Some(index.clone()));
        other.options.analysis.capacity = Some(24 << 30);
        assert!(pages.get(&Key::of(&other, &cap).unwrap()).is_none());
        let mut other = view(Some(index.clone()));
        other.options.locate.path_mappings = vec![("/home/u".into(), dir.path().into())];
        assert!(pages.get(&Key::of(&other, &cap).unwrap()).is_none());
        // The capture rewritten.
        std::fs::write(&cap, b"second, longer").unwrap();
        let now = Key::of(&v, &cap).unwrap();
        assert!(pages.get(&now).is_none());
        // A folder of ranks is never kept.
        assert!(Key::of(&v, dir.path()).is_none());
    }

    #[test]
    fn a_capture_rewritten_while_its_page_is_drawn_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let cap = dir.path().join("snapshot.pickle");
        std::fs::write(&cap, b"first").unwrap();
        let key = Key::of(&view(None), &cap).unwrap();
        assert!(key.unchanged());
        std::fs::write(&cap, b"second, longer").unwrap();
        assert!(!key.unchanged());
    }

    #[test]
    fn the_last_few_pages_are_kept_one_per_capture() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(None);
        let pages = Pages::default();
        let caps: Vec<PathBuf> = (0..=KEEP)
            .map(|i| {
                let p = dir.path().join(format!("rank{i}.pickle"));
                std::fs::write(&p, b"x").unwrap();
                p
            })
            .collect();
        let key = |i: usize| Key::of(&v, &caps[i]).unwrap();
        for i in 0..KEEP {
            pages.put(key(i), json!(i));
        }
        // Opening the first again makes it the newest: the second is the oldest now.
        assert_eq!(pages.get(&key(0)), Some(json!(0)));
        pages.put(key(KEEP), json!(KEEP));
        assert!(pages.get(&key(1)).is_none());
        assert_eq!(pages.get(&key(0)), Some(json!(0)));
        assert_eq!(pages.get(&key(KEEP)), Some(json!(KEEP)));
        // A capture's new page replaces its old one.
        std::fs::write(&caps[0], b"rewritten").unwrap();
        pages.put(key(0), json!("new"));
        assert_eq!(pages.0.lock().unwrap().len(), KEEP);
        assert_eq!(pages.get(&key(0)), Some(json!("new")));
        pages.clear();
        assert!(pages.get(&key(0)).is_none());
    }
}
