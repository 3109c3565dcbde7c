//! `memlsp compare --label NAME=SNAPSHOT …`: analyse each labelled snapshot (like `report`) and
//! show them side by side (`present::compare`).

use std::path::PathBuf;

use super::{CommonArgs, ReportFormat, emit};
use crate::present::compare::{self, Side};

pub(super) fn run(labels: Vec<(String, PathBuf)>, format: ReportFormat, common: CommonArgs) -> i32 {
    if labels.len() < 2 {
        eprintln!(
            "memlsp: compare --label needs two or more labelled snapshots (--label \"no AC\"=a.pickle --label AC=b.pickle), got {}",
            labels.len()
        );
        return 2;
    }
    let opts = common.options(super::absolute(".".as_ref()));
    let mut reports = Vec::with_capacity(labels.len());
    for (name, path) in &labels {
        match crate::analyze::run_file(path, &opts) {
            Ok(r) if matches!(r.engine, crate::report::Engine::Torch(_)) => reports.push(r),
            Ok(_) => {
                eprintln!(
                    "memlsp: {}: label `{name}`: compare --label takes PyTorch snapshots",
                    path.display()
                );
                return 2;
            }
            Err(e) => {
                eprintln!("memlsp: {e}");
                return 2;
            }
        }
    }
    let sides: Vec<Side> = labels
        .iter()
        .zip(&reports)
        .map(|((label, _), report)| Side { label, report })
        .collect();
    let c = compare::compare(&sides);
    emit(&match format {
        ReportFormat::Text => compare::text(&c),
        ReportFormat::Json => crate::present::json::render(&compare::document(&c)),
        ReportFormat::Html => compare::html(&c),
    });
    0
}
