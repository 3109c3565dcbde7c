//! What the server knows per workspace line, built from the last good report of every capture.
//!
//! Plain data, no LSP types: `to_proto` turns it into diagnostics, hints and hovers. Rebuilt from
//! scratch whenever a capture's result changes (findings are few; this takes microseconds).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::findings::{Finding, Location};
use crate::report::{CaptureReport, Site};
use crate::source::paths::Resolver;

/// One capture's last good analysis.
#[derive(Debug)]
pub struct CaptureResult {
    pub path: PathBuf,
    pub mtime: SystemTime,
    pub reports: Vec<CaptureReport>,
}

impl CaptureResult {
    pub fn name(&self) -> String {
        capture_name(&self.path)
    }
}

/// The file name of a capture, as messages show it.
pub fn capture_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string_lossy().into_owned())
}

/// A stack frame with the workspace file it maps to, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    pub recorded: Location,
    pub local: Option<PathBuf>,
}

/// A finding placed on a workspace line.
#[derive(Debug)]
pub struct LineFinding {
    pub finding: Finding,
    pub capture: PathBuf,
    /// Other (older) captures that report the same finding on this line.
    pub also_in: Vec<String>,
    /// The whole stack, innermost first, resolved where possible.
    pub frames: Vec<Frame>,
}

impl LineFinding {
    pub fn capture_name(&self) -> String {
        capture_name(&self.capture)
    }
}

/// A top live-memory site placed on a workspace line.
#[derive(Debug)]
pub struct LineSite {
    pub site: Site,
    pub capture: PathBuf,
    pub frames: Vec<Frame>,
}

/// Everything on one line.
#[derive(Debug, Default)]
pub struct LineEntry {
    pub findings: Vec<Arc<LineFinding>>,
    pub sites: Vec<Arc<LineSite>>,
}

impl LineEntry {
    /// The site an inlay hint shows: the largest share on this line.
    pub fn top_site(&self) -> Option<&LineSite> {
        self.sites
            .iter()
            .max_by(|a, b| a.site.percent.total_cmp(&b.site.percent))
            .map(|s| s.as_ref())
    }
}

/// Lines of one workspace file, keyed by 1-based line number.
#[derive(Debug, Default)]
pub struct FileEntry {
    pub lines: BTreeMap<u32, LineEntry>,
}

/// The whole index.
#[derive(Debug, Default)]
pub struct Index {
    pub files: HashMap<PathBuf, FileEntry>,
    /// Recorded paths of culprit frames that did not map to a workspace file, with a count.
    pub unresolved: BTreeMap<String, usize>,
}

impl Index {
    /// Build from every capture's result. Newer captures win: when several captures report the
    /// same code on the same line for the same scope (rank / module), the newest is shown and
    /// the others are named in `also_in`.
    pub fn build(captures: &[Arc<CaptureResult>], resolver: &Resolver) -> Index {
        let mut order: Vec<&Arc<CaptureResult>> = captures.iter().collect();
        order.sort_by(|a, b| b.mtime.cmp(&a.mtime).then_with(|| a.path.cmp(&b.path)));

        let mut idx = Index::default();
        let mut cache: HashMap<String, Option<PathBuf>> = HashMap::new();
        let mut resolve = |file: &str| -> Option<PathBuf> {
            cache
                .entry(file.to_string())
                .or_insert_with(|| resolver.resolve(file))
                .clone()
        };
        // (file, line, code, scope) → index into the line's findings.
        let mut seen_findings: HashMap<(PathBuf, u32, &'static str, Option<String>), usize> =
            HashMap::new();
        let mut seen_sites: HashMap<(PathBuf, u32, Option<String>), ()> = HashMap::new();

        for cap in order {
            let name = cap.name();
            for report in &cap.reports {
                for f in &report.findings {
                    let Some(loc) = &f.location else { continue };
                    let Some(local) = resolve(&loc.file) else {
                        *idx.unresolved.entry(loc.file.clone()).or_default() += 1;
                        continue;
                    };
                    let key = (local.clone(), loc.line, f.code, f.scope.clone());
                    let line = idx
                        .files
                        .entry(local)
                        .or_default()
                        .lines
                        .entry(loc.line)
                        .or_default();
                    if let Some(&i) = seen_findings.get(&key) {
                        if let Some(existing) = line.findings.get_mut(i) {
                            if let Some(e) = Arc::get_mut(existing) {
                                if !e.also_in.contains(&name) {
                                    e.also_in.push(name.clone());
                                }
                            }
                        }
                        continue;
                    }
                    let frames = f
                        .stack
                        .iter()
                        .map(|l| Frame {
                            recorded: l.clone(),
                            local: resolve(&l.file),
                        })
                        .collect();
                    seen_findings.insert(key, line.findings.len());
                    line.findings.push(Arc::new(LineFinding {
                        finding: f.clone(),
                        capture: cap.path.clone(),
                        also_in: Vec::new(),
                        frames,
                    }));
                }
                for s in &report.sites {
                    let Some(loc) = &s.location else { continue };
                    let Some(local) = resolve(&loc.file) else {
                        *idx.unresolved.entry(loc.file.clone()).or_default() += 1;
                        continue;
                    };
                    let key = (local.clone(), loc.line, s.scope.clone());
                    if seen_sites.insert(key, ()).is_some() {
                        continue;
                    }
                    let frames = s
                        .stack
                        .iter()
                        .map(|l| Frame {
                            recorded: l.clone(),
                            local: resolve(&l.file),
                        })
                        .collect();
                    idx.files
                        .entry(local)
                        .or_default()
                        .lines
                        .entry(loc.line)
                        .or_default()
                        .sites
                        .push(Arc::new(LineSite {
                            site: s.clone(),
                            capture: cap.path.clone(),
                            frames,
                        }));
                }
            }
        }
        // Most severe first on each line.
        for file in idx.files.values_mut() {
            for line in file.lines.values_mut() {
                line.findings
                    .sort_by(|a, b| b.finding.severity.cmp(&a.finding.severity));
            }
        }
        idx
    }

    pub fn line(&self, file: &Path, line: u32) -> Option<&LineEntry> {
        self.files.get(file)?.lines.get(&line)
    }
}
