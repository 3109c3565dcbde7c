//! What the server knows per workspace line, built from the last good report of every capture.
//!
//! Plain data, no LSP types: `to_proto` turns it into diagnostics, hints and hovers. Rebuilt from
//! scratch whenever a capture's result changes (findings are few; this takes microseconds).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::findings::{Code, Finding, Location};
use crate::report::{CaptureReport, Site};
use crate::source::locate::Locator;
use crate::torch::stages::summary::StageAtPeak;

/// One capture's last good analysis (the engine's reports, not located: the workspace may
/// change while they are cached).
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

pub use crate::report::capture_name;

/// A finding placed on a workspace line.
#[derive(Debug)]
pub struct LineFinding {
    pub finding: Finding,
    pub capture: PathBuf,
    /// Other (older) captures that report the same finding on this line.
    pub also_in: Vec<String>,
    /// The stage holding the capture's peak (recorded or inferred), when it has stages.
    pub stage_at_peak: Option<StageAtPeak>,
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

impl FileEntry {
    /// The capture of every finding and site on this file's lines (repeats included).
    pub fn captures(&self) -> impl Iterator<Item = &PathBuf> {
        self.lines.values().flat_map(|l| {
            l.findings
                .iter()
                .map(|f| &f.capture)
                .chain(l.sites.iter().map(|s| &s.capture))
        })
    }
}

/// The whole index.
#[derive(Debug, Default)]
pub struct Index {
    pub files: HashMap<PathBuf, FileEntry>,
    /// Recorded paths of culprit frames that did not map to a workspace file, with a count.
    pub unresolved: BTreeMap<String, usize>,
}

impl Index {
    /// Build from every capture's result, each report located by `locator`. Newer captures
    /// win: when several captures report the same code on the same line for the same scope
    /// (rank / module), the newest is shown and the others are named in `also_in`.
    pub fn build(captures: &[Arc<CaptureResult>], locator: &Locator) -> Index {
        Index::build_with(captures, locator, None)
    }

    /// [`Index::build`], each capture first compared with a baseline (BL001 findings).
    pub fn build_with(
        captures: &[Arc<CaptureResult>],
        locator: &Locator,
        baseline: Option<&(crate::baseline::Baseline, crate::baseline::CompareOptions)>,
    ) -> Index {
        let mut order: Vec<&Arc<CaptureResult>> = captures.iter().collect();
        order.sort_by(|a, b| b.mtime.cmp(&a.mtime).then_with(|| a.path.cmp(&b.path)));

        let mut idx = Index::default();
        let resolve = |l: &Location| l.local().map(Path::to_path_buf);
        // (file, line, code, scope) → index into the line's findings.
        let mut seen_findings: HashMap<(PathBuf, u32, Code, Option<String>), usize> =
            HashMap::new();
        let mut seen_sites: HashMap<(PathBuf, u32, Option<String>), ()> = HashMap::new();

        // Every report cloned once; rank snapshots of one folder are compared (PT012).
        let mut owner: Vec<usize> = Vec::new();
        let mut flat: Vec<CaptureReport> = Vec::new();
        for (k, cap) in order.iter().enumerate() {
            for r in &cap.reports {
                owner.push(k);
                flat.push(r.clone());
            }
        }
        crate::analyze::compare_ranks_in(&mut flat);
        for (k, mut report) in owner.into_iter().zip(flat) {
            let cap = order[k];
            let name = cap.name();
            {
                if let Some((base, opts)) = baseline {
                    // Each capture alone: its key is the one it has as the only capture of a run.
                    crate::baseline::compare(std::slice::from_mut(&mut report), base, opts);
                }
                locator.locate(&mut report);
                for f in &report.findings {
                    let Some(loc) = &f.location else { continue };
                    let Some(local) = resolve(loc) else {
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
                    seen_findings.insert(key, line.findings.len());
                    line.findings.push(Arc::new(LineFinding {
                        finding: f.clone(),
                        capture: cap.path.clone(),
                        also_in: Vec::new(),
                        stage_at_peak: report.stage_at_peak().cloned(),
                    }));
                }
                for s in &report.sites {
                    let Some(loc) = &s.location else { continue };
                    let Some(local) = resolve(loc) else {
                        *idx.unresolved.entry(loc.file.clone()).or_default() += 1;
                        continue;
                    };
                    let key = (local.clone(), loc.line, s.scope.clone());
                    if seen_sites.insert(key, ()).is_some() {
                        continue;
                    }
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
                        }));
                }
            }
        }
        // Most severe first on each line.
        for file in idx.files.values_mut() {
            for line in file.lines.values_mut() {
                line.findings
                    .sort_by_key(|f| std::cmp::Reverse(f.finding.severity));
            }
        }
        idx
    }

    pub fn line(&self, file: &Path, line: u32) -> Option<&LineEntry> {
        self.files.get(file)?.lines.get(&line)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::findings::{Evidence, Fix, FixKind, Label, Severity};
    use crate::frames::FrameFilter;
    use crate::report::{Engine, PercentOf, SiteFrame};
    use crate::source::paths::Resolver;
    use std::time::Duration;

    pub fn loc(file: &str, line: u32, function: &str) -> Location {
        Location::new(file, line, function)
    }

    /// A workspace `/ws` holding `train.py` and `main.py`, recorded under `/job/proj/`.
    pub fn locator(files: bool) -> Locator {
        let files = if files {
            vec![
                (PathBuf::from("/ws/train.py"), PathBuf::from("train.py")),
                (PathBuf::from("/ws/main.py"), PathBuf::from("main.py")),
            ]
        } else {
            vec![]
        };
        Locator::with_resolver(
            Arc::new(Resolver::with_files(
                vec![PathBuf::from("/ws")],
                vec![],
                files,
            )),
            FrameFilter::default(),
        )
    }

    /// A PyTorch-shaped report: one PT002 finding and one site on `train.py:8`.
    pub fn report(capture: &str, scope: Option<&str>) -> CaptureReport {
        let stack = vec![
            loc(
                "/usr/lib/python3/site-packages/torch/_tensor.py",
                40,
                "__add__",
            ),
            loc("/job/proj/train.py", 8, "step"),
            loc("/job/proj/main.py", 20, "main"),
        ];
        let finding = Finding::new(
            Code::PT002,
            Severity::Warning,
            "`loss` keeps the autograd graph alive: 1.20 GiB (38%) live at the snapshot",
        )
        .at(
            Some(loc("/job/proj/train.py", 8, "step")),
            stack[1..].to_vec(),
        )
        .bytes(1_288_490_188, Some(38.0), crate::findings::Label::Measured)
        .evidence(Evidence::measured(
            "12 blocks allocated in backward stay live",
        ))
        .evidence(Evidence::inferred("accumulated without .detach()"))
        .fix(
            Fix::new(
                "Accumulate `loss.detach()`",
                FixKind::DetachAccumulated { item: false },
            )
            .preferred(),
        );
        let mut finding = finding;
        finding.scope = scope.map(str::to_string);
        let snap = crate::torch::model::Snapshot::default();
        let opts = crate::options::AnalysisOptions::default();
        let a = crate::torch::analyse(&snap, &opts);
        CaptureReport {
            path: PathBuf::from(capture),
            engine: Engine::Torch(Box::new(crate::torch::summary::summarize(&snap, &a, 10))),
            sites: vec![Site {
                location: Some(loc("/job/proj/train.py", 8, "step")),
                bytes: 1_288_490_188,
                requested_bytes: None,
                blocks: 12,
                percent: 38.2,
                percent_of: PercentOf::LiveMemory,
                label: Label::Measured,
                stack: stack.into(),
                callers: vec![],
                frame: SiteFrame::User,
                role: None,
                scope: scope.map(str::to_string),
                reference_line: None,
                carried_by: None,
            }],
            findings: vec![finding],
            shown_path: None,
        }
    }

    fn capture(path: &str, age_s: u64, reports: Vec<CaptureReport>) -> Arc<CaptureResult> {
        Arc::new(CaptureResult {
            path: PathBuf::from(path),
            mtime: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - age_s),
            reports,
        })
    }

    #[test]
    fn findings_and_sites_land_on_the_resolved_line() {
        let caps = vec![capture(
            "/ws/runs/a.pickle",
            0,
            vec![report("/ws/runs/a.pickle", None)],
        )];
        let idx = Index::build(&caps, &locator(true));
        let line = idx.line(Path::new("/ws/train.py"), 8).expect("line 8");
        assert_eq!(line.findings.len(), 1);
        assert_eq!(line.findings[0].finding.code, Code::PT002);
        assert_eq!(line.top_site().map(|s| s.site.percent), Some(38.2));
        // The torch frame does not resolve and is counted; the user frames do.
        assert_eq!(idx.unresolved.len(), 0);
        let frames = &line.findings[0].finding.stack;
        assert_eq!(frames[1].local(), Some(Path::new("/ws/main.py")));
    }

    #[test]
    fn the_newest_capture_wins_per_scope_and_names_the_others() {
        let caps = vec![
            capture(
                "/ws/old.pickle",
                100,
                vec![report("/ws/old.pickle", Some("rank 0"))],
            ),
            capture(
                "/ws/new.pickle",
                0,
                vec![report("/ws/new.pickle", Some("rank 0"))],
            ),
            capture(
                "/ws/r1.pickle",
                50,
                vec![report("/ws/r1.pickle", Some("rank 1"))],
            ),
        ];
        let idx = Index::build(&caps, &locator(true));
        let line = idx.line(Path::new("/ws/train.py"), 8).expect("line 8");
        assert_eq!(line.findings.len(), 2, "one per scope");
        let r0 = line
            .findings
            .iter()
            .find(|f| f.finding.scope.as_deref() == Some("rank 0"))
            .expect("rank 0");
        assert_eq!(r0.capture, PathBuf::from("/ws/new.pickle"));
        assert_eq!(r0.also_in, vec!["old.pickle".to_string()]);
        assert_eq!(line.sites.len(), 2);
    }

    #[test]
    fn unresolved_culprits_are_listed_not_lost() {
        let caps = vec![capture(
            "/ws/a.pickle",
            0,
            vec![report("/ws/a.pickle", None)],
        )];
        let idx = Index::build(&caps, &locator(false));
        assert!(idx.files.is_empty());
        assert_eq!(idx.unresolved.get("/job/proj/train.py"), Some(&2));
    }
}
