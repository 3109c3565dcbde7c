//! `memlsp --check [PATH…]`: analyse captures like CI does and exit by severity.
//!
//! Directories are scanned the way the server scans a workspace (capture globs, `.gitignore`,
//! no `.venv`/`node_modules`); each capture is analysed on its own. Every capture that cannot be
//! read is one line on stderr and makes the exit status 2; the others are still reported.

use std::io::IsTerminal;
use std::path::PathBuf;

use crate::analyze::{Step, Verdict, analyze_files, collect_captures, verdict};
use crate::error::CaptureError;
use crate::findings::Severity;
use crate::report::CaptureReport;

use super::{CheckFormat, CommonArgs, emit, emit_with};
use crate::present::json;
use crate::present::{github, sarif, text};

pub(super) struct CheckArgs {
    pub paths: Vec<PathBuf>,
    pub format: CheckFormat,
    pub fail_on: Severity,
    pub workspace: Option<PathBuf>,
    pub baseline: Option<BaselineCheck>,
    pub common: CommonArgs,
}

/// `--baseline FILE` and how to compare.
pub(super) struct BaselineCheck {
    pub file: PathBuf,
    pub options: crate::baseline::CompareOptions,
}

pub(super) fn run(args: CheckArgs) -> i32 {
    let workspace = match &args.workspace {
        Some(dir) if !dir.is_dir() => {
            return super::usage(&format!("--workspace {}: not a directory", dir.display()));
        }
        Some(dir) => super::absolute(dir),
        None => super::absolute(".".as_ref()),
    };
    let paths = if args.paths.is_empty() {
        vec![workspace.clone()]
    } else {
        args.paths.clone()
    };
    // The baseline is read first: a wrong path is a usage error before any analysis.
    let base = match &args.baseline {
        Some(b) => match std::fs::read_to_string(&b.file)
            .map_err(|e| format!("{}: cannot read the baseline ({e})", b.file.display()))
            .and_then(|t| crate::baseline::parse(&b.file, &t))
        {
            Ok(base) => Some((base, b)),
            Err(e) => {
                eprintln!("memlsp: {e}");
                return 2;
            }
        },
        None => None,
    };
    let mut errors: Vec<CaptureError> = Vec::new();
    let files = collect(&paths, &mut errors);
    let opts = args.common.options(workspace.clone());
    let walk = crate::analyze::WorkspaceWalk::start(&opts);
    let mut reports = analyse_all(&files, &opts, &mut errors);
    if let Some((base, b)) = &base {
        let o = crate::baseline::compare(&mut reports, base, &b.options);
        eprintln!(
            "memlsp: {} number(s) compared with {} (allowed growth {:.1}%{})",
            o.compared,
            b.file.display(),
            b.options.max_growth * 100.0,
            match o.timing_skipped {
                0 => String::new(),
                n => format!("; {n} timing-dependent left out, --timing compares them"),
            }
        );
        for k in &o.new_keys {
            eprintln!("memlsp: {k}: not in the baseline (record it again to include it)");
        }
        for k in &o.missing_keys {
            eprintln!("memlsp: {k}: in the baseline, but no capture of this run has that key");
        }
    }
    walk.locate(&mut reports, &opts);
    emit_with(|w| {
        let built = match args.format {
            // A capture at a time, as `report` writes it.
            CheckFormat::Json => return json::write_document(&reports, &errors, w),
            CheckFormat::Text => text::check(&reports, errors.len()),
            CheckFormat::Sarif => json::render(&sarif::document(&reports, &workspace, &errors)),
            CheckFormat::Github => github::check(&reports),
        };
        w.write_all(built.as_bytes())
    });
    exit_code(&reports, !errors.is_empty(), args.fail_on)
}

/// Analyse every file (not located yet: a baseline compares recorded paths), with progress.
fn analyse_all(
    files: &[PathBuf],
    opts: &crate::options::Options,
    errors: &mut Vec<CaptureError>,
) -> Vec<CaptureReport> {
    let progress = Progress::new(files.len());
    let (reports, failed) = analyze_files(files, opts, |step| match step {
        Step::Analysing { index, path, .. } => progress.show(index, path),
        Step::Failed(e) => {
            progress.clear();
            eprintln!("memlsp: {e}");
        }
    });
    progress.clear();
    errors.extend(failed);
    reports
}

/// `memlsp baseline PATH… [-o FILE]`: the numbers of the captures, as JSON.
pub(super) fn record_baseline(args: super::BaselineArgs) -> i32 {
    let workspace = super::absolute(".".as_ref());
    let mut errors: Vec<CaptureError> = Vec::new();
    let files = collect(&args.paths, &mut errors);
    let opts = args.common.options(workspace);
    let reports = analyse_all(&files, &opts, &mut errors);
    if !errors.is_empty() {
        // A baseline missing a capture would pass every later check of it: write none.
        eprintln!(
            "memlsp: no baseline written: {} capture(s) could not be read",
            errors.len()
        );
        return 2;
    }
    let base = crate::baseline::record(&reports);
    let out = crate::baseline::to_json(&base);
    match &args.output {
        Some(path) => match std::fs::write(path, out) {
            Ok(()) => {
                eprintln!(
                    "memlsp: baseline of {} capture(s) written to {}",
                    base.captures.len(),
                    path.display()
                );
                0
            }
            Err(e) => {
                eprintln!(
                    "memlsp: {}: cannot write the baseline ({e}); pass a writable -o FILE",
                    path.display()
                );
                2
            }
        },
        None => {
            emit(&out);
            0
        }
    }
}

/// 2 when a capture could not be read, else 1 when a finding is at or above `fail_on`, else 0.
pub(super) fn exit_code(reports: &[CaptureReport], had_errors: bool, fail_on: Severity) -> i32 {
    match verdict(reports, had_errors, fail_on) {
        Verdict::Clean => 0,
        Verdict::Findings => 1,
        Verdict::Unreadable => 2,
    }
}

/// The capture files named by `paths` ([`collect_captures`]); each path that names none is one
/// line on stderr and recorded in `errors`.
fn collect(paths: &[PathBuf], errors: &mut Vec<CaptureError>) -> Vec<PathBuf> {
    let (files, failed) = collect_captures(paths);
    for e in &failed {
        eprintln!("memlsp: {e}");
    }
    errors.extend(failed);
    files
}

/// `analysing 3/12 name` on stderr, only when stderr is a terminal and there is more than one.
struct Progress {
    total: usize,
    on: bool,
}

impl Progress {
    fn new(total: usize) -> Self {
        Progress {
            total,
            on: total > 1 && std::io::stderr().is_terminal(),
        }
    }

    fn show(&self, i: usize, file: &std::path::Path) {
        if self.on {
            let name = file.file_name().unwrap_or_default().to_string_lossy();
            let name = crate::present::escape::one_line(&name);
            eprint!("\r\x1b[2Kmemlsp: analysing {}/{} {name}", i + 1, self.total);
        }
    }

    fn clear(&self) {
        if self.on {
            eprint!("\r\x1b[2K");
        }
    }
}
