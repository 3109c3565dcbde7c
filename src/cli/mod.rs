//! Command-line front ends: `report`, `--check` and `baseline`; `lsp` and `mcp` start the servers.
//!
//! [`run`] parses the command line and returns the exit code instead of exiting (or the server to
//! start: `src/main.rs` starts it), so every path is testable: 0 = nothing at or above
//! `--fail-on`, 1 = findings, 2 = a capture could not be read or a usage error. Only the result
//! goes to stdout; errors are one line each on stderr.

mod check;
mod compare;
mod compare_labels;
mod fit;
#[cfg(test)]
mod presenter_tests;
mod progress;
mod report;

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::findings::Severity;
use crate::frames::FrameFilter;
use crate::options::Options;
use crate::present::json;

/// The version written into JSON and SARIF output.
pub use crate::present::json::VERSION;

#[derive(Parser, Debug)]
#[command(
    name = "memlsp",
    version,
    about = "GPU memory evidence (PyTorch snapshots, JAX/XLA captures) pinned to Python source lines",
    long_about = "GPU memory evidence (PyTorch CUDA snapshots, JAX/XLA .xplane.pb captures) pinned to \
                  Python source lines.\n\nWithout arguments memlsp runs the language server on stdio.",
    after_help = "Will it fit:\n  memlsp fit snapshot.pickle --on A100-40GB\n  memlsp predict \
                  ctx=128:a.pickle ctx=256:b.pickle --at ctx=512 --on 40GiB\n\n\
                  Exit status of --check: 0 no finding at or above --fail-on, 1 findings, \
                  2 a capture could not be read or a usage error."
)]
struct Cli {
    /// Check captures and report findings like a compiler (CI mode)
    #[arg(long)]
    check: bool,
    /// Capture files or directories to check [default: the workspace]
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Output format of --check
    #[arg(long, value_enum, value_name = "FORMAT")]
    format: Option<CheckFormat>,
    /// Lowest severity that makes --check exit 1: error, warning, information, hint
    #[arg(long, value_name = "SEVERITY", value_parser = parse_severity)]
    fail_on: Option<Severity>,
    /// Workspace root that source paths are resolved against [default: current directory]
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Compare with a stored baseline (`memlsp baseline`): a number that grew is a BL001 finding
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Growth allowed by --baseline before BL001 (e.g. 5%, 0.5%) [default: 5%]
    #[arg(long, value_name = "PERCENT", value_parser = crate::baseline::parse_growth)]
    max_growth: Option<f64>,
    /// With --baseline: also compare timing-dependent numbers (runtime peaks, reserved bytes)
    #[arg(long)]
    timing: bool,
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the language server on stdio (the default)
    Lsp {
        /// Accepted for clients that always pass it (stdio is the only transport)
        #[arg(long)]
        stdio: bool,
    },
    /// Print the full report of one capture (or a directory of per-rank snapshots)
    Report(ReportArgs),
    /// Record the deterministic numbers of captures as a baseline for `--check --baseline`
    Baseline(BaselineArgs),
    /// Compare ranks from their `report --format json` summaries (files or a directory of them)
    Compare(CompareCliArgs),
    /// Run the Model Context Protocol server on stdio (tools for coding agents)
    Mcp(McpArgs),
    /// The smallest device a PyTorch capture needs, and what happens on a given one (simulated)
    ///
    /// Example: memlsp fit snapshot.pickle --on A100-40GB
    #[command(
        after_help = "Example:\n  memlsp fit snapshot.pickle --on A100-40GB\n  memlsp fit snapshot.pickle --on 24GiB --format json\n\nExit status: 0 done (fits on --on), 1 does not fit on --on, 2 unreadable capture or usage error."
    )]
    Fit(fit::FitArgs),
    /// Predict a larger run from captures of the same program at smaller sizes (simulated)
    ///
    /// Example: memlsp predict ctx=128:a.pickle ctx=256:b.pickle --at ctx=512 --on 40GiB
    #[command(
        after_help = "Example:\n  memlsp predict ctx=128:a.pickle ctx=256:b.pickle --at ctx=512 --on 40GiB\n\nExit status: 0 done (fits on --on), 1 does not fit on --on, 2 the captures do not match (where, on stderr), unreadable capture or usage error."
    )]
    Predict(fit::PredictArgs),
}

/// `memlsp mcp`: where the tools may read and what one tool call may spend. Handed to the server
/// by the caller (`src/main.rs`); the defaults are the server's (`mcp::confine::Budget`).
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct McpArgs {
    /// Directory the tools may read under (repeatable; symlinks resolved) [default: the current directory]
    #[arg(long = "root", value_name = "DIR")]
    pub roots: Vec<PathBuf>,
    /// Let the tools read any path the user can read (no roots)
    #[arg(long)]
    pub allow_outside: bool,
    /// Most bytes of captures one tool call reads (e.g. 2G, 500M) [default: 8G]
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub budget_bytes: Option<u64>,
    /// Most captures one tool call analyses [default: 64]
    #[arg(long, value_name = "N")]
    pub budget_captures: Option<usize>,
    /// Most seconds one tool call runs [default: 300]
    #[arg(long, value_name = "SECONDS")]
    pub budget_seconds: Option<u64>,
}

#[derive(Args, Debug)]
struct CompareCliArgs {
    /// Summaries (`memlsp report SNAPSHOT --format json -o rankN.json`) or directories of them
    #[arg(value_name = "SUMMARY", required_unless_present = "labels")]
    paths: Vec<PathBuf>,
    /// A labelled PyTorch snapshot to compare side by side (repeatable, two or more; deltas are
    /// against the first), e.g. --label "no AC"=a.pickle --label AC=b.pickle
    #[arg(long = "label", value_name = "NAME=SNAPSHOT", value_parser = parse_label, conflicts_with = "paths")]
    labels: Vec<(String, PathBuf)>,
    /// Output format (text, json; html with --label)
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = ReportFormat::Text)]
    format: ReportFormat,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args, Debug)]
struct BaselineArgs {
    /// Capture files or directories (scanned like --check)
    #[arg(value_name = "PATH", required = true)]
    paths: Vec<PathBuf>,
    /// Write the baseline to FILE instead of stdout
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// Capture file (.pickle, .pkl, *snapshot*.json, .xplane.pb) or capture directory; with
    /// `--trend`, three or more snapshots of one run, oldest first
    #[arg(value_name = "FILE", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// PyTorch: the FILEs are snapshots of one run at successive steps, oldest first: the last
    /// one's report with the trend over all of them (docs/TREND.md)
    #[arg(long, conflicts_with = "diff")]
    trend: bool,
    /// A later snapshot of the same run: report what grew between FILE and LATER
    #[arg(long, value_name = "LATER")]
    diff: Option<PathBuf>,
    /// JAX: the module to analyse, as xprof writes it (`jit_train_step(36)`) or the bare name
    #[arg(long, value_name = "NAME")]
    module: Option<String>,
    /// Number of top sites to list
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// Keep only the newest N trace events per device
    #[arg(long, value_name = "N")]
    max_trace_events: Option<usize>,
    /// PyTorch: analyse only entries A..B of each device's trace (indices, or seconds from the
    /// trace start with an `s`: 2s..4.5s; either end may be left out)
    #[arg(long, value_name = "A..B", value_parser = crate::options::Range::parse)]
    range: Option<crate::options::Range>,
    /// Output format
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = ReportFormat::Text)]
    format: ReportFormat,
    /// Write the result to FILE instead of stdout
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// PyTorch: add the "will it fit" section (`memlsp fit`'s numbers, `torch.fit` in JSON)
    #[arg(long)]
    fit: bool,
    /// PyTorch: replay on this device too (bytes, 24GiB or a GPU, see `memlsp fit --on`): the
    /// section says whether it fits, and the first failing request is a PT017 finding
    #[arg(long, value_name = "CAPACITY")]
    on: Option<String>,
    /// Per-rank directories: snapshots analysed at once (peak memory is at most N snapshots'
    /// worth) [default: one per core]
    #[arg(long, short = 'j', value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    jobs: Option<u32>,
    #[command(flatten)]
    common: CommonArgs,
}

/// Options shared by `report` and `--check`.
#[derive(Args, Debug, Default)]
struct CommonArgs {
    /// Map a recorded path prefix to a local one (repeatable), e.g. /workspace/proj=.
    #[arg(long = "path-map", value_name = "FROM=TO", value_parser = parse_path_map)]
    path_map: Vec<PathMap>,
    /// Refuse capture files larger than this (bytes; K, M, G suffixes allowed)
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    max_file_bytes: Option<u64>,
    /// Refuse snapshots whose decoded model would hold more than this (bytes; K, M, G suffixes
    /// allowed) [default: 8 × the file's size, at least 64M]
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    max_model_bytes: Option<u64>,
    /// Frames whose path contains SUBSTR are not the user's (repeatable)
    #[arg(long = "exclude-frames", value_name = "SUBSTR")]
    exclude_frames: Vec<String>,
    /// A category of live memory at the peak (repeatable, first match wins): the blocks whose
    /// stack has a frame whose `filename:function` matches REGEX, e.g. optimizer=torch/optim/
    #[arg(long = "category", value_name = "NAME=REGEX", value_parser = crate::options::Category::parse)]
    categories: Vec<crate::options::Category>,
}

impl CommonArgs {
    fn is_empty(&self) -> bool {
        self.path_map.is_empty()
            && self.max_file_bytes.is_none()
            && self.max_model_bytes.is_none()
            && self.exclude_frames.is_empty()
            && self.categories.is_empty()
    }

    /// Options for a run whose workspace is `workspace`.
    fn options(&self, workspace: PathBuf) -> Options {
        let mut opts = Options::default();
        if let Some(max) = self.max_file_bytes {
            opts.decode.max_file_bytes = max;
        }
        opts.decode.max_model_bytes = self.max_model_bytes;
        opts.analysis.frames = FrameFilter::new(self.exclude_frames.clone());
        opts.analysis.categories = self.categories.clone();
        opts.locate.workspace = vec![workspace];
        opts.locate.path_mappings = self.mappings();
        opts
    }

    /// Mappings for the resolver; `TO` is taken relative to the current directory.
    fn mappings(&self) -> Vec<(String, PathBuf)> {
        self.path_map
            .iter()
            .map(|m| (m.from.clone(), absolute(&m.to)))
            .collect()
    }
}

#[derive(Clone, Debug)]
struct PathMap {
    from: String,
    to: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum CheckFormat {
    Text,
    Json,
    Sarif,
    Github,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ReportFormat {
    Text,
    Json,
    /// One self-contained page with the pictures (timeline, allocator state, plan)
    Html,
}

fn parse_severity(s: &str) -> Result<Severity, String> {
    Severity::parse(s)
        .ok_or_else(|| format!("`{s}` is not a severity (error, warning, information, hint)"))
}

fn parse_path_map(s: &str) -> Result<PathMap, String> {
    match s.split_once('=') {
        Some((from, to)) if !from.trim().is_empty() && !to.trim().is_empty() => Ok(PathMap {
            from: from.trim().to_string(),
            to: PathBuf::from(to.trim()),
        }),
        _ => Err(format!(
            "`{s}` is not FROM=TO (a recorded path prefix, `=`, a local directory)"
        )),
    }
}

fn parse_label(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.trim().is_empty() && !path.trim().is_empty() => {
            Ok((name.trim().to_string(), PathBuf::from(path.trim())))
        }
        _ => Err(format!(
            "`{s}` is not NAME=SNAPSHOT (e.g. \"no AC\"=a.pickle)"
        )),
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("`{s}` is not a size (e.g. 4294967296, 512M, 4G)")),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("`{s}` is not a size (e.g. 4294967296, 512M, 4G)"))
}

/// `path` made absolute against the current directory (without touching the file system).
fn absolute(path: &std::path::Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The text report of located reports, as `memlsp report` prints it.
pub fn render_text(reports: &[crate::report::CaptureReport], top: usize) -> String {
    crate::present::text::report(reports, top)
}

/// The HTML page of reports analysed with pictures, as `memlsp report --format html` writes it.
pub fn render_html(reports: &[crate::report::CaptureReport]) -> String {
    crate::present::html::render(reports)
}

/// The JSON document of located reports, as `memlsp report --format json` prints it.
pub fn render_json(reports: &[crate::report::CaptureReport]) -> String {
    json::render_document(reports, &[])
}

/// What the command line asks for, once the command-line work is done.
#[derive(Debug, PartialEq, Eq)]
pub enum Run {
    /// Done: exit with this status.
    Exit(i32),
    /// Run the language server on stdio (`memlsp`, `memlsp lsp`).
    Lsp,
    /// Run the MCP server on stdio (`memlsp mcp`) with these settings.
    Mcp(McpArgs),
}

/// Parse the command line and run it. The servers are started by the caller (`src/main.rs`):
/// the presenters do not depend on each other.
pub fn run() -> Run {
    // Captures are memory-mapped; survive one being truncated under the reader.
    crate::sigbus::install();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return Run::Exit(clap_error(e)),
    };
    match cli.command {
        Some(_) if cli.check => Run::Exit(usage("--check cannot be combined with a subcommand")),
        Some(Command::Report(args)) => Run::Exit(report::run_report(args)),
        Some(Command::Baseline(args)) => Run::Exit(check::record_baseline(args)),
        Some(Command::Compare(args)) if !args.labels.is_empty() => {
            Run::Exit(compare_labels::run(args.labels, args.format, args.common))
        }
        Some(Command::Compare(args)) => Run::Exit(compare::run(compare::CompareArgs {
            paths: args.paths,
            format: args.format,
            common: args.common,
        })),
        Some(Command::Lsp { .. }) => Run::Lsp,
        Some(Command::Mcp(args)) => Run::Mcp(args),
        Some(Command::Fit(args)) => Run::Exit(fit::run_fit(args)),
        Some(Command::Predict(args)) => Run::Exit(fit::run_predict(args)),
        None if cli.check => {
            if cli.baseline.is_none() && (cli.max_growth.is_some() || cli.timing) {
                return Run::Exit(usage("--max-growth and --timing need --baseline FILE"));
            }
            Run::Exit(check::run(check::CheckArgs {
                paths: cli.paths,
                format: cli.format.unwrap_or(CheckFormat::Text),
                fail_on: cli.fail_on.unwrap_or(Severity::Warning),
                workspace: cli.workspace,
                baseline: cli.baseline.map(|file| check::BaselineCheck {
                    file,
                    options: crate::baseline::CompareOptions {
                        max_growth: cli.max_growth.unwrap_or(0.05),
                        timing: cli.timing,
                    },
                }),
                common: cli.common,
            }))
        }
        None => {
            if !cli.paths.is_empty()
                || cli.format.is_some()
                || cli.fail_on.is_some()
                || cli.workspace.is_some()
                || cli.baseline.is_some()
                || cli.max_growth.is_some()
                || cli.timing
                || !cli.common.is_empty()
            {
                return Run::Exit(usage(
                    "paths and --format/--fail-on/--workspace/--baseline/--path-map/--max-file-bytes/\
                     --exclude-frames need --check (or use `memlsp report FILE`)",
                ));
            }
            Run::Lsp
        }
    }
}

/// Help and version go to stdout with status 0; anything else is a one-line usage error.
fn clap_error(e: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        _ => {
            // The first paragraph of clap's message, on one line.
            let rendered = e.render().to_string();
            let first: Vec<&str> = rendered
                .lines()
                .map(str::trim)
                .skip_while(|l| l.is_empty())
                .take_while(|l| !l.is_empty())
                .collect();
            let message = first.join(" ");
            usage(message.trim_start_matches("error: "))
        }
    }
}

fn usage(message: &str) -> i32 {
    eprintln!("memlsp: {message} (see `memlsp --help`)");
    2
}

/// Write the result to stdout in one go; a closed pipe (`| head`) is not an error.
fn emit(out: &str) {
    emit_with(|w| w.write_all(out.as_bytes()));
}

/// Write to stdout through a buffer; a closed pipe (`| head`) ends the output, not the run.
fn emit_with(write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) {
    let mut w = std::io::BufWriter::new(std::io::stdout().lock());
    let _ = write(&mut w).and_then(|()| w.flush());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_mappings_parse() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("8 MiB"), Ok(8 << 20));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
        let m = parse_path_map("/workspace/proj=src").unwrap();
        assert_eq!(m.from, "/workspace/proj");
        assert_eq!(m.to, PathBuf::from("src"));
        assert!(parse_path_map("/workspace").is_err());
        assert!(parse_path_map("=x").is_err());
        assert_eq!(parse_severity("info"), Ok(Severity::Information));
        assert!(parse_severity("fatal").is_err());
    }

    #[test]
    fn command_line_shape() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
