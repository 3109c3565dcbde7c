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
use crate::source::workspace::{
    DEFAULT_CAPTURE_GLOBS, capture_globset, find_captures, scan_captures,
};
use crate::torch::load::load_snapshot;
use crate::torch::ranks::{RankComparison, RankRow, number_in_name};
use crate::{torch, xla};

/// Where the reader of the capture file `path` will say how far it read (give it to the
/// analysis as `DecodeOptions::progress`), and the file's size, for whoever shows progress:
/// `None` for a folder. A snapshot's decoder publishes its offset; a JAX capture's walks their
/// position in the file, then all of it once the runtime walk (nearly all of the time) is done.
pub fn reading_progress(path: &Path) -> Option<(crate::options::Progress, u64)> {
    let meta = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
    Some((crate::options::Progress::new(), meta.len()))
}

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
    let workspace = WorkspaceWalk::start(opts);
    let mut reports = analyze_path(path, opts)?;
    crate::timings::time("locate", || workspace.locate(&mut reports, opts));
    Ok(reports)
}

/// One capture file, analysed and located.
pub fn run_file(path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
    let workspace = WorkspaceWalk::start(opts);
    let mut report = analyze_file(path, opts)?;
    workspace.locate(std::slice::from_mut(&mut report), opts);
    Ok(report)
}

/// `report --diff`, analysed and located.
pub fn run_diff(
    earlier: &Path,
    later: &Path,
    opts: &Options,
) -> Result<CaptureReport, CaptureError> {
    let workspace = WorkspaceWalk::start(opts);
    let mut report = analyze_diff(earlier, later, opts)?;
    workspace.locate(std::slice::from_mut(&mut report), opts);
    Ok(report)
}

/// `report --trend A B C…`: snapshots of one run named on the command line, oldest first, read
/// as a series (as a folder of `…step<K>…` files is). The steps are the `step<K>` numbers when
/// every name has one and they ascend in the order given, else 1, 2, 3… in that order.
pub fn run_trend(
    paths: &[std::path::PathBuf],
    opts: &Options,
) -> Result<CaptureReport, CaptureError> {
    let numbered: Option<Vec<u64>> = paths.iter().map(|p| number_in_name(p, "step")).collect();
    let steps: Vec<u64> = match numbered {
        Some(n) if n.windows(2).all(|w| w[0] < w[1]) => n,
        _ => (1..=paths.len() as u64).collect(),
    };
    let series: Vec<(u64, &std::path::PathBuf)> = steps.into_iter().zip(paths).collect();
    let workspace = WorkspaceWalk::start(opts);
    let mut report = analyze_series(&series, opts)?;
    workspace.locate(std::slice::from_mut(&mut report), opts);
    Ok(report)
}

/// The locate step over `opts.locate`'s workspace.
pub fn locate(reports: &mut [CaptureReport], opts: &Options) {
    locate_with(
        reports,
        Locator::new(&opts.locate, opts.analysis.frames.clone()),
    );
}

fn locate_with(reports: &mut [CaptureReport], locator: Locator) {
    for r in reports {
        locator.locate(r);
    }
}

/// [`run`] that keeps going past captures of a directory that cannot be read: the others'
/// reports (ranks compared among the good ones) and the errors. `Err` only when `path` itself
/// cannot be read or holds no capture.
pub fn run_partial(path: &Path, opts: &Options) -> Result<Partial, CaptureError> {
    let workspace = WorkspaceWalk::start(opts);
    let mut partial = analyze_path_partial(path, opts)?;
    crate::timings::time("locate", || workspace.locate(&mut partial.reports, opts));
    Ok(partial)
}

/// The workspace's Python files, indexed on another thread while the captures are analysed (by
/// every `run…` here, `--check` and the MCP baseline check; [`locate`] walks it on the spot):
/// the walk of a large working directory (up to `MAX_SCAN_ENTRIES` entries per root) can take
/// as long as the analysis, and the decoder leaves the second core mostly idle meanwhile. If
/// the analysis fails, the walk is left to finish on its own (it is bounded) and nothing waits.
pub struct WorkspaceWalk(Option<std::thread::JoinHandle<crate::source::paths::Resolver>>);

impl WorkspaceWalk {
    /// Start walking `opts.locate`'s workspace.
    pub fn start(opts: &Options) -> WorkspaceWalk {
        let (roots, mappings) = (
            opts.locate.workspace.clone(),
            opts.locate.path_mappings.clone(),
        );
        let walk = move || crate::source::paths::Resolver::new(roots, mappings);
        let handle = std::thread::Builder::new()
            .name("memlsp-workspace".into())
            .spawn(walk)
            .ok();
        WorkspaceWalk(handle)
    }

    /// [`locate`] `reports` over the walked index (walked here, as [`locate`] does, if the
    /// thread could not start or failed).
    pub fn locate(self, reports: &mut [CaptureReport], opts: &Options) {
        let frames = opts.analysis.frames.clone();
        let locator = match self.0.map(|h| h.join()) {
            Some(Ok(r)) => Locator::with_resolver(std::sync::Arc::new(r), frames),
            _ => Locator::new(&opts.locate, frames),
        };
        locate_with(reports, locator);
    }
}

/// The captures of a path that could be read, and the errors of those that could not.
#[derive(Default)]
pub struct Partial {
    pub reports: Vec<CaptureReport>,
    pub errors: Vec<CaptureError>,
}

impl Partial {
    fn keep(&mut self, r: Result<CaptureReport, CaptureError>) {
        match r {
            Ok(r) => self.reports.push(r),
            Err(e) => self.errors.push(e),
        }
    }
}

/// Analyse one file or one capture directory (per-rank snapshots, `plugins/profile/<run>/`); the
/// first capture that cannot be read fails the whole (see [`analyze_path_partial`]).
pub fn analyze_path(path: &Path, opts: &Options) -> Result<Vec<CaptureReport>, CaptureError> {
    let mut partial = analyze_path_partial(path, opts)?;
    if !partial.errors.is_empty() {
        return Err(partial.errors.swap_remove(0));
    }
    Ok(partial.reports)
}

/// [`analyze_path`], going on past the captures of a directory that cannot be read.
pub fn analyze_path_partial(path: &Path, opts: &Options) -> Result<Partial, CaptureError> {
    let meta = std::fs::metadata(path).map_err(|e| CaptureError::io(path, &e))?;
    if !meta.is_dir() {
        return Ok(Partial {
            reports: vec![analyze_file(path, opts)?],
            errors: Vec::new(),
        });
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
    let mut out = Partial::default();
    match torch_groups(&torch) {
        TorchGroups::Ranks(ranks, rest) => {
            let (reports, errors) = analyze_ranks(&ranks, opts);
            out.reports.extend(reports);
            out.errors.extend(errors);
            for p in rest {
                out.keep(analyze_file(p, opts));
            }
        }
        TorchGroups::Series(steps, rest) => {
            out.keep(analyze_series(&steps, opts));
            for p in rest {
                out.keep(analyze_file(p, opts));
            }
        }
        TorchGroups::Steps(first, last, rest) => {
            out.keep(analyze_diff(first, last, opts));
            for p in rest {
                out.keep(analyze_file(p, opts));
            }
        }
        TorchGroups::One(p) => out.keep(analyze_file(p, opts)),
        TorchGroups::None => {}
    }
    for p in files
        .iter()
        .filter(|p| detect_kind(p) == Some(CaptureKind::XlaCapture))
    {
        out.keep(analyze_file(p, opts));
    }
    Ok(out)
}

/// How the snapshots of a directory are read together.
enum TorchGroups<'a> {
    /// Per-rank snapshots (`rank3_…`, or several unnamed ones: each rank analysed and compared;
    /// with steps in the names, the latest step of each rank), and the other files.
    Ranks(Vec<&'a PathBuf>, Vec<&'a PathBuf>),
    /// Snapshots of one process at several steps (`snapshot_step1`, `snapshot_step10`, as
    /// `memlsp_capture` writes them): what grew from the first to the last, and the other files
    /// (`snapshot_oom`) on their own.
    Steps(&'a PathBuf, &'a PathBuf, Vec<&'a PathBuf>),
    /// Three or more steps of one process: the trend over all of them (`torch::trend`).
    Series(Vec<(u64, &'a PathBuf)>, Vec<&'a PathBuf>),
    One(&'a PathBuf),
    None,
}

fn torch_groups<'a>(torch: &[&'a PathBuf]) -> TorchGroups<'a> {
    let ranked: Vec<&PathBuf> = torch
        .iter()
        .copied()
        .filter(|p| number_in_name(p, "rank").is_some())
        .collect();
    if ranked.len() > 1 {
        // The latest step of each rank.
        let mut latest: std::collections::BTreeMap<u64, &PathBuf> = Default::default();
        for p in &ranked {
            let r = number_in_name(p, "rank").unwrap_or(0);
            let newer = latest.get(&r).is_none_or(|q| {
                number_in_name(p, "step").unwrap_or(0) > number_in_name(q, "step").unwrap_or(0)
            });
            if newer {
                latest.insert(r, p);
            }
        }
        let ranks: Vec<&PathBuf> = latest.into_values().collect();
        let rest = torch
            .iter()
            .copied()
            .filter(|p| number_in_name(p, "rank").is_none())
            .collect();
        return TorchGroups::Ranks(ranks, rest);
    }
    let mut stepped: Vec<(u64, &PathBuf)> = torch
        .iter()
        .filter_map(|p| Some((number_in_name(p, "step")?, *p)))
        .collect();
    if stepped.len() > 1 {
        stepped.sort();
        let (first, last) = (stepped[0].1, stepped[stepped.len() - 1].1);
        let rest = torch
            .iter()
            .copied()
            .filter(|p| number_in_name(p, "step").is_none())
            .collect();
        if stepped.len() >= 3 {
            return TorchGroups::Series(stepped, rest);
        }
        return TorchGroups::Steps(first, last, rest);
    }
    match torch {
        [] => TorchGroups::None,
        [one] => TorchGroups::One(one),
        many => TorchGroups::Ranks(many.to_vec(), Vec::new()),
    }
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

/// Three or more snapshots of one run, oldest step first: the report of the last, with what
/// grew since the first (`diff`) and the trend over all (`trend`); PT011 comes from the whole
/// series (a site that grew at every snapshot), not from the first and last alone.
pub fn analyze_series(
    steps: &[(u64, &PathBuf)],
    opts: &Options,
) -> Result<CaptureReport, CaptureError> {
    let mut analysed = Vec::with_capacity(steps.len());
    let mut first = None;
    let mut last = None;
    for (i, (step, p)) in steps.iter().enumerate() {
        check_size(p, opts)?;
        let snap = load_snapshot(p, &opts.decode)?;
        checkpoint(p, opts)?;
        let a = torch::analyse(&snap, &opts.analysis);
        analysed.push((*step, p.display().to_string(), a));
        if i == 0 {
            first = Some(snap);
        } else if i + 1 == steps.len() {
            last = Some(snap);
        }
    }
    let (Some(before), Some(after)) = (first, last) else {
        return Err(CaptureError::new(
            steps[0].1,
            ErrorKind::Empty,
            None,
            "a series needs three or more snapshots",
            "name them …step<K>…",
        ));
    };
    let refs: Vec<(u64, String, &torch::Analysis)> = analysed
        .iter()
        .map(|(s, p, a)| (*s, p.clone(), a))
        .collect();
    let trend = torch::trend::compute(&refs);
    let (earlier, later) = (steps[0].1, steps[steps.len() - 1].1);
    let (a_before, a_after) = (&analysed[0].2, &analysed[analysed.len() - 1].2);
    let d = torch::diff::diff(&before, a_before, &after, a_after);
    let mut out = torch::output(&after, a_after, &opts.analysis);
    out.findings.extend(torch::trend::findings(&after, &trend));
    findings::sort(&mut out.findings);
    out.summary.diff = Some(torch::summary::diff(&d, earlier, later));
    out.summary.trend = Some(trend);
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
    Ok(torch_report(path, torch_output(path, opts, None)?))
}

/// [`analyze_file`], handing `recorded` first the report of what the capture records (totals,
/// sites, the findings of the recorded trace; the replay not run yet) as soon as the trace is
/// decoded and analysed, before the simulations (allocator replay, what-ifs) run. A capture
/// without simulations (JAX, a directory) gives only the final report.
pub fn analyze_file_staged(
    path: &Path,
    opts: &Options,
    recorded: &mut dyn FnMut(CaptureReport),
) -> Result<CaptureReport, CaptureError> {
    check_size(path, opts)?;
    match detect_kind(path) {
        Some(CaptureKind::TorchSnapshot) => {
            let mut first = |snap: &torch::model::Snapshot, a: &torch::Analysis| {
                recorded(torch_report(path, torch::output(snap, a, &opts.analysis)));
            };
            Ok(torch_report(
                path,
                torch_output(path, opts, Some(&mut first))?,
            ))
        }
        _ => analyze_file(path, opts),
    }
}

/// One snapshot loaded, analysed and dropped: what the presenters need of it.
fn torch_output(
    path: &Path,
    opts: &Options,
    recorded: Option<&mut torch::Recorded<'_>>,
) -> Result<torch::Output, CaptureError> {
    let snap = load_snapshot(path, &opts.decode)?;
    checkpoint(path, opts)?;
    let (snap, cuts) = match &opts.range {
        Some(r) => torch::range::cut(snap, r).map_err(|m| {
            CaptureError::new(
                path,
                crate::error::ErrorKind::Invalid,
                None,
                format!("--range: {m}"),
                "choose a range inside the trace",
            )
        })?,
        None => (snap, Vec::new()),
    };
    let a = torch::analyse_staged(&snap, &opts.analysis, recorded);
    checkpoint(path, opts)?;
    let mut out = torch::output(&snap, &a, &opts.analysis);
    out.summary.range = cuts;
    // Freeing the snapshot and the analysis is part of the run.
    crate::timings::time("drop", || drop((a, snap)));
    Ok(out)
}

fn xla_file(path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
    let mut cap = xla::Capture::open_with(path, &opts.decode)?;
    cap.file.progress = opts.decode.progress.clone();
    cap.file.cancel = opts.decode.cancel.clone();
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

/// Per-rank snapshots: each analysed alone, `opts.jobs()` at a time (a snapshot is dropped once
/// its output exists, so at most that many are resident), then every report carries the
/// comparison of all that could be read (built from the ranks' summaries) and its rank's PT012
/// findings; the ranks that could not be read are the errors.
pub fn analyze_ranks(
    paths: &[&PathBuf],
    opts: &Options,
) -> (Vec<CaptureReport>, Vec<CaptureError>) {
    // Every rank's report is kept until all are read (each gains the comparison), so the
    // stacks the ranks have in common, usually all of them, are kept once.
    let stacks = std::sync::Mutex::new(crate::findings::StackSet::default());
    let one = |p: &PathBuf| -> Result<torch::Output, CaptureError> {
        check_size(p, opts)?;
        let mut out = torch_output(p, opts, None);
        if let (Ok(out), Ok(mut set)) = (&mut out, stacks.lock()) {
            out.share_stacks(&mut set);
        }
        // What this snapshot freed goes back before the next one peaks.
        crate::process_memory::trim_heap();
        out
    };
    if paths.len() > 1 {
        crate::process_memory::tune_allocator();
    }
    let jobs = opts.jobs().min(paths.len()).max(1);
    let mut results: Vec<Option<Result<torch::Output, CaptureError>>> =
        (0..paths.len()).map(|_| None).collect();
    if jobs == 1 {
        for (i, p) in paths.iter().enumerate() {
            progress(i, paths.len(), p);
            results[i] = Some(one(p));
        }
    } else {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let done = std::sync::Mutex::new(&mut results);
        std::thread::scope(|sc| {
            for _ in 0..jobs {
                sc.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(p) = paths.get(i) else { break };
                        progress(i, paths.len(), p);
                        let r = one(p);
                        if let Ok(mut d) = done.lock() {
                            d[i] = Some(r);
                        }
                    }
                });
            }
        });
    }
    let mut outputs = Vec::with_capacity(paths.len());
    let mut errors = Vec::new();
    for (p, r) in paths.iter().zip(results) {
        match r {
            Some(Ok(out)) => outputs.push(((*p).clone(), out)),
            Some(Err(e)) => errors.push(e),
            None => {}
        }
    }
    let rows = outputs
        .iter()
        .enumerate()
        .map(|(i, (p, out))| {
            let rank = torch::ranks::rank_in_name(p).unwrap_or(i);
            RankRow::of(p, rank, &out.summary.rank_summary)
        })
        .collect();
    let cmp = std::sync::Arc::new(RankComparison::with_rows(rows));
    let reports = outputs
        .into_iter()
        .enumerate()
        .map(|(i, (path, mut out))| {
            cmp.annotate(i, &mut out.findings);
            findings::sort(&mut out.findings);
            out.summary.rank = Some(cmp.rows[i].rank);
            out.summary.rank_comparison = Some(cmp.clone());
            torch_report(&path, out)
        })
        .collect();
    (reports, errors)
}

/// Reports of per-rank snapshots analysed one by one (`--check`, the server): those whose file
/// names carry a rank and share a directory are compared, each gaining the comparison and its
/// PT012 findings (from the ranks' summaries: nothing is read again). Reports already compared
/// (`report DIR`) are left alone.
pub fn compare_ranks_in(reports: &mut [CaptureReport]) {
    let mut groups: std::collections::BTreeMap<PathBuf, Vec<usize>> = Default::default();
    for (i, r) in reports.iter().enumerate() {
        if let Engine::Torch(t) = &r.engine {
            if t.rank_comparison.is_none() && torch::ranks::rank_in_name(&r.path).is_some() {
                let dir = r.path.parent().map(Path::to_path_buf).unwrap_or_default();
                groups.entry(dir).or_default().push(i);
            }
        }
    }
    for (_, mut idx) in groups {
        if idx.len() < 2 {
            continue;
        }
        idx.sort_by_key(|&i| torch::ranks::rank_in_name(&reports[i].path));
        let rows: Vec<RankRow> = idx
            .iter()
            .filter_map(|&i| match &reports[i].engine {
                Engine::Torch(t) => Some(RankRow::of(
                    &reports[i].path,
                    torch::ranks::rank_in_name(&reports[i].path).unwrap_or(i),
                    &t.rank_summary,
                )),
                Engine::Xla(_) => None,
            })
            .collect();
        let cmp = std::sync::Arc::new(RankComparison::with_rows(rows));
        for (k, &i) in idx.iter().enumerate() {
            let r = &mut reports[i];
            cmp.annotate(k, &mut r.findings);
            findings::sort(&mut r.findings);
            if let Engine::Torch(t) = &mut r.engine {
                t.rank = Some(cmp.rows[k].rank);
                t.rank_comparison = Some(cmp.clone());
            }
        }
    }
}

/// `memlsp: rank 3/64 name` on stderr for runs of many snapshots, when stderr is a terminal
/// (or `MEMLSP_PROGRESS=1`, for logs of batch jobs).
fn progress(i: usize, n: usize, p: &Path) {
    use std::io::IsTerminal;
    if n < 4 {
        return;
    }
    let on = std::io::stderr().is_terminal()
        || std::env::var_os("MEMLSP_PROGRESS").is_some_and(|v| v == "1");
    if on {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        eprintln!("memlsp: snapshot {}/{n} {name}", i + 1);
    }
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
                let scan = scan_captures(path, &globs);
                // What the scan passed over is named with the captures that could not be read.
                for (p, why) in &scan.skipped {
                    errors.push(CaptureError::new(
                        p,
                        ErrorKind::Io,
                        None,
                        format!("skipped: {why}"),
                        "name the capture file itself, or make the folder readable",
                    ));
                }
                let found = scan.found;
                if !found.is_empty() || !scan.skipped.is_empty() {
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

/// `--check`'s analysis (the CLI's, the MCP tool's, a baseline's): every file on its own, then
/// the rank files of one folder compared ([`compare_ranks_in`]); not located yet (a baseline
/// compares recorded paths); the unreadable ones kept as errors.
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
    compare_ranks_in(&mut reports);
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
