//! The pipeline every front end runs: **decode → model → analyse → locate**.
//!
//! [`analyze_path`], [`analyze_file`] and [`analyze_diff`] detect the capture kind, decode it,
//! run the engine and hand back engine-only `CaptureReport`s (what the language server caches);
//! [`run`] and [`run_diff`] also locate them against the workspace, which is what `report`,
//! `--check` and every later front end show. The server locates its cached reports with the same
//! [`crate::source::locate::Locator`]. Batch mode is not a second implementation.

use std::path::{Path, PathBuf};

use crate::error::{CaptureError, ErrorKind};
use crate::findings::{self, Severity};
use crate::options::Options;
use crate::report::{CaptureKind, CaptureReport, Engine};
use crate::source::locate::Locator;
use crate::source::workspace::{DEFAULT_CAPTURE_GLOBS, capture_globset, find_captures};
use crate::torch::load::load_snapshot;
use crate::torch::ranks::{RankComparison, RankRow};
use crate::{torch, xla};

/// What kind of capture a file name denotes, if any (the same rule as the capture globs).
pub fn detect_kind(path: &Path) -> Option<CaptureKind> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    if name.ends_with(".xplane.pb") {
        Some(CaptureKind::XlaCapture)
    } else if name.ends_with(".pickle")
        || name.ends_with(".pkl")
        || (name.ends_with(".json") && name.contains("snapshot"))
    {
        Some(CaptureKind::TorchSnapshot)
    } else {
        None
    }
}

/// Analyse and locate: what `report` and `--check` show.
pub fn run(path: &Path, opts: &Options) -> Result<Vec<CaptureReport>, CaptureError> {
    let mut reports = analyze_path(path, opts)?;
    locate(&mut reports, opts);
    Ok(reports)
}

/// One capture file, analysed and located.
pub fn run_file(path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
    let mut report = analyze_file(path, opts)?;
    locate(std::slice::from_mut(&mut report), opts);
    Ok(report)
}

/// `report --diff`, analysed and located.
pub fn run_diff(
    earlier: &Path,
    later: &Path,
    opts: &Options,
) -> Result<CaptureReport, CaptureError> {
    let mut report = analyze_diff(earlier, later, opts)?;
    locate(std::slice::from_mut(&mut report), opts);
    Ok(report)
}

/// The locate step over `opts.locate`'s workspace.
pub fn locate(reports: &mut [CaptureReport], opts: &Options) {
    let locator = Locator::new(&opts.locate, opts.analysis.frames.clone());
    for r in reports {
        locator.locate(r);
    }
}

/// Analyse one file or one capture directory (per-rank snapshots, `plugins/profile/<run>/`).
pub fn analyze_path(path: &Path, opts: &Options) -> Result<Vec<CaptureReport>, CaptureError> {
    let meta = std::fs::metadata(path).map_err(|e| CaptureError::io(path, &e))?;
    if !meta.is_dir() {
        return Ok(vec![analyze_file(path, opts)?]);
    }
    let files = captures_in_dir(path);
    if files.is_empty() {
        return Err(CaptureError::new(
            path,
            ErrorKind::Empty,
            None,
            "directory holds no capture (*.pickle, *.pkl, *snapshot*.json, *.xplane.pb)",
            "pass a snapshot file or a directory of per-rank snapshots",
        ));
    }
    let torch: Vec<&PathBuf> = files
        .iter()
        .filter(|p| detect_kind(p) == Some(CaptureKind::TorchSnapshot))
        .collect();
    let mut out = Vec::new();
    if torch.len() > 1 {
        out.extend(analyze_ranks(&torch, opts)?);
    } else if let Some(p) = torch.first() {
        out.push(analyze_file(p, opts)?);
    }
    for p in files
        .iter()
        .filter(|p| detect_kind(p) == Some(CaptureKind::XlaCapture))
    {
        out.push(analyze_file(p, opts)?);
    }
    Ok(out)
}

/// Analyse one capture file.
pub fn analyze_file(path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
    check_size(path, opts)?;
    match detect_kind(path) {
        Some(CaptureKind::XlaCapture) => xla_file(path, opts),
        Some(CaptureKind::TorchSnapshot) => torch_file(path, opts),
        None => sniff(path, opts),
    }
}

/// `report --diff`: two snapshots of the same run, earlier first; the report is about the later.
pub fn analyze_diff(
    earlier: &Path,
    later: &Path,
    opts: &Options,
) -> Result<CaptureReport, CaptureError> {
    check_size(earlier, opts)?;
    check_size(later, opts)?;
    let before = load_snapshot(earlier, &opts.decode)?;
    let a_before = torch::analyse(&before, &opts.analysis);
    let after = load_snapshot(later, &opts.decode)?;
    let mut a_after = torch::analyse(&after, &opts.analysis);
    let d = torch::diff::diff(&before, &a_before, &after, &a_after);
    a_after.findings.extend(torch::diff::findings(&after, &d));
    findings::sort(&mut a_after.findings);
    let mut out = torch::output(&after, &a_after, &opts.analysis);
    out.summary.diff = Some(torch::summary::diff(&d, earlier, later));
    Ok(torch_report(later, out))
}

fn torch_report(path: &Path, out: torch::Output) -> CaptureReport {
    CaptureReport {
        path: path.to_path_buf(),
        engine: Engine::Torch(Box::new(out.summary)),
        sites: out.sites,
        findings: out.findings,
        shown_path: None,
    }
}

fn torch_file(path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
    let snap = load_snapshot(path, &opts.decode)?;
    checkpoint(path, opts)?;
    let a = torch::analyse(&snap, &opts.analysis);
    checkpoint(path, opts)?;
    Ok(torch_report(path, torch::output(&snap, &a, &opts.analysis)))
}

fn xla_file(path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
    let cap = xla::Capture::open(path)?;
    checkpoint(path, opts)?;
    let out = xla::analyse(&cap, &opts.analysis)?;
    checkpoint(path, opts)?;
    Ok(CaptureReport {
        path: path.to_path_buf(),
        engine: Engine::Xla(Box::new(out.summary)),
        sites: out.sites,
        findings: out.findings,
        shown_path: None,
    })
}

/// Per-rank snapshots: each analysed alone, then every report carries the comparison of all.
/// A rank's snapshot is dropped once its output and comparison row exist.
pub fn analyze_ranks(
    paths: &[&PathBuf],
    opts: &Options,
) -> Result<Vec<CaptureReport>, CaptureError> {
    let mut outputs = Vec::new();
    let mut rows = Vec::new();
    for p in paths {
        check_size(p, opts)?;
        let snap = load_snapshot(p, &opts.decode)?;
        checkpoint(p, opts)?;
        let a = torch::analyse(&snap, &opts.analysis);
        rows.push(RankRow::of(p, &a));
        outputs.push(((*p).clone(), torch::output(&snap, &a, &opts.analysis)));
    }
    let cmp = RankComparison::with_rows(rows);
    Ok(outputs
        .into_iter()
        .enumerate()
        .map(|(i, (path, mut out))| {
            cmp.annotate(i, &mut out.findings);
            out.summary.rank = Some(i);
            out.summary.rank_comparison = Some(cmp.clone());
            torch_report(&path, out)
        })
        .collect())
}

/// Stop here when the caller no longer wants the answer (`DecodeOptions::cancel`).
fn checkpoint(path: &Path, opts: &Options) -> Result<(), CaptureError> {
    if opts.decode.cancel.is_cancelled() {
        return Err(CaptureError::cancelled(path));
    }
    Ok(())
}

fn check_size(path: &Path, opts: &Options) -> Result<(), CaptureError> {
    let meta = std::fs::metadata(path).map_err(|e| CaptureError::io(path, &e))?;
    if !meta.is_file() {
        // Opening a FIFO would block until some writer appears: refuse it instead of hanging.
        return Err(CaptureError::new(
            path,
            ErrorKind::Unsupported,
            None,
            "not a regular file (a pipe, socket or device)",
            "pass the capture file itself",
        ));
    }
    if meta.len() > opts.decode.max_file_bytes {
        return Err(CaptureError::new(
            path,
            ErrorKind::Limit,
            None,
            format!(
                "file is {} bytes, above the limit of {} bytes",
                meta.len(),
                opts.decode.max_file_bytes
            ),
            "raise maxFileBytes / --max-file-bytes if this really is a capture",
        ));
    }
    Ok(())
}

/// Unknown extension: decide by content (pickle PROTO byte, JSON brace).
fn sniff(path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
    use std::io::Read;
    let mut head = [0u8; 2];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| CaptureError::io(path, &e))?;
    match &head[..n] {
        [0x80, ..] | [b'{', ..] | [b'[', ..] => torch_file(path, opts),
        _ => Err(CaptureError::new(
            path,
            ErrorKind::Unsupported,
            Some(0),
            "not a PyTorch snapshot or an .xplane.pb capture",
            "memlsp reads *.pickle/*.pkl/*snapshot*.json and *.xplane.pb",
        )),
    }
}

/// The capture files named by `paths`, as `--check` takes them: a file as given, a directory
/// scanned like a workspace (capture globs, `.gitignore`, no `.venv`/`node_modules`). A path that
/// does not exist, or a directory without captures, is an error in the second list.
pub fn collect_captures(paths: &[PathBuf]) -> (Vec<PathBuf>, Vec<CaptureError>) {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    let globs = match capture_globset(&DEFAULT_CAPTURE_GLOBS) {
        Ok(g) => g,
        // The globs are constants; this only fails if they are edited into nonsense.
        Err(e) => {
            for path in paths {
                errors.push(CaptureError::new(
                    path,
                    ErrorKind::Unsupported,
                    None,
                    format!("capture globs: {e}"),
                    "report this as a bug",
                ));
            }
            return (files, errors);
        }
    };
    for path in paths {
        let err = match std::fs::metadata(path) {
            Err(e) => CaptureError::io(path, &e),
            Ok(meta) if meta.is_dir() => {
                let found = find_captures(path, &globs);
                if !found.is_empty() {
                    files.extend(found);
                    continue;
                }
                CaptureError::new(
                    path,
                    ErrorKind::Empty,
                    None,
                    "no capture found (*.pickle, *.pkl, *snapshot*.json, *.xplane.pb; \
                     .gitignored files and .venv/node_modules are skipped)",
                    "pass the capture files or their directory explicitly",
                )
            }
            Ok(_) => {
                files.push(path.clone());
                continue;
            }
        };
        errors.push(err);
    }
    (files, errors)
}

/// What [`analyze_files`] is doing, for a caller that shows progress.
pub enum Step<'a> {
    /// About to analyse file `index` (from 0) of `total`.
    Analysing {
        index: usize,
        total: usize,
        path: &'a Path,
    },
    /// That file could not be read; the others are still analysed.
    Failed(&'a CaptureError),
}

/// `--check`'s analysis: every file on its own (not located yet: a baseline compares recorded
/// paths), the unreadable ones kept as errors.
pub fn analyze_files(
    files: &[PathBuf],
    opts: &Options,
    mut progress: impl FnMut(Step<'_>),
) -> (Vec<CaptureReport>, Vec<CaptureError>) {
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    for (index, path) in files.iter().enumerate() {
        progress(Step::Analysing {
            index,
            total: files.len(),
            path,
        });
        match analyze_file(path, opts) {
            Ok(report) => reports.push(report),
            Err(e) => {
                progress(Step::Failed(&e));
                errors.push(e);
            }
        }
    }
    (reports, errors)
}

/// The verdict of a check, the rule of `--check`'s exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No finding at or above the threshold (exit 0).
    Clean,
    /// A finding at or above the threshold (exit 1).
    Findings,
    /// A capture could not be read (exit 2), whatever the findings.
    Unreadable,
}

/// Unreadable when a capture could not be read, else findings when one is at or above
/// `fail_on`, else clean.
pub fn verdict(reports: &[CaptureReport], had_errors: bool, fail_on: Severity) -> Verdict {
    if had_errors {
        Verdict::Unreadable
    } else if reports
        .iter()
        .flat_map(|r| &r.findings)
        .any(|f| f.severity >= fail_on)
    {
        Verdict::Findings
    } else {
        Verdict::Clean
    }
}

/// Capture files below `dir` (the capture globs; `.gitignore`d files and environment folders
/// skipped), sorted by path.
pub fn captures_in_dir(dir: &Path) -> Vec<PathBuf> {
    let Ok(globs) = capture_globset(&DEFAULT_CAPTURE_GLOBS) else {
        return Vec::new();
    };
    let mut files = find_captures(dir, &globs);
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server waits for a capture that is still being written instead of reporting it: an
    /// empty file of either kind is "maybe still being written".
    #[test]
    fn an_empty_capture_of_either_kind_is_still_being_written() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["memory_snapshot.pickle", "host.xplane.pb"] {
            let p = dir.path().join(name);
            std::fs::write(&p, b"").unwrap();
            let e = analyze_file(&p, &Options::default()).unwrap_err();
            assert!(e.is_incomplete(), "{name}: {e}");
            assert_eq!(e.offset, Some(0), "{name}");
        }
    }
}
