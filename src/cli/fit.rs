//! `memlsp fit CAPTURE` (the smallest device a recorded program needs, and what happens on a
//! given one) and `memlsp predict NAME=VALUE:FILE… --at NAME=VALUE` (a larger run from smaller
//! ones). Exit status: 0 done (and, with `--on`, it fits), 1 it does not fit on `--on`, 2 a
//! capture could not be read, the captures do not match, or a usage error.

use std::path::PathBuf;

use clap::Args;

use super::{CommonArgs, ReportFormat, emit, usage};
use crate::present::capacity::{self, Capacity, DEFAULT_CONTEXT_RESERVE};
use crate::present::fit::{self, FitCapture, PredictInputs};
use crate::torch::replay::Replays;
use crate::torch::replay::fit::FitOptions;
use crate::torch::replay::fit_sites;
use crate::torch::replay::predict::Point;

#[derive(Args, Debug)]
pub(super) struct FitArgs {
    /// PyTorch snapshot (.pickle, .pkl, *snapshot*.json) recorded with memory history
    #[arg(value_name = "CAPTURE")]
    file: PathBuf,
    /// Replay on this device: bytes, a size (24GiB) or a GPU (T4, L4, A10, A100-40GB, A100-80GB,
    /// H100, H200, B200, MI300X: its memory less --reserve)
    #[arg(long, value_name = "CAPACITY")]
    on: Option<String>,
    /// Memory the CUDA context takes on a GPU named by --on [default: 512MiB]
    #[arg(long, value_name = "SIZE")]
    reserve: Option<String>,
    /// Output format
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = ReportFormat::Text)]
    format: ReportFormat,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args, Debug)]
pub(super) struct PredictArgs {
    /// Captures of the same program at other sizes: NAME=VALUE:FILE (two or more)
    #[arg(value_name = "NAME=VALUE:FILE", required = true, num_args = 2..)]
    points: Vec<String>,
    /// The size to predict: NAME=VALUE
    #[arg(long, value_name = "NAME=VALUE")]
    at: String,
    /// Also replay on this device and find the largest VALUE that fits (see `fit --on`)
    #[arg(long, value_name = "CAPACITY")]
    on: Option<String>,
    /// Memory the CUDA context takes on a GPU named by --on [default: 512MiB]
    #[arg(long, value_name = "SIZE")]
    reserve: Option<String>,
    /// Output format
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = ReportFormat::Text)]
    format: ReportFormat,
    #[command(flatten)]
    common: CommonArgs,
}

fn capacity_of(on: &Option<String>, reserve: &Option<String>) -> Result<Option<Capacity>, String> {
    let reserve = match reserve {
        Some(r) => capacity::parse_size(r)
            .ok_or_else(|| format!("--reserve `{r}` is not a size (e.g. 512MiB, 1G)"))?,
        None => DEFAULT_CONTEXT_RESERVE,
    };
    on.as_deref()
        .map(|s| capacity::parse(s, reserve).map_err(|e| format!("--on: {e}")))
        .transpose()
}

fn load(path: &std::path::Path, common: &CommonArgs) -> Result<crate::torch::model::Snapshot, i32> {
    let opts = common.options(super::absolute(".".as_ref()));
    crate::torch::load::load_snapshot(path, &opts.decode).map_err(|e| {
        eprintln!("memlsp: {e}");
        2
    })
}

pub(super) fn run_fit(args: FitArgs) -> i32 {
    let cap = match capacity_of(&args.on, &args.reserve) {
        Ok(c) => c,
        Err(e) => return usage(&e),
    };
    let snap = match load(&args.file, &args.common) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let frames = crate::frames::FrameFilter::new(args.common.exclude_frames.clone());
    let opts = FitOptions {
        capacity: cap.as_ref().map(|c| c.bytes),
        ..FitOptions::default()
    };
    let devices = fit_sites::capture_fit(&snap, &Replays::new(), &frames, &opts);
    let file = args.file.display().to_string();
    let shown = cap.as_ref().map(|c| c.shown.as_str());
    let entries: Vec<fit_sites::FitEntry> = devices
        .iter()
        .map(|d| fit_sites::FitEntry::of(d, shown))
        .collect();
    let captures = [FitCapture {
        file: &file,
        devices: &entries,
    }];
    emit(&match args.format {
        ReportFormat::Text => fit::fit_text(&captures),
        ReportFormat::Json => fit::fit_json(&captures),
        ReportFormat::Html => fit::page(&format!("memlsp fit {file}"), &fit::fit_text(&captures)),
    });
    let fails = devices
        .iter()
        .any(|d| d.fit.on.as_ref().is_some_and(|o| !o.fits));
    i32::from(fails)
}

/// `NAME=VALUE` → (name, value).
fn name_value(s: &str) -> Option<(String, f64)> {
    let (n, v) = s.split_once('=')?;
    let v: f64 = v.trim().parse().ok()?;
    (!n.trim().is_empty() && v.is_finite()).then(|| (n.trim().to_string(), v))
}

pub(super) fn run_predict(args: PredictArgs) -> i32 {
    let Some((name, at)) = name_value(&args.at) else {
        return usage(&format!(
            "--at `{}` is not NAME=VALUE (e.g. ctx=512)",
            args.at
        ));
    };
    let cap = match capacity_of(&args.on, &args.reserve) {
        Ok(c) => c,
        Err(e) => return usage(&e),
    };
    let mut parsed: Vec<(f64, PathBuf)> = Vec::new();
    for p in &args.points {
        let nv = p
            .split_once(':')
            .and_then(|(nv, file)| Some((name_value(nv)?, file)));
        match nv {
            Some(((n, v), file)) if n == name && !file.is_empty() => {
                parsed.push((v, PathBuf::from(file)))
            }
            Some(((n, _), _)) if n != name => {
                return usage(&format!(
                    "`{p}` names `{n}` but --at names `{name}`: give one parameter"
                ));
            }
            _ => {
                return usage(&format!(
                    "`{p}` is not NAME=VALUE:FILE (e.g. {name}=128:a.pickle)"
                ));
            }
        }
    }
    let mut snaps = Vec::new();
    for (_, f) in &parsed {
        match load(f, &args.common) {
            Ok(s) => snaps.push(s),
            Err(code) => return code,
        }
    }
    let points: Vec<Point> = parsed
        .iter()
        .zip(&snaps)
        .map(|((v, _), s)| Point { value: *v, snap: s })
        .collect();
    let frames = crate::frames::FrameFilter::new(args.common.exclude_frames.clone());
    let opts = FitOptions {
        capacity: cap.as_ref().map(|c| c.bytes),
        settings_trials: false,
        samples: 8,
    };
    let report = match fit_sites::predict_report(&points, &name, at, &frames, &opts) {
        Ok(r) => r,
        Err(m) => {
            eprintln!("memlsp: cannot predict: {}", m.0);
            return 2;
        }
    };
    let shown_points: Vec<(f64, String)> = parsed
        .iter()
        .map(|(v, f)| (*v, f.display().to_string()))
        .collect();
    let inputs = PredictInputs {
        points: &shown_points,
        capacity_shown: cap.as_ref().map(|c| c.shown.as_str()),
    };
    emit(&match args.format {
        ReportFormat::Text => fit::prediction_text(&report, &inputs),
        ReportFormat::Json => fit::prediction_json(&report, &inputs),
        ReportFormat::Html => fit::prediction_page(&report, &inputs),
    });
    i32::from(report.prediction.on.as_ref().is_some_and(|o| !o.fits))
}
