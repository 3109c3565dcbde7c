//! What each layer is told, split by layer so that no layer sees another's settings: the decoder
//! (limits), the analyses (how many sites, which module, which frames are the user's) and the
//! locate step (where the workspace is, how recorded paths map to it).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::frames::FrameFilter;

/// Limits of the decoders.
#[derive(Clone, Debug)]
pub struct DecodeOptions {
    /// Keep only the newest N trace events per device (None = no cap).
    pub max_trace_events: Option<usize>,
    /// Files larger than this are refused (bytes).
    pub max_file_bytes: u64,
    /// Snapshots whose model would hold more than this are refused before it is built (bytes;
    /// `None`: 8 × the file's size, at least 64 MiB — `model_budget`).
    pub max_model_bytes: Option<u64>,
    /// Set by whoever asked for the analysis when the answer is no longer wanted (the server,
    /// when the capture changes again): the decoders stop at their next progress point.
    pub cancel: Cancel,
    /// Where the decoders publish how much input they have read (for a progress display).
    pub progress: Progress,
}

/// The default model budget (`DecodeOptions::max_model_bytes` unset): this many times the
/// file's size…
pub const MODEL_FILE_MULTIPLE: u64 = 8;
/// …but never less than this (a small file may name a few devices and segments legitimately).
pub const MODEL_FLOOR: u64 = 64 << 20;

impl DecodeOptions {
    /// The most a decoded model of a file of `file_len` bytes may hold in memory.
    pub fn model_budget(&self, file_len: u64) -> u64 {
        self.max_model_bytes.unwrap_or_else(|| {
            file_len
                .saturating_mul(MODEL_FILE_MULTIPLE)
                .max(MODEL_FLOOR)
        })
    }

    /// Where [`DecodeOptions::model_budget`] comes from, for an error message.
    pub fn model_budget_rule(&self, file_len: u64) -> String {
        match self.max_model_bytes {
            Some(_) => "--max-model-bytes".to_string(),
            None => format!(
                "{MODEL_FILE_MULTIPLE} × the {} file, at least {}",
                crate::findings::fmt_bytes(file_len),
                crate::findings::fmt_bytes(MODEL_FLOOR)
            ),
        }
    }
}

/// A flag that stops a running analysis (checked every few MiB of input and between stages).
#[derive(Clone, Debug, Default)]
pub struct Cancel(Option<Arc<AtomicBool>>);

impl Cancel {
    /// A flag that can be raised with [`Cancel::cancel`].
    pub fn new() -> Cancel {
        Cancel(Some(Arc::new(AtomicBool::new(false))))
    }

    pub fn cancel(&self) {
        if let Some(f) = &self.0 {
            f.store(true, Ordering::Relaxed);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
    }
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            max_trace_events: None,
            max_file_bytes: 4 << 30,
            max_model_bytes: None,
            cancel: Cancel::default(),
            progress: Progress::default(),
        }
    }
}

/// How far the decoders got: the bytes of input read, published every few MiB where they check
/// [`Cancel`], for whoever shows progress (`memlsp report` on a terminal). Shared like
/// [`Cancel`]; a default one publishes nowhere.
#[derive(Clone, Debug, Default)]
pub struct Progress(Option<Arc<AtomicU64>>);

impl Progress {
    /// A counter that [`Progress::read`] can watch.
    pub fn new() -> Progress {
        Progress(Some(Arc::new(AtomicU64::new(0))))
    }

    /// At least `bytes` of input have been read (the counter never goes back: a JAX capture's
    /// walks over planes do, and the share shown must not fall).
    pub fn advance(&self, bytes: u64) {
        if let Some(p) = &self.0 {
            p.fetch_max(bytes, Ordering::Relaxed);
        }
    }

    /// The bytes of input read so far (0 when nothing publishes).
    pub fn read(&self) -> u64 {
        self.0.as_ref().map_or(0, |p| p.load(Ordering::Relaxed))
    }
}

/// What a progress display says of `read` bytes of `total`: the share read in percent, or
/// `None` once all are (the analysis runs). The terminal line, the log lines and the editor's
/// bar all say it this way.
pub fn percent_read(read: u64, total: u64) -> Option<u64> {
    (read < total).then(|| read.saturating_mul(100) / total.max(1))
}

/// What the analyses need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnalysisOptions {
    /// Number of top sites to list.
    pub top: usize,
    /// JAX: module to analyse (`jit_train_step(36)` or the bare HLO name).
    pub module: Option<String>,
    /// Which frames count as the user's.
    pub frames: FrameFilter,
    /// Also compute what pictures draw (memory over time, allocator state, the heap over the
    /// program order): the HTML page and the editor's timeline ask for it.
    pub pictures: bool,
    /// `--category NAME=REGEX`, in the order given (the first that matches a block wins).
    pub categories: Vec<Category>,
    /// PyTorch: replay each validated device on a device of this many bytes and report the
    /// first request that fails there (PT017, simulated).
    pub capacity: Option<u64>,
    /// PyTorch: compute the "will it fit" section of the summary (`torch.fit`): the smallest
    /// capacity each validated device needs, and the replay on `capacity` when set.
    pub fit: bool,
}

/// A user category (`--category NAME=REGEX`): the live blocks whose stack has a frame whose
/// `filename:function` the regex matches.
#[derive(Clone, Debug)]
pub struct Category {
    pub name: String,
    pub regex: regex::Regex,
}

impl PartialEq for Category {
    fn eq(&self, o: &Category) -> bool {
        self.name == o.name && self.regex.as_str() == o.regex.as_str()
    }
}
impl Eq for Category {}

impl Category {
    /// `NAME=REGEX` (the first `=` splits; the name is not empty).
    pub fn parse(s: &str) -> Result<Category, String> {
        let (name, re) = s
            .split_once('=')
            .ok_or_else(|| format!("`{s}` is not NAME=REGEX (e.g. optimizer=torch/optim/)"))?;
        if name.trim().is_empty() {
            return Err(format!("`{s}`: the category name is empty"));
        }
        let regex = regex::Regex::new(re).map_err(|e| {
            format!(
                "`{re}` is not a regular expression: {}",
                e.to_string().lines().last().unwrap_or("")
            )
        })?;
        Ok(Category {
            name: name.trim().to_string(),
            regex,
        })
    }
    /// Whether a frame belongs to this category.
    pub fn matches(&self, filename: &str, function: &str) -> bool {
        self.regex.is_match(&format!("{filename}:{function}"))
    }
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        AnalysisOptions {
            top: 10,
            module: None,
            frames: FrameFilter::default(),
            pictures: false,
            categories: Vec::new(),
            capacity: None,
            fit: false,
        }
    }
}

/// Where recorded source paths are looked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocateOptions {
    /// Workspace roots (see `crate::source::paths::Resolver`).
    pub workspace: Vec<PathBuf>,
    /// `(recorded prefix, local prefix)` path mappings, longest prefix first.
    pub path_mappings: Vec<(String, PathBuf)>,
}

/// `--range A..B` (PyTorch): the part of each device's trace to analyse (`torch::range`).
/// One end of a `--range`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    Entry(u64),
    Seconds(f64),
}

/// `A..B` as given.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Range {
    pub start: Option<Bound>,
    pub end: Option<Bound>,
}

fn bound(s: &str) -> Result<Option<Bound>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    if let Some(sec) = s.strip_suffix('s') {
        return match sec.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(Some(Bound::Seconds(v))),
            _ => Err(format!("`{s}` is not a number of seconds (e.g. 2.5s)")),
        };
    }
    s.parse::<u64>()
        .map(|v| Some(Bound::Entry(v)))
        .map_err(|_| format!("`{s}` is not an entry index or seconds (e.g. 1000 or 2.5s)"))
}

impl Range {
    /// `A..B`, `A..`, `..B`.
    pub fn parse(s: &str) -> Result<Range, String> {
        let (a, b) = s.split_once("..").ok_or_else(|| {
            format!("`{s}` is not A..B (entry indices or seconds: 1000..5000, 2s..4.5s)")
        })?;
        let r = Range {
            start: bound(a)?,
            end: bound(b)?,
        };
        if let (Some(Bound::Entry(x)), Some(Bound::Entry(y))) = (r.start, r.end)
            && x >= y
        {
            return Err(format!("`{s}`: the range is empty (A must be below B)"));
        }
        Ok(r)
    }

    /// Entry indices `a..b` of a trace of `n` entries whose times (µs) `time` gives.
    pub fn indices(
        &self,
        n: usize,
        time: impl Fn(usize) -> Option<i64>,
    ) -> Result<(usize, usize), String> {
        let t0 = time(0);
        let at = |b: Bound| -> Result<usize, String> {
            match b {
                Bound::Entry(i) => Ok(usize::try_from(i).unwrap_or(usize::MAX).min(n)),
                Bound::Seconds(s) => {
                    let t0 =
                        t0.ok_or("its trace has no time_us (torch < 2.2): give entry indices")?;
                    let t = t0.saturating_add((s * 1e6) as i64);
                    // time_us is non-decreasing per device (FORMAT.md §5).
                    let (mut lo, mut hi) = (0usize, n);
                    while lo < hi {
                        let mid = (lo + hi) / 2;
                        if time(mid).unwrap_or(i64::MIN) < t {
                            lo = mid + 1;
                        } else {
                            hi = mid;
                        }
                    }
                    Ok(lo)
                }
            }
        };
        let a = self.start.map(at).transpose()?.unwrap_or(0);
        let b = self.end.map(at).transpose()?.unwrap_or(n);
        Ok((a, b.max(a)))
    }
}

/// Everything one run of the pipeline is told (`report`, `--check`, the server).
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub decode: DecodeOptions,
    /// `--range A..B`: analyse only that part of each device's trace.
    pub range: Option<Range>,
    pub analysis: AnalysisOptions,
    pub locate: LocateOptions,
    /// Snapshots analysed at once (per-rank directories); 0 = one per core. Peak memory is at
    /// most this many snapshots' worth.
    pub jobs: usize,
}

impl Options {
    /// [`Options::jobs`] resolved: at least 1, 0 meaning the machine's cores.
    pub fn jobs(&self) -> usize {
        match self.jobs {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}
