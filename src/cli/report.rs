//! `memlsp report FILE`: the full report of one capture, as text or JSON.

use crate::analyze::{analyze_diff, analyze_path};
use crate::source::paths::Resolver;
use crate::source::resolve_fixes;

use super::{ReportArgs, ReportFormat, emit, json, text};

pub(super) fn run(args: ReportArgs) -> i32 {
    let mut opts = args.common.options();
    if let Some(top) = args.top {
        opts.top = top;
    }
    opts.max_trace_events = args.max_trace_events;
    opts.module = args.module.clone();
    // The workspace of `report` is the current directory.
    opts.workspace = std::env::current_dir().into_iter().collect();
    opts.path_mappings = args.common.mappings();
    let result = match &args.diff {
        Some(later) => analyze_diff(&args.file, later, &opts).map(|r| vec![r]),
        None => analyze_path(&args.file, &opts),
    };
    let mut reports = match result {
        Ok(reports) => reports,
        Err(e) => {
            eprintln!("memlsp: {e}");
            return 2;
        }
    };
    let out = match args.format {
        ReportFormat::Text => text::report(&reports),
        ReportFormat::Json => {
            // The workspace of `report` is the current directory.
            let resolver =
                Resolver::new(vec![super::absolute(".".as_ref())], args.common.mappings());
            for r in &mut reports {
                resolve_fixes(r, &resolver);
            }
            json::render(&json::document(&reports, &resolver, &[]))
        }
    };
    emit(&out);
    0
}
