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
    /// Set by whoever asked for the analysis when the answer is no longer wanted (the server,
    /// when the capture changes again): the decoders stop at their next progress point.
    pub cancel: Cancel,
    /// Where the decoders publish how much input they have read (for a progress display).
    pub progress: Progress,
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
    /// PyTorch: replay each validated device on a device of this many bytes and report the
    /// first request that fails there (PT013, simulated).
    pub capacity: Option<u64>,
    /// PyTorch: compute the "will it fit" section of the summary (`torch.fit`): the smallest
    /// capacity each validated device needs, and the replay on `capacity` when set.
    pub fit: bool,
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        AnalysisOptions {
            top: 10,
            module: None,
            frames: FrameFilter::default(),
            pictures: false,
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

/// Everything one run of the pipeline is told (`report`, `--check`, the server).
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub decode: DecodeOptions,
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
