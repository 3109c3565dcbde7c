//! `memlsp report FILE`: the full report of one capture, as text or JSON.

use crate::analyze::{Partial, run_diff, run_partial, run_trend};

use std::io::Write;

use super::{ReportArgs, ReportFormat, emit_with};
use crate::present::json;
use crate::present::text;

pub(super) fn run_report(args: ReportArgs) -> i32 {
    // `MEMLSP_TIMINGS=1`: phase timings and peak RSS on stderr at the end (for the benchmarks).
    let timings = std::env::var_os("MEMLSP_TIMINGS").is_some_and(|v| !v.is_empty() && v != "0");
    if timings {
        crate::timings::enable();
    }
    let code = report_inner(args);
    if timings {
        eprint!("{}", crate::timings::render(&crate::timings::take()));
    }
    code
}

fn report_inner(args: ReportArgs) -> i32 {
    if args.trend && args.files.len() < 3 {
        return super::usage(
            "--trend needs three or more snapshots of one run, oldest first (two: --diff LATER)",
        );
    }
    if !args.trend && args.files.len() > 1 {
        return super::usage(
            "report reads one FILE or folder (snapshots of one run at successive steps: --trend A B C)",
        );
    }
    let file = &args.files[0];
    // The workspace of `report` is the current directory.
    let mut opts = args.common.options(super::absolute(".".as_ref()));
    if let Some(top) = args.top {
        opts.analysis.top = top;
    }
    opts.decode.max_trace_events = args.max_trace_events;
    opts.range = args.range;
    opts.analysis.module = args.module.clone();
    opts.analysis.pictures = args.format == ReportFormat::Html;
    if let Some(on) = &args.on {
        match crate::present::capacity::parse(on, crate::present::capacity::DEFAULT_CONTEXT_RESERVE)
        {
            Ok(c) => opts.analysis.capacity = Some(c.bytes),
            Err(e) => return super::usage(&format!("--on: {e}")),
        }
    }
    opts.analysis.fit = args.fit || args.on.is_some();
    opts.jobs = args.jobs.unwrap_or(0) as usize;
    // One snapshot file: how far its reading got, on stderr (a folder of ranks says which rank).
    let reading = match &args.diff {
        None if !args.trend => crate::analyze::reading_progress(file),
        None => None,
        Some(_) => None,
    };
    let watch = reading.map(|(progress, total)| {
        opts.decode.progress = progress.clone();
        super::progress::Watch::start(file, total, &progress)
    });
    let result = match &args.diff {
        Some(later) => run_diff(file, later, &opts).map(|r| Partial {
            reports: vec![r],
            errors: Vec::new(),
        }),
        None if args.trend => run_trend(&args.files, &opts).map(|r| Partial {
            reports: vec![r],
            errors: Vec::new(),
        }),
        None => run_partial(file, &opts),
    };
    drop(watch);
    let Partial { reports, errors } = match result {
        Ok(p) => p,
        Err(e) => {
            eprintln!("memlsp: {e}");
            return 2;
        }
    };
    // A folder with a capture that cannot be read: the others are reported, each bad one is a
    // line on stderr (and in the JSON document's errors), and the exit status is 2, as `--check`.
    for e in &errors {
        eprintln!("memlsp: {e}");
    }
    if !errors.is_empty() && reports.is_empty() {
        return 2;
    }
    let failed = if errors.is_empty() { 0 } else { 2 };
    // The JSON document is written a capture at a time (many ranks' text is never held whole);
    // the text report and the page are built, then written.
    let write = |w: &mut dyn Write| -> std::io::Result<()> {
        let built = match args.format {
            ReportFormat::Json => return json::write_document(&reports, &errors, w),
            ReportFormat::Text => {
                crate::timings::time("render", || text::report(&reports, opts.analysis.top))
            }
            ReportFormat::Html => {
                crate::timings::time("render", || crate::present::html::render(&reports))
            }
        };
        w.write_all(built.as_bytes())
    };
    crate::timings::time("write", || match &args.output {
        // Never into a capture's folder unless the user names the file there.
        Some(path) => {
            let written = std::fs::File::create(path).and_then(|f| {
                let mut w = std::io::BufWriter::new(f);
                write(&mut w)?;
                w.flush()
            });
            match written {
                Ok(()) => failed,
                Err(e) => {
                    eprintln!(
                        "memlsp: {}: cannot write the report ({e}); pass a writable -o FILE",
                        path.display()
                    );
                    2
                }
            }
        }
        None => {
            emit_with(write);
            failed
        }
    })
}
