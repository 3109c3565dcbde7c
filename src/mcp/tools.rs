//! The tools: their arguments (whose JSON Schema is the tool's `inputSchema`), and what each does,
//! synchronously, on a blocking thread. Each answer is the JSON the other front ends write
//! (`present::json`) or a part of it, plus a few lines of text for the agent to read first.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::confine::{Meter, Roots};
use crate::analyze::{self, Verdict};
use crate::baseline::{self, CompareOptions};
use crate::error::{CaptureError, ErrorKind};
use crate::findings::{Code, Finding, Location, Severity};
use crate::options::{Cancel, Options};
use crate::present::json as doc;
use crate::present::mcp_text;
use crate::report::{CaptureReport, Engine};
use crate::source::locate::Locator;
use crate::torch::replay::fit_sites;

/// The tools, in the order `tools/list` gives them.
pub(super) const NAMES: &[&str] = &[
    "analyze",
    "explain_line",
    "diff",
    "compare_ranks",
    "check_baseline",
    "fit",
    "trend",
];

/// What a call may use besides its arguments.
pub(super) struct Ctx {
    /// The server's directory: the workspace when a call names none.
    pub cwd: PathBuf,
    /// Raised when the client cancels the request, or the call runs out of time.
    pub cancel: Cancel,
    pub cache: Arc<Cache>,
    /// Where the call may read.
    pub roots: Arc<Roots>,
    /// What the call may spend.
    pub meter: Meter,
}

/// A tool's answer.
pub(super) struct Output {
    /// The structured content.
    pub structured: Value,
    /// A few lines of text: the headline first.
    pub summary: String,
}

/// Engine reports of the workspace's captures by path, valid while the file's modification time
/// and size are unchanged (`explain_line` looks at every capture on every call).
#[derive(Default)]
pub(super) struct Cache(Mutex<HashMap<PathBuf, Cached>>);

/// A capture's modification time and size when it was analysed, and its engine report.
type Cached = (Option<SystemTime>, u64, CaptureReport);

impl Cache {
    /// The engine report of `path` (not located), analysed with default options unless cached.
    fn report(&self, path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
        let meta = std::fs::metadata(path).map_err(|e| CaptureError::io(path, &e))?;
        let stamp = (meta.modified().ok(), meta.len());
        if let Ok(map) = self.0.lock()
            && let Some((m, l, r)) = map.get(path)
            && (*m, *l) == stamp
            && m.is_some()
        {
            return Ok(r.clone());
        }
        let report = analyze::analyze_file(path, opts)?;
        if let Ok(mut map) = self.0.lock() {
            map.insert(path.to_path_buf(), (stamp.0, stamp.1, report.clone()));
        }
        Ok(report)
    }
}

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct AnalyzeArgs {
    /// Capture file (.pickle, .pkl, *snapshot*.json, .xplane.pb) or capture directory (per-rank
    /// snapshots, plugins/profile/<run>/)
    path: PathBuf,
    /// JAX: the module to analyse, as xprof writes it (`jit_train_step(34)`) or the bare name
    module: Option<String>,
    /// Number of top sites to list (default 10)
    top: Option<usize>,
    /// Directory source paths are resolved against and relative paths are taken from (default:
    /// the server's current directory)
    workspace: Option<PathBuf>,
    /// PyTorch: categories of live memory at the peak, `NAME=REGEX` over frames'
    /// `filename:function` (as `report --category`; `torch.categories[].custom`)
    #[serde(default)]
    categories: Vec<String>,
    /// PyTorch: analyse only entries `A..B` of each device's trace (indices, or seconds with an
    /// `s`: "2s..4.5s"), as `report --range`
    range: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct ExplainLineArgs {
    /// The Python file (absolute, or relative to the workspace)
    file: PathBuf,
    /// 1-based line number
    line: u32,
    /// Workspace scanned for captures like `memlsp --check` does (default: the server's current
    /// directory)
    workspace: Option<PathBuf>,
}

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct FitArgs {
    /// A PyTorch snapshot recorded with memory history
    path: PathBuf,
    /// A device to replay on: bytes, a size ("24GiB") or a GPU ("A100-40GB", "H100", "T4", …,
    /// its memory less `reserve`)
    on: Option<String>,
    /// Memory the CUDA context takes on a named GPU (default "512MiB")
    reserve: Option<String>,
    /// Directory relative paths are taken from (default: the server's current directory)
    workspace: Option<PathBuf>,
}

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct DiffArgs {
    /// The earlier PyTorch snapshot of the run
    earlier: PathBuf,
    /// The later PyTorch snapshot of the same run: the report is about it
    later: PathBuf,
    /// Directory source paths are resolved against (default: the server's current directory)
    workspace: Option<PathBuf>,
}

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct CompareRanksArgs {
    /// Directory holding one PyTorch snapshot per rank
    dir: PathBuf,
    /// Directory source paths are resolved against (default: the server's current directory)
    workspace: Option<PathBuf>,
}

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct CheckBaselineArgs {
    /// Capture files or directories (scanned like `memlsp --check`); empty: the workspace
    #[serde(default)]
    paths: Vec<PathBuf>,
    /// The baseline file written by `memlsp baseline PATH… -o FILE`
    baseline: PathBuf,
    /// Growth allowed before BL001: "5%" (the default), "0.5%", or a number (≥ 1 a percentage,
    /// below 1 a fraction)
    max_growth: Option<Growth>,
    /// Also compare timing-dependent numbers (runtime peaks, reserved bytes)
    #[serde(default)]
    timing: bool,
    /// Lowest severity that fails the check: error (the default: BL001 and OOM causes), warning,
    /// information, hint
    fail_on: Option<String>,
    /// Directory source paths are resolved against (default: the server's current directory)
    workspace: Option<PathBuf>,
}

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(untagged)]
enum Growth {
    Text(String),
    Number(f64),
}

/// The tool list.
pub(super) fn list() -> Vec<Tool> {
    vec![
        tool::<AnalyzeArgs>(
            "analyze",
            "Analyse one GPU memory capture (PyTorch snapshot, JAX .xplane.pb) or a capture directory: \
             the document of `memlsp report PATH --format json` (headline, totals, top sites with \
             their Python lines, findings with labelled evidence and fixes), located against the \
             workspace.",
        ),
        tool::<ExplainLineArgs>(
            "explain_line",
            "What the captures of the workspace (found like `memlsp --check` finds them) say about \
             one line of a Python file: the findings and top sites located there, each with its \
             capture and labelled evidence.",
        ),
        tool::<DiffArgs>(
            "diff",
            "Compare two PyTorch snapshots of one run (`memlsp report EARLIER --diff LATER`): the \
             sites whose live bytes and block counts grew (PT011), in the later snapshot's report.",
        ),
        tool::<CompareRanksArgs>(
            "compare_ranks",
            "Compare per-rank PyTorch snapshots in a directory (`memlsp report DIR`): one row per \
             rank (allocated, reserved, peak, OOMs, top site), the imbalance, and each rank's \
             headline.",
        ),
        tool::<CheckBaselineArgs>(
            "check_baseline",
            "Check captures against a baseline recorded by `memlsp baseline` (`memlsp --check \
             PATHS --baseline FILE`): whether the check passes (the exit-status rule, failing on \
             errors by default), the BL001 findings on the lines where memory grew, and what was \
             compared.",
        ),
        tool::<FitArgs>(
            "fit",
            "Will a PyTorch capture fit (`memlsp fit PATH --on CAPACITY --format json`): per device, \
             the smallest device memory on which the recorded requests run without an OOM \
             (simulated through the allocator replay, exact to 2 MiB), the same with \
             expandable_segments:True and the best max_split_size_mb, and on `on`: fits with its \
             spare, or the first failing request with its Python line and what was live.",
        ),
        tool::<super::views::TrendArgs>("trend", super::views::TREND),
    ]
}

fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    Tool::new(name, description, JsonObject::new())
        .with_input_schema::<T>()
        .annotate(
            ToolAnnotations::new()
                .read_only(true)
                .destructive(false)
                .idempotent(true)
                .open_world(false),
        )
}

/// Run tool `name`; `Err` is the one-line message of a tool error.
pub(super) fn call(name: &str, args: JsonObject, ctx: &Ctx) -> Result<Output, String> {
    let out = match name {
        "analyze" => analyze(parse(name, args)?, ctx),
        "explain_line" => explain_line(parse(name, args)?, ctx),
        "diff" => diff(parse(name, args)?, ctx),
        "compare_ranks" => compare_ranks(parse(name, args)?, ctx),
        "check_baseline" => check_baseline(parse(name, args)?, ctx),
        "fit" => fit(parse(name, args)?, ctx),
        "trend" => trend(parse(name, args)?, ctx),
        _ => Err(format!("unknown tool `{name}`")),
    };
    if ctx.meter.expired() {
        // A scan answers with what it analysed in time (its `budget.cut` says so); anything
        // else is the budget's message.
        return match out {
            Ok(o) if o.structured["budget"]["cut"].is_string() => Ok(o),
            _ => Err(ctx.meter.time_message()),
        };
    }
    if ctx.cancel.is_cancelled() {
        return Err("the request was cancelled".into());
    }
    out
}

fn parse<T: DeserializeOwned>(tool: &str, args: JsonObject) -> Result<T, String> {
    serde_json::from_value(Value::Object(args)).map_err(|e| format!("{tool}: bad arguments: {e}"))
}

impl Ctx {
    /// The workspace a call names (relative to the server's directory), else the server's;
    /// resolved, inside the roots.
    fn workspace(&self, given: Option<&Path>) -> Result<PathBuf, String> {
        // Checked resolved; used as spelt, so the answers show the paths the agent gave.
        let ws = match given {
            Some(w) => std::path::absolute(self.cwd.join(w)).unwrap_or_else(|_| self.cwd.join(w)),
            None => self.cwd.clone(),
        };
        self.roots.check(&ws)?;
        if ws.is_dir() {
            Ok(ws)
        } else {
            Err(format!(
                "{}: the workspace is not a directory",
                ws.display()
            ))
        }
    }

    /// The options of one run over workspace `ws`, with this call's cancel flag.
    fn options(&self, ws: &Path) -> Options {
        let mut opts = Options::default();
        opts.locate.workspace = vec![ws.to_path_buf()];
        opts.decode.cancel = self.cancel.clone();
        opts
    }
}

/// `p` taken from the workspace when relative.
fn input(ws: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        ws.join(p)
    }
}

impl Ctx {
    /// Argument `p` (relative to the workspace), when it resolves inside the roots.
    fn path(&self, ws: &Path, p: &Path) -> Result<PathBuf, String> {
        let p = input(ws, p);
        self.roots.check(&p)?;
        Ok(p)
    }

    /// The captures a call about one capture or one run reads (`path`, or those of directory
    /// `path`): every one inside the roots and all of them within the budget, else refused.
    fn admit(&self, path: &Path) -> Result<(), String> {
        // The listing `analyze::run` reads a directory with, so every file it will read is
        // checked (links that a listing follows included).
        let files = if path.is_dir() {
            analyze::captures_in_dir(path)
        } else {
            vec![path.to_path_buf()]
        };
        let mut inside = Vec::with_capacity(files.len());
        for f in &files {
            inside.push(self.roots.check(f)?);
        }
        self.meter.admit_all(&inside)
    }

    /// The captures of a scan: those inside the roots that fit the budget, and what was left
    /// out (outside the roots, over the budget).
    fn scan(&self, found: Vec<PathBuf>) -> (Vec<PathBuf>, Vec<String>, Option<String>) {
        let mut refused = Vec::new();
        let mut inside = Vec::new();
        for f in found {
            match self.roots.check(&f) {
                Ok(_) => inside.push(f),
                Err(e) => refused.push(e),
            }
        }
        let (kept, cut) = self.meter.admit_some(inside);
        (kept, refused, cut)
    }

    /// The `budget` member of a scan's answer: the limits, what was analysed, and why it was cut
    /// short when it was (`None` then nothing was left out).
    fn budget(&self, analysed: usize, cut: Option<String>, refused: &[String]) -> Value {
        let mut b = json!({"limits": self.meter.budget.json(), "captures_analysed": analysed});
        if let Some(c) = cut {
            b["cut"] = json!(c);
        }
        if !refused.is_empty() {
            b["outside_roots"] = json!(refused);
        }
        b
    }

    /// Why a scan stopped early for time, if it did.
    fn time_cut(&self, analysed: usize, total: usize) -> Option<String> {
        self.meter.expired().then(|| {
            format!(
                "cut short: stopped at the time budget of {} s per call (--budget-seconds) with \
                 {analysed} of {total} captures analysed",
                self.meter.budget.seconds
            )
        })
    }
}

fn analyze(a: AnalyzeArgs, ctx: &Ctx) -> Result<Output, String> {
    let ws = ctx.workspace(a.workspace.as_deref())?;
    let mut opts = ctx.options(&ws);
    if let Some(top) = a.top {
        opts.analysis.top = top;
    }
    opts.analysis.module = a.module;
    super::views::apply(&mut opts, &a.categories, a.range.as_deref())?;
    let path = ctx.path(&ws, &a.path)?;
    ctx.admit(&path)?;
    let reports = analyze::run(&path, &opts).map_err(|e| e.to_string())?;
    Ok(Output {
        structured: doc::document(&reports, &[]),
        summary: mcp_text::summary(&reports),
    })
}

fn fit(a: FitArgs, ctx: &Ctx) -> Result<Output, String> {
    use crate::present::capacity;
    use crate::present::fit as show;
    let ws = ctx.workspace(a.workspace.as_deref())?;
    let reserve = match &a.reserve {
        Some(r) => capacity::parse_size(r)
            .ok_or_else(|| format!("fit: reserve `{r}` is not a size (e.g. 512MiB)"))?,
        None => capacity::DEFAULT_CONTEXT_RESERVE,
    };
    let cap =
        a.on.as_deref()
            .map(|c| capacity::parse(c, reserve))
            .transpose()
            .map_err(|e| format!("fit: {e}"))?;
    let path = input(&ws, &a.path);
    let opts = ctx.options(&ws);
    let snap = crate::torch::load::load_snapshot(&path, &opts.decode).map_err(|e| e.to_string())?;
    let fit_opts = crate::torch::replay::fit::FitOptions {
        capacity: cap.as_ref().map(|c| c.bytes),
        ..Default::default()
    };
    let devices = fit_sites::capture_fit(
        &snap,
        &crate::torch::replay::Replays::new(),
        &opts.analysis.frames,
        &fit_opts,
    );
    let file = path.display().to_string();
    let shown = cap.as_ref().map(|c| c.shown.as_str());
    let entries: Vec<fit_sites::FitEntry> = devices
        .iter()
        .map(|d| fit_sites::FitEntry::of(d, shown))
        .collect();
    let captures = [show::FitCapture {
        file: &file,
        devices: &entries,
    }];
    Ok(Output {
        structured: show::fit_document(&captures),
        summary: show::fit_text(&captures),
    })
}

fn diff(a: DiffArgs, ctx: &Ctx) -> Result<Output, String> {
    let ws = ctx.workspace(a.workspace.as_deref())?;
    let opts = ctx.options(&ws);
    let (earlier, later) = (ctx.path(&ws, &a.earlier)?, ctx.path(&ws, &a.later)?);
    ctx.meter.admit_all(&[earlier.clone(), later.clone()])?;
    let report = analyze::run_diff(&earlier, &later, &opts).map_err(|e| e.to_string())?;
    let reports = [report];
    Ok(Output {
        structured: doc::document(&reports, &[]),
        summary: mcp_text::summary(&reports),
    })
}

fn trend(a: super::views::TrendArgs, ctx: &Ctx) -> Result<Output, String> {
    if let Some(e) = super::views::too_few(a.paths.len()) {
        return Err(e);
    }
    let ws = ctx.workspace(a.workspace.as_deref())?;
    let opts = ctx.options(&ws);
    let paths = a
        .paths
        .iter()
        .map(|p| ctx.path(&ws, p))
        .collect::<Result<Vec<_>, _>>()?;
    ctx.meter.admit_all(&paths)?;
    let reports = [analyze::run_trend(&paths, &opts).map_err(|e| e.to_string())?];
    let mut text = mcp_text::summary(&reports);
    if let Some(line) = mcp_text::trend_line(&reports) {
        text = format!("{text}\n{line}");
    }
    Ok(Output {
        structured: doc::document(&reports, &[]),
        summary: text,
    })
}

fn compare_ranks(a: CompareRanksArgs, ctx: &Ctx) -> Result<Output, String> {
    let ws = ctx.workspace(a.workspace.as_deref())?;
    let dir = ctx.path(&ws, &a.dir)?;
    if !dir.is_dir() {
        return Err(format!(
            "{}: not a directory (compare_ranks takes a directory with one PyTorch snapshot per rank)",
            dir.display()
        ));
    }
    ctx.admit(&dir)?;
    let reports = analyze::run(&dir, &ctx.options(&ws)).map_err(|e| e.to_string())?;
    let ranks: Vec<(&CaptureReport, usize, &crate::torch::ranks::RankComparison)> = reports
        .iter()
        .filter_map(|r| match &r.engine {
            Engine::Torch(t) => Some((r, t.rank?, t.rank_comparison.as_deref()?)),
            Engine::Xla(_) => None,
        })
        .collect();
    let Some((_, _, comparison)) = ranks.first() else {
        return Err(format!(
            "{}: fewer than two PyTorch snapshots in this directory; compare_ranks needs one per rank \
             (use analyze for a single capture)",
            dir.display()
        ));
    };
    let shown: Vec<(&CaptureReport, usize)> = ranks.iter().map(|(r, k, _)| (*r, *k)).collect();
    let text = mcp_text::ranks(comparison.imbalance, &shown);
    Ok(Output {
        structured: json!({
            "memlsp": doc::VERSION,
            "dir": dir.display().to_string(),
            "comparison": comparison,
            "ranks": ranks.iter().map(|(r, rank, _)| json!({
                "rank": rank,
                "path": r.display_path(),
                "headline": r.headline(),
                "findings": r.findings.iter().map(|f| f.code).collect::<Vec<Code>>(),
            })).collect::<Vec<_>>(),
        }),
        summary: text,
    })
}

fn explain_line(a: ExplainLineArgs, ctx: &Ctx) -> Result<Output, String> {
    let ws = ctx.workspace(a.workspace.as_deref())?;
    let file = ctx.path(&ws, &a.file)?;
    if !file.is_file() {
        return Err(format!("{}: no such file", file.display()));
    }
    let want = canonical(&file);
    let shown = file
        .strip_prefix(&ws)
        .map_or_else(|_| file.display().to_string(), |p| p.display().to_string());
    let (found, mut errors) = analyze::collect_captures(std::slice::from_ref(&ws));
    if found.is_empty()
        && let Some(e) = errors.first()
    {
        return Err(e.to_string());
    }
    let (files, refused, mut cut) = ctx.scan(found);
    let mut analysed = 0;
    let opts = ctx.options(&ws);
    let locator = Locator::new(&opts.locate, opts.analysis.frames.clone());
    let here = |l: Option<&Location>| {
        l.is_some_and(|l| l.line == a.line && l.local().is_some_and(|p| canonical(p) == want))
    };
    let mut hits = Vec::new();
    let mut text = Vec::new();
    for path in &files {
        let mut report = match ctx.cache.report(path, &opts) {
            Ok(r) => r,
            Err(e) if e.kind == ErrorKind::Cancelled && ctx.meter.expired() => {
                cut = ctx.time_cut(analysed, files.len());
                break;
            }
            Err(e) if e.kind == ErrorKind::Cancelled => return Err(e.to_string()),
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        analysed += 1;
        locator.locate(&mut report);
        let findings: Vec<&Finding> = report
            .findings
            .iter()
            .filter(|f| here(f.location.as_ref()))
            .collect();
        let sites: Vec<_> = report
            .sites
            .iter()
            .filter(|s| here(s.location.as_ref()))
            .collect();
        if findings.is_empty() && sites.is_empty() {
            continue;
        }
        let capture = report.display_path();
        text.push(mcp_text::explain_line_hit(&mcp_text::LineHit {
            capture: &capture,
            findings: &findings,
            sites: &sites,
        }));
        hits.push(json!({
            "path": capture,
            "kind": report.kind().as_str(),
            "headline": report.headline(),
            "findings": findings,
            "sites": sites,
        }));
    }
    let notes: Vec<&String> = cut.iter().chain(&refused).collect();
    let summary = mcp_text::explain_line(&shown, a.line, analysed, hits.len(), &notes, &text);
    let mut structured = json!({
        "memlsp": doc::VERSION,
        "file": shown,
        "line": a.line,
        "workspace": ws.display().to_string(),
        "captures_scanned": analysed,
        "captures": hits,
        "budget": ctx.budget(analysed, cut, &refused),
    });
    if !errors.is_empty() {
        structured["errors"] = errors.iter().map(doc::error).collect();
    }
    Ok(Output {
        structured,
        summary,
    })
}

fn check_baseline(a: CheckBaselineArgs, ctx: &Ctx) -> Result<Output, String> {
    let ws = ctx.workspace(a.workspace.as_deref())?;
    let file = ctx.path(&ws, &a.baseline)?;
    let base = std::fs::read_to_string(&file)
        .map_err(|e| format!("{}: cannot read the baseline ({e})", file.display()))
        .and_then(|t| baseline::parse(&file, &t))?;
    let max_growth = match &a.max_growth {
        None => 0.05,
        Some(Growth::Text(s)) => baseline::parse_growth(s)?,
        Some(Growth::Number(n)) => baseline::parse_growth(&n.to_string())?,
    };
    let fail_on = match &a.fail_on {
        None => Severity::Error,
        Some(s) => Severity::parse(s).ok_or_else(|| {
            format!("fail_on `{s}` is not a severity (error, warning, information, hint)")
        })?,
    };
    let paths: Vec<PathBuf> = if a.paths.is_empty() {
        vec![ws.clone()]
    } else {
        a.paths
            .iter()
            .map(|p| ctx.path(&ws, p))
            .collect::<Result<_, _>>()?
    };
    let opts = ctx.options(&ws);
    let (found, mut errors) = analyze::collect_captures(&paths);
    let (files, refused, mut cut) = ctx.scan(found);
    let walk = analyze::WorkspaceWalk::start(&opts);
    let (mut reports, failed) = analyze::analyze_files(&files, &opts, |_| {});
    if ctx.meter.expired() {
        // What the time budget stopped is not unreadable: said once, as the cut.
        cut = ctx.time_cut(reports.len(), files.len());
        errors.extend(
            failed
                .into_iter()
                .filter(|e| e.kind != ErrorKind::Cancelled),
        );
    } else {
        errors.extend(failed);
    }
    let compare = CompareOptions {
        max_growth,
        timing: a.timing,
    };
    let outcome = baseline::compare(&mut reports, &base, &compare);
    walk.locate(&mut reports, &opts);
    let verdict = analyze::verdict(&reports, !errors.is_empty(), fail_on);
    let mut bl001 = Vec::new();
    for r in &reports {
        for f in r.findings.iter().filter(|f| f.code == Code::BL001) {
            let mut v = serde_json::to_value(f).unwrap_or(Value::Null);
            v["capture"] = json!(r.display_path());
            bl001.push(v);
        }
    }
    let verdict_str = match verdict {
        Verdict::Clean => "clean",
        Verdict::Findings => "findings",
        Verdict::Unreadable => "unreadable",
    };
    // A check the budget cut short has not passed: not everything was looked at.
    let passed = verdict == Verdict::Clean && cut.is_none();
    let notes: Vec<&String> = cut.iter().chain(&refused).collect();
    let baseline_shown = file.display().to_string();
    let text = mcp_text::baseline_check(&mcp_text::BaselineCheck {
        passed,
        reports: &reports,
        baseline: &baseline_shown,
        compared: outcome.compared,
        max_growth,
        fail_on,
        errors: &errors,
        notes: &notes,
    });
    let mut structured = json!({
        "memlsp": doc::VERSION,
        "passed": passed,
        "verdict": verdict_str,
        "fail_on": fail_on.as_str(),
        "baseline": file.display().to_string(),
        "max_growth": max_growth,
        "timing": a.timing,
        "compared": outcome.compared,
        "timing_skipped": outcome.timing_skipped,
        "new_keys": outcome.new_keys,
        "missing_keys": outcome.missing_keys,
        "findings": bl001,
        "captures": reports.iter().map(|r| json!({
            "path": r.display_path(),
            "kind": r.kind().as_str(),
            "headline": r.headline(),
        })).collect::<Vec<_>>(),
        "budget": ctx.budget(reports.len(), cut, &refused),
    });
    if !errors.is_empty() {
        structured["errors"] = errors.iter().map(doc::error).collect();
    }
    Ok(Output {
        structured,
        summary: text,
    })
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}
