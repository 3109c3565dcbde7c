//! The one task that owns the server's state.
//!
//! tower-lsp-server runs handlers concurrently, so every notification that changes state is sent
//! here over an mpsc channel and applied in order. Analyses run on blocking workers and report
//! back with `Event::Done`; requests never wait for them: they read the last published `View`.
//!
//! This file holds the state and the dispatch of each event; the jobs are its children:
//! `settings` (the client's settings and the baseline), `watch` (scans, the watcher, reported
//! paths), `jobs` (starting and cancelling analyses), `outcome` (what an analysis's end does),
//! `publish` (index, diagnostics, the published `View`, line maps) and `evict` (the report cache).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tower_lsp_server::Client;
use tower_lsp_server::ls_types as lsp;

mod evict;
mod jobs;
mod outcome;
mod publish;
mod settings;
mod watch;

use crate::baseline::{Baseline, CompareOptions};
use crate::error::CaptureError;
use crate::lsp::config::Settings;
use crate::lsp::index::CaptureResult;
use crate::lsp::workspace::{CaptureMatcher, Watcher};
use crate::lsp::{Caps, Doc, Shared};
use crate::options::Cancel;
use crate::report::CaptureReport;
use crate::source::anchor::LineMap;
use crate::source::paths::Resolver;

/// How long to wait for a quiet file before the watcher reports it.
const DEBOUNCE: Duration = Duration::from_millis(150);
/// A failure on a file modified this recently may be a write in progress: look again first.
const SETTLE: Duration = Duration::from_millis(1000);
/// Interval of the two size polls before an analysis.
const STABLE_POLL: Duration = Duration::from_millis(50);

/// Everything that changes server state.
pub enum Event {
    Init {
        roots: Vec<PathBuf>,
        init_options: Option<Value>,
    },
    Initialized,
    /// `didChangeConfiguration`: the pushed settings, or `None` to pull them again.
    ConfigChanged(Option<Value>),
    /// Settings pulled from the client (`first`: the pull made at start).
    Settings {
        value: Value,
        first: bool,
    },
    Open(PathBuf, Doc),
    Change(PathBuf, Doc),
    Close(PathBuf),
    /// Paths that may have been created, changed or deleted (watcher or client).
    Paths(Vec<PathBuf>),
    Reanalyze(Option<oneshot::Sender<usize>>),
    Done {
        path: PathBuf,
        key: FileKey,
        after: Option<FileKey>,
        outcome: Outcome,
    },
    Recheck(PathBuf),
    /// What a capture records, analysed before its simulations (published at once; the
    /// analysis's `Done` refines it).
    Recorded {
        path: PathBuf,
        key: FileKey,
        report: Box<CaptureReport>,
    },
    ResolverReady(u64, Arc<Resolver>),
    /// Answered once every earlier event has been applied (requests that need fresh buffers).
    Barrier(oneshot::Sender<()>),
    WatchError(String),
    Shutdown,
}

/// What one analysis produced.
pub enum Outcome {
    /// The file changed between two polls before the analysis started.
    Unstable,
    /// The file was truncated while it was being read (see `sigbus`).
    Rewritten,
    Reports(Vec<CaptureReport>),
    Error(CaptureError),
    Panic(String),
}

/// Cache key of a capture: a changed size or mtime means new content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileKey {
    pub mtime: SystemTime,
    pub len: u64,
}

impl FileKey {
    pub fn of(path: &Path) -> Option<FileKey> {
        let m = std::fs::metadata(path).ok()?;
        m.is_file().then(|| FileKey {
            mtime: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            len: m.len(),
        })
    }
}

#[derive(Debug)]
enum Status {
    /// Never analysed, or invalidated.
    New,
    Good,
    /// Still being written: quiet until it changes again.
    Incomplete,
    /// Failed on a freshly written file: looked at again after `SETTLE` before it is reported.
    Provisional(String),
    Failed,
    /// Its report was dropped to stay under `scan.maxReportBytes`: analysed again when it
    /// changes or is opened.
    Evicted,
}

struct Entry {
    /// Key of the content last analysed (or being analysed).
    key: Option<FileKey>,
    running: bool,
    /// Changed while an analysis was running: look again when it ends.
    dirty: bool,
    status: Status,
    /// The last good result (kept while a newer write is incomplete).
    result: Option<Arc<CaptureResult>>,
    /// Raised to stop the running analysis (its capture changed again or went away).
    cancel: Cancel,
    /// Estimated bytes of `result` and when it was stored (`lsp::cache`).
    bytes: u64,
    used: u64,
}

pub struct Owner {
    client: Client,
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Event>,
    roots: Vec<PathBuf>,
    init_options: Option<Value>,
    settings: Settings,
    matcher: CaptureMatcher,
    resolver: Option<Arc<Resolver>>,
    resolver_gen: u64,
    captures: BTreeMap<PathBuf, Entry>,
    published: HashMap<PathBuf, Vec<lsp::Diagnostic>>,
    watcher: Option<Watcher>,
    registered: bool,
    workers: Arc<Semaphore>,
    progress_seq: u64,
    logged_unresolved: BTreeMap<String, usize>,
    /// Files already seen as `.py` by the resolver (to notice new ones).
    py_files: HashSet<PathBuf>,
    /// Per workspace file with findings: the text its findings were placed against.
    bases: HashMap<PathBuf, Base>,
    /// Files whose current text differs from their base: where each indexed line is now.
    moved: HashMap<PathBuf, Arc<LineMap>>,
    /// The `baseline` setting's file and what was read from it.
    baseline_path: Option<PathBuf>,
    baseline: Option<Arc<(Baseline, CompareOptions)>>,
    /// Counter of stored results (the cache's recency) and whether the first eviction was shown.
    stored: u64,
    evicted_shown: bool,
}

/// The text a file's findings were placed against, and the captures (path, mtime) they came
/// from: kept while those captures stay the same, so the user's edits (saved or not) move the
/// findings instead of resetting their base. A new capture takes the file as it is on disk (the
/// program that wrote it ran that text).
struct Base {
    sources: Vec<(PathBuf, SystemTime)>,
    text: Arc<str>,
}

impl Owner {
    pub fn new(client: Client, shared: Arc<Shared>, tx: mpsc::UnboundedSender<Event>) -> Owner {
        let settings = Settings::default();
        let (matcher, _) = CaptureMatcher::new(&[], &settings.capture_globs);
        Owner {
            client,
            shared,
            tx,
            roots: Vec::new(),
            init_options: None,
            settings,
            matcher,
            resolver: None,
            resolver_gen: 0,
            captures: BTreeMap::new(),
            published: HashMap::new(),
            watcher: None,
            registered: false,
            workers: Arc::new(Semaphore::new(2)),
            progress_seq: 0,
            logged_unresolved: BTreeMap::new(),
            py_files: HashSet::new(),
            bases: HashMap::new(),
            moved: HashMap::new(),
            baseline_path: None,
            baseline: None,
            stored: 0,
            evicted_shown: false,
        }
    }

    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Event>) {
        while let Some(ev) = rx.recv().await {
            if matches!(ev, Event::Shutdown) {
                self.watcher = None;
                break;
            }
            self.handle(ev).await;
        }
    }

    fn caps(&self) -> Caps {
        self.shared.caps.get().cloned().unwrap_or_default()
    }

    async fn log(&self, typ: lsp::MessageType, msg: String) {
        eprintln!("memlsp: {msg}");
        self.client.log_message(typ, msg).await;
    }

    async fn handle(&mut self, ev: Event) {
        match ev {
            Event::Init {
                roots,
                init_options,
            } => {
                self.roots = roots;
                self.init_options = init_options;
            }
            Event::Initialized => {
                if self.caps().configuration {
                    // Scan only once the client's settings are known, so a capture is never
                    // analysed (and published) under defaults the user has overridden.
                    self.pull_settings(true);
                } else {
                    let opts = self.init_options.clone().unwrap_or(Value::Null);
                    self.apply_settings(&opts).await;
                    self.start_watching().await;
                }
            }
            Event::ConfigChanged(Some(v)) if v.get("memlsp").is_some() => {
                self.apply_settings(&v).await
            }
            Event::ConfigChanged(_) => self.pull_settings(false),
            Event::Settings { value, first } => {
                // `null` from the client: no `memlsp` section there, use initializationOptions.
                let value = match value {
                    Value::Null => self.init_options.clone().unwrap_or(Value::Null),
                    v => v,
                };
                self.apply_settings(&value).await;
                if first {
                    self.start_watching().await;
                }
            }
            Event::Open(path, doc) | Event::Change(path, doc) => {
                if let Ok(mut docs) = self.shared.docs.write() {
                    let newer = docs.get(&path).is_none_or(|d| d.version <= doc.version);
                    if newer {
                        docs.insert(path.clone(), doc);
                    }
                }
                self.reopen(&path);
                self.republish_file(&path).await;
            }
            Event::Close(path) => {
                if let Ok(mut docs) = self.shared.docs.write() {
                    docs.remove(&path);
                }
                self.republish_file(&path).await;
            }
            Event::Paths(paths) => self.on_paths(paths).await,
            Event::Reanalyze(reply) => {
                let paths: Vec<PathBuf> = self.captures.keys().cloned().collect();
                for e in self.captures.values_mut() {
                    e.key = None;
                    e.status = Status::New;
                }
                self.rescan();
                let mut n = 0;
                for p in &paths {
                    self.consider(p);
                    n += 1;
                }
                if let Some(r) = reply {
                    let _ = r.send(n);
                }
            }
            Event::Done {
                path,
                key,
                after,
                outcome,
            } => {
                self.finish(path, key, after, outcome).await;
            }
            Event::Recheck(path) => self.recheck(&path).await,
            Event::Recorded { path, key, report } => self.recorded(path, key, *report).await,
            Event::ResolverReady(generation, resolver) => {
                if generation == self.resolver_gen {
                    self.py_files = resolver.py_files().map(|p| p.to_path_buf()).collect();
                    self.resolver = Some(resolver);
                    self.republish().await;
                }
            }
            Event::Barrier(reply) => {
                let _ = reply.send(());
            }
            Event::WatchError(e) => {
                self.log(lsp::MessageType::WARNING, format!("workspace: {e}"))
                    .await
            }
            Event::Shutdown => {}
        }
    }
}
