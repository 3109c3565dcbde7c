//! The one task that owns the server's state.
//!
//! tower-lsp-server runs handlers concurrently, so every notification that changes state is sent
//! here over an mpsc channel and applied in order. Analyses run on blocking workers and report
//! back with `Event::Done`; requests never wait for them: they read the last published `View`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tower_lsp_server::Client;
use tower_lsp_server::ls_types as lsp;

mod evict;

use crate::analyze;
use crate::baseline::{Baseline, CompareOptions};
use crate::error::{CaptureError, ErrorKind};
use crate::lsp::cache;
use crate::lsp::config::Settings;
use crate::lsp::index::{CaptureResult, FileEntry, Index, capture_name};
use crate::lsp::progress::Bar;
use crate::lsp::to_proto;
use crate::lsp::workspace::{CaptureMatcher, Watcher};
use crate::lsp::{Caps, Doc, Shared, View};
use crate::options::{Cancel, Options};
use crate::report::CaptureReport;
use crate::source::anchor::LineMap;
use crate::source::locate::Locator;
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
            Event::Paths(paths) => {
                let mut changed = false;
                let mut py_changed = false;
                let mut edited = Vec::new();
                for p in paths {
                    if self.baseline_path.as_ref() == Some(&p) {
                        changed |= self.load_baseline().await;
                        continue;
                    }
                    if self.matcher.is_capture(&p) {
                        changed |= self.consider(&p);
                    } else if p.extension().is_some_and(|e| e == "py") {
                        let exists = p.is_file();
                        if exists != self.py_files.contains(&p) {
                            py_changed = true;
                        }
                        if self.bases.contains_key(&p) {
                            // Edited outside the editor: its findings follow the new text.
                            edited.push(p);
                        }
                    } else if p.is_dir() && self.matcher.is_scanned_dir(&p) {
                        // A folder moved or copied in: the watcher may report only the folder.
                        self.scan_dir(p);
                    } else if !p.exists() {
                        // A removed or renamed directory takes its captures with it (the watcher
                        // may report only the directory).
                        let inside: Vec<PathBuf> = self
                            .captures
                            .keys()
                            .filter(|k| k.starts_with(&p))
                            .cloned()
                            .collect();
                        for c in inside {
                            changed |= self.consider(&c);
                        }
                    }
                }
                if py_changed {
                    self.rebuild_resolver();
                }
                if changed {
                    self.republish().await;
                } else {
                    for p in edited {
                        self.republish_file(&p).await;
                    }
                }
            }
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

    /// Ask the client for the `memlsp` section (in a task: the owner never waits on the client).
    /// The first pull always answers, with `null` when the client does not.
    fn pull_settings(&self, first: bool) {
        if !self.caps().configuration {
            return;
        }
        let client = self.client.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let item = lsp::ConfigurationItem {
                scope_uri: None,
                section: Some("memlsp".into()),
            };
            let res =
                tokio::time::timeout(Duration::from_secs(5), client.configuration(vec![item]));
            let value = match res.await {
                Ok(Ok(mut values)) => values.pop().unwrap_or(Value::Null),
                _ => Value::Null,
            };
            if first || !value.is_null() {
                let _ = tx.send(Event::Settings { value, first });
            }
        });
    }

    async fn apply_settings(&mut self, v: &Value) {
        let (settings, problems) = Settings::from_json(v);
        for p in problems {
            self.log(lsp::MessageType::WARNING, format!("settings: {p}"))
                .await;
        }
        let first = self.resolver_gen == 0;
        if !first && settings == self.settings {
            return;
        }
        let options_changed = settings.options_key() != self.settings.options_key();
        let globs_changed = settings.capture_globs != self.settings.capture_globs;
        self.settings = settings;
        if globs_changed && self.registered {
            self.register_watchers(true);
        }
        let (matcher, bad) = CaptureMatcher::new(&self.roots, &self.settings.capture_globs);
        for b in bad {
            self.log(lsp::MessageType::WARNING, format!("captureGlobs: {b}"))
                .await;
        }
        self.matcher = matcher;
        // Captures that no longer match the globs are dropped.
        let before = self.captures.len();
        let m = &self.matcher;
        self.captures.retain(|p, _| m.is_capture(p));
        if options_changed {
            for e in self.captures.values_mut() {
                e.key = None;
                e.status = Status::New;
            }
        }
        self.store_view(None);
        self.rebuild_resolver();
        self.rescan();
        let baseline_changed = self.load_baseline().await;
        if before != self.captures.len() || baseline_changed {
            self.republish().await;
        }
    }

    /// Read the `baseline` setting's file again. True when what the captures are compared with
    /// changed. A file that cannot be read is reported once and compares nothing.
    async fn load_baseline(&mut self) -> bool {
        self.baseline_path = self.settings.baseline_path(&self.roots);
        let loaded = match &self.baseline_path {
            None => None,
            Some(p) => match std::fs::read_to_string(p)
                .map_err(|e| format!("{}: cannot read the baseline ({e})", p.display()))
                .and_then(|t| crate::baseline::parse(p, &t))
            {
                Ok(b) => Some(Arc::new((
                    b,
                    CompareOptions {
                        max_growth: self.settings.baseline_max_growth / 100.0,
                        timing: self.settings.baseline_timing,
                    },
                ))),
                Err(e) => {
                    self.log(lsp::MessageType::ERROR, format!("baseline: {e}"))
                        .await;
                    self.client
                        .show_message(lsp::MessageType::WARNING, format!("memlsp: {e}"))
                        .await;
                    None
                }
            },
        };
        let changed = loaded != self.baseline;
        self.baseline = loaded;
        changed
    }

    fn rebuild_resolver(&mut self) {
        self.resolver_gen += 1;
        let generation = self.resolver_gen;
        let roots = self.roots.clone();
        let mappings = self.settings.mappings(&roots);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let built =
                tokio::task::spawn_blocking(move || Arc::new(Resolver::new(roots, mappings))).await;
            match built {
                Ok(r) => {
                    let _ = tx.send(Event::ResolverReady(generation, r));
                }
                Err(e) => eprintln!("memlsp: indexing the workspace failed: {e}"),
            }
        });
    }

    /// Find every capture under the roots (off the async executor).
    fn rescan(&self) {
        let matcher = self.matcher.clone();
        let tx = self.tx.clone();
        let budget = self.settings.scan;
        tokio::spawn(async move {
            let scan = tokio::task::spawn_blocking(move || matcher.scan_budgeted(&budget)).await;
            if let Ok(scan) = scan {
                if let Some(m) = scan.skipped_message(&budget) {
                    let _ = tx.send(Event::WatchError(m));
                }
                let _ = tx.send(Event::Paths(scan.chosen));
            }
        });
    }

    /// Look for captures under one directory of the workspace (off the async executor).
    fn scan_dir(&self, dir: PathBuf) {
        let matcher = self.matcher.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let found = tokio::task::spawn_blocking(move || {
                crate::source::workspace::walk(&dir)
                    .flatten()
                    .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
                    .map(|e| e.into_path())
                    .filter(|p| matcher.is_capture(p))
                    .collect::<Vec<_>>()
            })
            .await;
            if let Ok(found) = found {
                if !found.is_empty() {
                    let _ = tx.send(Event::Paths(found));
                }
            }
        });
    }

    async fn start_watching(&mut self) {
        if self.watcher.is_none() && !self.roots.is_empty() {
            let tx = self.tx.clone();
            let tx_err = self.tx.clone();
            match crate::lsp::workspace::watch(
                &self.roots,
                DEBOUNCE,
                move |paths| {
                    let _ = tx.send(Event::Paths(paths));
                },
                move |e| {
                    let _ = tx_err.send(Event::WatchError(e));
                },
            ) {
                Ok(w) => {
                    // Said once: what the watcher left out; the rest is watched.
                    if let Some(m) = w.skipped_message() {
                        self.log(lsp::MessageType::WARNING, m).await;
                    }
                    self.watcher = Some(w)
                }
                Err(e) => {
                    self.log(
                        lsp::MessageType::WARNING,
                        format!("cannot watch the workspace ({e}); captures update on memlsp.reanalyze or client file events"),
                    )
                    .await
                }
            }
        }
        if !self.registered && self.caps().watched_files_dynamic {
            self.registered = true;
            self.register_watchers(false);
        }
    }

    /// Ask the client to watch `captureGlobs` (again, when they changed: the old registration
    /// is withdrawn first).
    fn register_watchers(&self, replace: bool) {
        const ID: &str = "memlsp-captures";
        const METHOD: &str = "workspace/didChangeWatchedFiles";
        let watchers = self
            .settings
            .capture_globs
            .iter()
            .map(|g| lsp::FileSystemWatcher {
                glob_pattern: lsp::GlobPattern::String(g.clone()),
                kind: None,
            })
            .collect();
        let opts = lsp::DidChangeWatchedFilesRegistrationOptions { watchers };
        let client = self.client.clone();
        if let Ok(options) = serde_json::to_value(opts) {
            tokio::spawn(async move {
                if replace {
                    let old = lsp::Unregistration {
                        id: ID.into(),
                        method: METHOD.into(),
                    };
                    let _ = client.unregister_capability(vec![old]).await;
                }
                let reg = lsp::Registration {
                    id: ID.into(),
                    method: METHOD.into(),
                    register_options: Some(options),
                };
                let _ = client.register_capability(vec![reg]).await;
            });
        }
    }

    /// Look at one capture path; start an analysis when its content is new. Returns true when a
    /// published result went away (deleted file).
    fn consider(&mut self, path: &Path) -> bool {
        let Some(key) = FileKey::of(path) else {
            // Gone (or a directory): stop reading it and withdraw what it said.
            return self.captures.remove(path).is_some_and(|e| {
                e.cancel.cancel();
                e.result.is_some()
            });
        };
        let entry = self.captures.entry(path.to_path_buf()).or_insert(Entry {
            key: None,
            running: false,
            dirty: false,
            status: Status::New,
            result: None,
            cancel: Cancel::default(),
            bytes: 0,
            used: 0,
        });
        if entry.running {
            // New content while the old is being read: stop reading the old one (the answer
            // would be discarded) and look again when the worker gives up.
            if entry.key != Some(key) {
                entry.cancel.cancel();
            }
            entry.dirty = true;
            return false;
        }
        if entry.key == Some(key) && !matches!(entry.status, Status::New) {
            return false; // cached: same path, mtime and size
        }
        entry.key = Some(key);
        entry.running = true;
        entry.cancel = Cancel::new();
        let cancel = entry.cancel.clone();
        self.spawn_analysis(path.to_path_buf(), key, cancel);
        false
    }

    /// Captures with a good result, newest first.
    fn newest_first(&self) -> Vec<PathBuf> {
        let mut good: Vec<(SystemTime, &PathBuf)> = self
            .captures
            .iter()
            .filter_map(|(p, e)| Some((e.result.as_ref()?.mtime, p)))
            .collect();
        good.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        good.into_iter().map(|(_, p)| p.clone()).collect()
    }

    /// The options every analysis of this server runs with.
    fn options(&self) -> Options {
        let mut opts: Options = self.settings.options();
        opts.locate.workspace = self.roots.clone();
        opts.locate.path_mappings = self.settings.mappings(&self.roots);
        opts
    }

    fn spawn_analysis(&mut self, path: PathBuf, key: FileKey, cancel: Cancel) {
        let mut opts = self.options();
        opts.decode.cancel = cancel;
        let read = analyze::reading_progress(&path);
        if let Some((progress, _)) = &read {
            opts.decode.progress = progress.clone();
        }
        let tx = self.tx.clone();
        let workers = self.workers.clone();
        let client = self.client.clone();
        let progress = self.caps().work_done_progress;
        let simulating = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.progress_seq += 1;
        let token = lsp::ProgressToken::String(format!("memlsp/analyse/{}", self.progress_seq));
        tokio::spawn(async move {
            let _permit = workers.acquire_owned().await;
            // Two polls of the size: a file still growing is not read yet (the engines map files
            // into memory; reading one mid-write only wastes work).
            tokio::time::sleep(STABLE_POLL).await;
            let polled = FileKey::of(&path);
            if polled != Some(key) {
                let _ = tx.send(Event::Done {
                    path,
                    key,
                    after: polled,
                    outcome: Outcome::Unstable,
                });
                return;
            }
            let p = path.clone();
            let (early, sim) = (tx.clone(), simulating.clone());
            let job = tokio::task::spawn_blocking(move || {
                #[cfg(feature = "test-hooks")]
                crate::lsp::test_hooks::hold_on(&p, &opts.decode.cancel);
                let faults = crate::sigbus::rescued();
                // What the capture records is published before the simulations run.
                let mut recorded = |report: CaptureReport| {
                    sim.store(true, std::sync::atomic::Ordering::Relaxed);
                    let _ = early.send(Event::Recorded {
                        path: p.clone(),
                        key,
                        report: Box::new(report),
                    });
                };
                let outcome = contained(|| {
                    #[cfg(feature = "test-hooks")]
                    crate::lsp::test_hooks::panic_on(&p);
                    analyze::analyze_file_staged(&p, &opts, &mut recorded)
                });
                // The mapping lost its file under the reader: whatever was decoded is void.
                let outcome = if crate::sigbus::rescued() != faults {
                    Outcome::Rewritten
                } else {
                    outcome
                };
                (outcome, FileKey::of(&p))
            });
            let title = format!("memlsp: analysing {}", capture_name(&path));
            let bar = Bar {
                client: &client,
                shown: progress,
                token,
                title,
                read,
                simulating,
            };
            let joined = bar.wait(job).await;
            let (outcome, after) = match joined {
                Ok(x) => x,
                Err(e) => (Outcome::Panic(e.to_string()), None),
            };
            let _ = tx.send(Event::Done {
                path,
                key,
                after,
                outcome,
            });
        });
    }

    async fn finish(
        &mut self,
        path: PathBuf,
        key: FileKey,
        after: Option<FileKey>,
        outcome: Outcome,
    ) {
        let Some(entry) = self.captures.get_mut(&path) else {
            return; // deleted or no longer matching while it ran
        };
        entry.running = false;
        let stable = after == Some(key);
        let mut changed = false;
        let mut report_failure: Option<String> = None;
        match outcome {
            Outcome::Reports(reports) if stable => {
                entry.status = Status::Good;
                self.stored += 1;
                entry.used = self.stored;
                entry.bytes = reports.iter().map(cache::report_bytes).sum();
                entry.result = Some(Arc::new(CaptureResult {
                    path: path.clone(),
                    mtime: key.mtime,
                    reports,
                }));
                changed = true;
            }
            Outcome::Error(e) if e.kind == ErrorKind::Cancelled => {
                // Stopped because the file changed again (`consider` marked it dirty).
                entry.status = Status::New;
                entry.dirty = true;
                self.client
                    .log_message(
                        lsp::MessageType::LOG,
                        format!(
                            "analysis of {} cancelled: the capture changed while it was read",
                            path.display()
                        ),
                    )
                    .await;
            }
            Outcome::Rewritten => {
                entry.status = Status::Incomplete;
                entry.dirty = true;
                eprintln!(
                    "memlsp: {} was rewritten while being read; reading it again",
                    path.display()
                );
                self.client
                    .log_message(
                        lsp::MessageType::INFO,
                        format!(
                            "{} was rewritten while being read; reading it again",
                            path.display()
                        ),
                    )
                    .await;
            }
            Outcome::Reports(_) | Outcome::Unstable => {
                // Changed while being read: look again now (the new content has a new key).
                entry.status = Status::Incomplete;
                entry.dirty = true;
            }
            Outcome::Error(e) if e.is_incomplete() || !stable => {
                entry.status = Status::Incomplete;
                eprintln!(
                    "memlsp: {} is still being written; retrying on its next change",
                    path.display()
                );
                schedule_recheck(&self.tx, &path);
            }
            Outcome::Error(e) => {
                let fresh = SystemTime::now()
                    .duration_since(key.mtime)
                    .is_ok_and(|age| age < SETTLE);
                if fresh && !matches!(entry.status, Status::Provisional(_)) {
                    entry.status = Status::Provisional(e.to_string());
                    schedule_recheck(&self.tx, &path);
                } else {
                    entry.status = Status::Failed;
                    changed = entry.result.take().is_some();
                    report_failure = Some(e.to_string());
                }
            }
            Outcome::Panic(msg) => {
                entry.status = Status::Failed;
                changed = entry.result.take().is_some();
                report_failure = Some(format!(
                    "{}: the analysis panicked ({msg}); please report this with the file",
                    path.display()
                ));
            }
        }
        let again = std::mem::take(&mut entry.dirty);
        if let Some(msg) = report_failure {
            self.report_failure(msg).await;
        }
        if again {
            changed |= self.consider(&path);
        }
        if changed {
            self.keep_cache_in_budget(&path).await;
            self.republish().await;
        }
    }

    /// The first publish of a capture whose analysis still runs its simulations: what the
    /// capture records, shown (diagnostics, hover, inlay) until the analysis's end refines it.
    async fn recorded(&mut self, path: PathBuf, key: FileKey, report: CaptureReport) {
        let Some(entry) = self.captures.get_mut(&path) else {
            return;
        };
        if !entry.running || entry.dirty || entry.key != Some(key) {
            return; // changed since: the next analysis publishes
        }
        self.stored += 1;
        entry.used = self.stored;
        entry.bytes = cache::report_bytes(&report);
        entry.result = Some(Arc::new(CaptureResult {
            path: path.clone(),
            mtime: key.mtime,
            reports: vec![report],
        }));
        self.keep_cache_in_budget(&path).await;
        self.republish().await;
    }

    /// A second look at a file whose last analysis was inconclusive.
    async fn recheck(&mut self, path: &Path) {
        let Some(entry) = self.captures.get_mut(path) else {
            return;
        };
        if entry.running {
            return;
        }
        let now = FileKey::of(path);
        if now != entry.key {
            let changed = self.consider(path);
            if changed {
                self.republish().await;
            }
            return;
        }
        // Unchanged for `SETTLE`: a provisional failure is real now. An incomplete file stays
        // quiet until it changes (a dump that stopped half-way is not the user's error yet).
        if let Status::Provisional(msg) = &entry.status {
            let msg = msg.clone();
            entry.status = Status::Failed;
            let changed = entry.result.take().is_some();
            self.report_failure(msg).await;
            if changed {
                self.republish().await;
            }
        }
    }

    async fn report_failure(&self, msg: String) {
        self.log(
            lsp::MessageType::ERROR,
            format!("cannot read capture: {msg}"),
        )
        .await;
        self.client
            .show_message(lsp::MessageType::WARNING, format!("memlsp: {msg}"))
            .await;
    }

    fn store_view(&self, index: Option<Index>) {
        let caps = self.caps();
        if let Ok(mut view) = self.shared.view.write() {
            let index = match index {
                Some(i) => Arc::new(i),
                None => view.index.clone(),
            };
            *view = Arc::new(View {
                index,
                diagnostics: self.published.clone(),
                inlay_hints: self.settings.inlay_hints,
                inlay_min_percent: self.settings.inlay_min_percent,
                inlay_min_bytes: self.settings.inlay_min_bytes,
                frames: self.settings.options().analysis.frames,
                encoding: caps.encoding,
                moved: self.moved.clone(),
                resolver: self.resolver.clone(),
                options: self.options(),
                code_lens: self.settings.code_lens,
                captures: self.newest_first(),
            });
        }
    }

    /// Rebuild the index from every capture's last good result and publish what changed.
    async fn republish(&mut self) {
        let Some(resolver) = self.resolver.clone() else {
            return; // published once the workspace index is ready
        };
        let results: Vec<Arc<CaptureResult>> = self
            .captures
            .values()
            .filter_map(|e| e.result.clone())
            .collect();
        let locator = Locator::with_resolver(resolver, self.settings.options().analysis.frames);
        let index = Index::build_with(&results, &locator, self.baseline.as_deref());

        if index.unresolved != self.logged_unresolved && !index.unresolved.is_empty() {
            let list: Vec<String> = index
                .unresolved
                .iter()
                .map(|(f, n)| format!("{f} ({n})"))
                .collect();
            self.log(
                lsp::MessageType::INFO,
                format!(
                    "{} recorded file(s) not found in the workspace (set memlsp.pathMappings): {}",
                    index.unresolved.len(),
                    list.join(", ")
                ),
            )
            .await;
        }
        self.logged_unresolved = index.unresolved.clone();
        self.rebase(&index);

        let mut next: HashMap<PathBuf, Vec<lsp::Diagnostic>> = HashMap::new();
        for (file, fe) in &index.files {
            let diags = self.file_diagnostics(file, fe, self.text_of(file).as_deref());
            if !diags.is_empty() {
                next.insert(file.clone(), diags);
            }
        }
        let mut to_send = Vec::new();
        for (file, diags) in &next {
            if self.published.get(file) != Some(diags) {
                to_send.push((file.clone(), diags.clone()));
            }
        }
        for file in self.published.keys() {
            if !next.contains_key(file) {
                to_send.push((file.clone(), Vec::new()));
            }
        }
        self.published = next;
        self.store_view(Some(index));
        for (file, diags) in to_send {
            if let Some(uri) = to_proto::uri(&file) {
                self.client.publish_diagnostics(uri, diags, None).await;
            }
        }
        self.refresh_client();
    }

    /// Ask the client to request inlay hints and code lenses again (they moved or changed).
    fn refresh_client(&self) {
        let caps = self.caps();
        let client = self.client.clone();
        tokio::spawn(async move {
            if caps.inlay_refresh {
                let _ = client.inlay_hint_refresh().await;
            }
            if caps.code_lens_refresh {
                let _ = client.code_lens_refresh().await;
            }
        });
    }

    /// After a new index: keep each file's base while the captures placing findings in it are
    /// the same ones, take the file from disk otherwise; then where every line is now.
    fn rebase(&mut self, index: &Index) {
        let mtimes: HashMap<&Path, SystemTime> = self
            .captures
            .iter()
            .filter_map(|(p, e)| Some((p.as_path(), e.result.as_ref()?.mtime)))
            .collect();
        let mut bases = HashMap::new();
        for (file, fe) in &index.files {
            let mut sources: Vec<(PathBuf, SystemTime)> = fe
                .lines
                .values()
                .flat_map(|l| {
                    l.findings
                        .iter()
                        .map(|f| &f.capture)
                        .chain(l.sites.iter().map(|s| &s.capture))
                })
                .map(|c| {
                    let t = mtimes.get(c.as_path()).copied();
                    (c.clone(), t.unwrap_or(SystemTime::UNIX_EPOCH))
                })
                .collect();
            sources.sort();
            sources.dedup();
            let base = match self.bases.remove(file) {
                Some(b) if b.sources == sources => b,
                _ => {
                    let text = std::fs::read_to_string(file)
                        .ok()
                        .or_else(|| self.text_of(file))
                        .unwrap_or_default();
                    Base {
                        sources,
                        text: text.into(),
                    }
                }
            };
            bases.insert(file.clone(), base);
        }
        self.bases = bases;
        self.moved.clear();
        let files: Vec<PathBuf> = self.bases.keys().cloned().collect();
        for f in files {
            let now = self.text_of(&f).unwrap_or_default();
            self.remap(&f, &now);
        }
    }

    /// Where the indexed lines of `file` are in its current text `now` (buffer or disk).
    fn remap(&mut self, file: &Path, now: &str) {
        let Some(base) = self.bases.get(file) else {
            self.moved.remove(file);
            return;
        };
        let map = LineMap::between(&base.text, now);
        if map.is_identity() {
            self.moved.remove(file);
        } else {
            self.moved.insert(file.to_path_buf(), Arc::new(map));
        }
    }

    /// The diagnostics of one workspace file against its current text (buffer or disk). A
    /// finding whose fix is already in the text (the user applied the quick fix) is left out:
    /// the capture predates the edit.
    fn file_diagnostics(
        &self,
        file: &Path,
        fe: &FileEntry,
        text: Option<&str>,
    ) -> Vec<lsp::Diagnostic> {
        let enc = self.caps().encoding;
        // One scan of the text for every finding's "is the fix already there" check (a scanner
        // panic costs the check, not the server).
        let src = text
            .and_then(|t| std::panic::catch_unwind(|| crate::source::python::Source::new(t)).ok());
        let file_str = file.to_string_lossy();
        let moved = self.moved.get(file);
        let mut diags = Vec::new();
        for (line, le) in &fe.lines {
            // Where the line's text is now; gone (edited or deleted): withdrawn.
            let Some(now) = moved.map_or(Some(*line), |m| m.new_line(*line)) else {
                continue;
            };
            let lt = text.and_then(|t| to_proto::line_of(t, now.saturating_sub(1)));
            for lf in &le.findings {
                let fixed = src
                    .as_ref()
                    .is_some_and(|s| fix_applied(&lf.finding, &file_str, s, now));
                if !fixed {
                    diags.push(to_proto::diagnostic(lf, now, lt, enc));
                }
            }
        }
        diags.sort_by_key(|d| d.range.start.line);
        diags
    }

    /// After an edit (or open/close, or a change on disk) of `file`: its findings follow the
    /// text; publish its diagnostics again if they changed.
    async fn republish_file(&mut self, file: &Path) {
        let view = self.shared.view();
        let Some(fe) = view.index.files.get(file) else {
            return;
        };
        let before = self.moved.get(file).cloned();
        let text = self.text_of(file);
        self.remap(file, text.as_deref().unwrap_or_default());
        let lines_moved = before != self.moved.get(file).cloned();
        let diags = self.file_diagnostics(file, fe, text.as_deref());
        let old = self.published.get(file).cloned().unwrap_or_default();
        if diags == old && !lines_moved {
            return;
        }
        if diags.is_empty() {
            self.published.remove(file);
        } else {
            self.published.insert(file.to_path_buf(), diags.clone());
        }
        self.store_view(None);
        if diags != old {
            if let Some(uri) = to_proto::uri(file) {
                self.client.publish_diagnostics(uri, diags, None).await;
            }
        }
        if lines_moved {
            self.refresh_client();
        }
    }

    fn text_of(&self, path: &Path) -> Option<String> {
        if let Ok(docs) = self.shared.docs.read() {
            if let Some(d) = docs.get(path) {
                return Some(d.text.clone());
            }
        }
        std::fs::read_to_string(path).ok()
    }
}

/// Run one analysis; a panic inside it becomes an `Outcome` instead of unwinding further.
fn contained(analyse: impl FnOnce() -> Result<CaptureReport, CaptureError>) -> Outcome {
    match std::panic::catch_unwind(AssertUnwindSafe(analyse)) {
        Ok(Ok(report)) => Outcome::Reports(vec![report]),
        Ok(Err(e)) => Outcome::Error(e),
        Err(panic) => Outcome::Panic(panic_message(panic.as_ref())),
    }
}

/// True when one of the finding's edit fixes reports that the line already has it (`loss` is
/// already `loss.detach()`, `jax.jit` already donates, …).
fn fix_applied(
    f: &crate::findings::Finding,
    file: &str,
    src: &crate::source::python::Source,
    line: u32,
) -> bool {
    f.fixes.iter().any(|fix| {
        !matches!(fix.kind, crate::findings::FixKind::Advice)
            && std::panic::catch_unwind(AssertUnwindSafe(|| {
                crate::source::edits::edits_in(&fix.kind, file, src, line)
            }))
            .is_ok_and(|r| r.is_err_and(|why| why.already_applied()))
    })
}

fn schedule_recheck(tx: &mpsc::UnboundedSender<Event>, path: &Path) {
    let tx = tx.clone();
    let p = path.to_path_buf();
    tokio::spawn(async move {
        tokio::time::sleep(SETTLE).await;
        let _ = tx.send(Event::Recheck(p));
    });
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_analysis_becomes_an_outcome_with_its_message() {
        let out = contained(|| panic!("index out of bounds: the len is 3"));
        match out {
            Outcome::Panic(msg) => assert_eq!(msg, "index out of bounds: the len is 3"),
            _ => panic!("the panic escaped as a result"),
        }
        let out = contained(|| {
            let snap = crate::torch::model::Snapshot::default();
            let a = crate::torch::analyse(&snap, &Default::default());
            Ok(crate::report::CaptureReport {
                path: PathBuf::from("x.pickle"),
                engine: crate::report::Engine::Torch(Box::new(crate::torch::summary::summarize(
                    &snap, &a, 10,
                ))),
                sites: Vec::new(),
                findings: Vec::new(),
                shown_path: None,
            })
        });
        assert!(matches!(out, Outcome::Reports(r) if r.len() == 1));
    }
}
