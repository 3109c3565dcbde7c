//! `memlsp compare SUMMARY.json… | DIR`: the comparison of ranks (and PT012, rank skew) from the
//! `report --format json` summaries of each rank alone — so a job of many ranks is analysed where
//! its snapshots were written, one task per rank, and only summaries move
//! (`docs/RANKS.md` has a Slurm and a Ray recipe).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::report::{CaptureReport, Engine};
use crate::torch::ranks::{RankComparison, RankRow, RankSummary, rank_in_name};

use super::{CommonArgs, ReportFormat, emit, json as js};

pub(super) struct CompareArgs {
    pub paths: Vec<PathBuf>,
    pub format: ReportFormat,
    pub common: CommonArgs,
}

/// One rank read from a summary: its capture path and what it contributes.
struct Ranked {
    path: PathBuf,
    summary: RankSummary,
}

pub(super) fn run(args: CompareArgs) -> i32 {
    let mut files = Vec::new();
    for p in &args.paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = match std::fs::read_dir(p) {
                Ok(rd) => rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|f| f.extension().is_some_and(|x| x == "json"))
                    .collect(),
                Err(e) => {
                    eprintln!("memlsp: {}: cannot read the directory ({e})", p.display());
                    return 2;
                }
            };
            found.sort();
            files.extend(found.into_iter().map(|f| (f, true)));
        } else {
            files.push((p.clone(), false));
        }
    }
    // A summary of a folder that cannot be read is named on stderr and the others are compared
    // (exit 2, as `--check` when a capture could not be read); a file named on the command line
    // must be read.
    let mut ranked: Vec<Ranked> = Vec::new();
    let mut unreadable = 0;
    for (f, in_dir) in &files {
        match read_summary(f) {
            Ok(mut r) => ranked.append(&mut r),
            Err(e) => {
                eprintln!("memlsp: {e}");
                if !in_dir {
                    return 2;
                }
                unreadable += 1;
            }
        }
    }
    if ranked.len() < 2 {
        eprintln!(
            "memlsp: compare needs the summaries of at least two PyTorch snapshots (memlsp report SNAPSHOT --format json -o rankN.json), got {}",
            ranked.len()
        );
        return 2;
    }
    // Rank order: the number in the capture's name, else the order given.
    ranked.sort_by_key(|r| rank_in_name(&r.path).unwrap_or(usize::MAX));
    let rows: Vec<RankRow> = ranked
        .iter()
        .enumerate()
        .map(|(i, r)| RankRow::of(&r.path, rank_in_name(&r.path).unwrap_or(i), &r.summary))
        .collect();
    let cmp = std::sync::Arc::new(RankComparison::with_rows(rows));
    let workspace = super::absolute(".".as_ref());
    let opts = args.common.options(workspace);
    // One report per rank holding its PT012 findings; the engine part is the comparison only.
    let blank = {
        let snap = crate::torch::model::Snapshot::default();
        let a = crate::torch::analyse(&snap, &Default::default());
        crate::torch::summary::summarize(&snap, &a, 0)
    };
    let mut reports: Vec<CaptureReport> = ranked
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut findings = Vec::new();
            cmp.annotate(i, &mut findings);
            let mut summary = blank.clone();
            summary.rank = Some(cmp.rows[i].rank);
            summary.rank_comparison = Some(cmp.clone());
            CaptureReport {
                path: r.path.clone(),
                engine: Engine::Torch(Box::new(summary)),
                sites: Vec::new(),
                findings,
                shown_path: None,
            }
        })
        .collect();
    crate::analyze::locate(&mut reports, &opts);
    let out = match args.format {
        ReportFormat::Text => crate::present::text::rank_comparison(&cmp, &reports),
        ReportFormat::Json => js::render(&js::rank_comparison(&cmp, &reports)),
        ReportFormat::Html => {
            eprintln!("memlsp: compare writes text or json");
            return 2;
        }
    };
    emit(&out);
    if unreadable > 0 {
        eprintln!(
            "memlsp: {unreadable} summary file(s) could not be read; the comparison covers the other {} rank(s)",
            ranked.len()
        );
        return 2;
    }
    0
}

/// The PyTorch captures of one `report --format json` document.
fn read_summary(f: &Path) -> Result<Vec<Ranked>, String> {
    let text =
        std::fs::read_to_string(f).map_err(|e| format!("{}: cannot read ({e})", f.display()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: at byte {}: not JSON ({e}); pass the output of `memlsp report SNAPSHOT --format json`",
            f.display(),
            crate::error::json_error_offset(text.as_bytes(), &e)
        )
    })?;
    let caps = doc["captures"].as_array().ok_or_else(|| {
        format!(
            "{}: no \"captures\": not a `memlsp report --format json` summary",
            f.display()
        )
    })?;
    let mut out = Vec::new();
    for c in caps {
        let Some(rs) = c.get("torch").and_then(|t| t.get("rank_summary")) else {
            continue;
        };
        let summary: RankSummary = serde_json::from_value(rs.clone()).map_err(|e| {
            format!(
                "{}: torch.rank_summary: {e} (written by another memlsp version? write it again)",
                f.display()
            )
        })?;
        let path = PathBuf::from(c["path"].as_str().unwrap_or_default());
        out.push(Ranked { path, summary });
    }
    if out.is_empty() {
        return Err(format!(
            "{}: holds no PyTorch snapshot summary (torch.rank_summary)",
            f.display()
        ));
    }
    Ok(out)
}
