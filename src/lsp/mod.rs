//! The language server (the only module that sees LSP types).
//!
//! Layout: `server` implements the protocol and forwards each request to its handler in
//! `handlers/` (one file per method) and each notification to the owner task; `main_loop` the one task that
//! owns state, `workspace` scanning and watching, `index` the per-line data built from reports,
//! `to_proto` every conversion to LSP types, `config` the settings, `commands` the command names,
//! `test_hooks` the tests' fault injection (only with the `test-hooks` feature).
//!
//! Behaviour in short:
//! - At `initialized` the server reads its settings (`initializationOptions`, then
//!   `workspace/configuration` section `memlsp`), scans the workspace folders for captures
//!   (`captureGlobs`; `.gitignore` respected; `.venv`, `node_modules`, `.git` skipped) and watches
//!   them itself (notify + debouncer). Client `didChangeWatchedFiles` events take the same path.
//! - Every capture is analysed on a blocking worker (two at a time). Results are cached by path,
//!   mtime and size. A file that is still being written (the engine says truncated, or its size
//!   changed during the analysis) stays quiet until it changes again; a failure on a file written
//!   less than a second ago is looked at once more before it is reported. A truly unreadable
//!   capture gets one log line and one `window/showMessage`, and no diagnostics.
//! - Diagnostics are pushed for every workspace file a finding resolves to (pull is not offered:
//!   clients would show each finding twice, but a pull request is answered); a deleted capture
//!   withdraws its own. A finding whose fix is already in the buffer is withdrawn. When several
//!   captures report the same code on one line for the same scope, the newest wins and the
//!   message names the others.
//! - Inlay hints (`38% live memory`, `41% of heap peak`), hovers (stack, sizes, labelled
//!   evidence) and code actions (edits computed against the current buffer by
//!   `source::edits::edits_for`; none when the line no longer matches) answer from the last
//!   published `View` and never wait for an analysis.
//! - Commands: `memlsp.reanalyze` (forget the cache, rescan), `memlsp.explain` (advice fixes).
//! - Settings: `captureGlobs`, `pathMappings` (`{"recorded prefix": "local path"}`,
//!   `${workspaceFolder}` expanded), `userFrameExcludes`, `inlayHints.enable`,
//!   `inlayHints.minPercent` (default 1), `inlayHints.minBytes` (default 1 MiB), `maxFileBytes`, `maxModelBytes`,
//!   `scan.maxCaptures` (default 64), `scan.maxBytes` (default 8 GiB), `scan.maxEntries`
//!   (default 1,000,000), `scan.maxReportBytes` (default 512 MiB of cached reports, `cache`),
//!   `topSites`.

mod cache;
pub mod commands;
pub mod config;
pub mod handlers;
pub mod index;
pub mod main_loop;
mod progress;
pub mod server;
mod stdin_filter;
#[cfg(feature = "test-hooks")]
mod test_hooks;
pub mod to_proto;
pub mod workspace;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

use crate::frames::FrameFilter;
use crate::options::Options;
use crate::source::anchor::LineMap;
use crate::source::paths::Resolver;

/// An open editor buffer (full sync).
#[derive(Clone, Debug)]
pub struct Doc {
    pub text: String,
    pub version: i32,
}

/// What the client can do, fixed at `initialize`.
#[derive(Clone, Debug)]
pub struct Caps {
    pub encoding: to_proto::Encoding,
    pub inlay_refresh: bool,
    pub watched_files_dynamic: bool,
    pub work_done_progress: bool,
    pub configuration: bool,
    pub pull_diagnostics: bool,
    pub disabled_code_actions: bool,
    pub code_lens_refresh: bool,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            encoding: to_proto::Encoding::Utf16,
            inlay_refresh: false,
            watched_files_dynamic: false,
            work_done_progress: false,
            configuration: false,
            pull_diagnostics: false,
            disabled_code_actions: false,
            code_lens_refresh: false,
        }
    }
}

/// The last published results; requests read only this (never wait for an analysis).
#[derive(Default)]
pub struct View {
    pub index: Arc<index::Index>,
    /// Exactly what was last pushed, per workspace file (also the pull-diagnostics answer).
    pub diagnostics: HashMap<PathBuf, Vec<tower_lsp_server::ls_types::Diagnostic>>,
    pub inlay_hints: bool,
    pub inlay_min_percent: f64,
    pub inlay_min_bytes: u64,
    pub frames: FrameFilter,
    pub encoding: to_proto::Encoding,
    /// Files edited since their findings were placed: where each indexed line is now.
    pub moved: HashMap<PathBuf, Arc<LineMap>>,
    /// The workspace index the last publish located with (the timeline locates with it too).
    pub resolver: Option<Arc<Resolver>>,
    /// The options the captures were analysed with.
    pub options: Options,
    pub code_lens: bool,
    /// Every capture with a good result, newest first.
    pub captures: Vec<PathBuf>,
}

impl View {
    /// The diagnostic the editor shows for `code` on 0-based `line0` of `file`, if any (a fix
    /// already in the text withdraws its finding's diagnostic; hints, lenses and actions follow).
    pub fn published(
        &self,
        file: &Path,
        line0: u32,
        code: crate::findings::Code,
    ) -> Option<&tower_lsp_server::ls_types::Diagnostic> {
        let code = tower_lsp_server::ls_types::NumberOrString::String(code.to_string());
        self.diagnostics
            .get(file)?
            .iter()
            .find(|d| d.range.start.line == line0 && d.code.as_ref() == Some(&code))
    }

    /// Where indexed line `line` (1-based) of `file` is in the current text; `None` when that
    /// line was edited or deleted (its findings are withdrawn until the text comes back).
    pub fn current_line(&self, file: &Path, line: u32) -> Option<u32> {
        match self.moved.get(file) {
            Some(m) => m.new_line(line),
            None => Some(line),
        }
    }

    /// The indexed lines of `file` now at lines `first..=last` (1-based), as (current line,
    /// indexed line, entry), in current order.
    pub fn lines_in(
        &self,
        file: &Path,
        first: u32,
        last: u32,
    ) -> Vec<(u32, u32, &index::LineEntry)> {
        let Some(fe) = self.index.files.get(file) else {
            return Vec::new();
        };
        let mut out: Vec<(u32, u32, &index::LineEntry)> = match self.moved.get(file) {
            None => fe
                .lines
                .range(first..=last)
                .map(|(l, e)| (*l, *l, e))
                .collect(),
            Some(m) => fe
                .lines
                .iter()
                .filter_map(|(l, e)| {
                    let now = m.new_line(*l)?;
                    (first..=last).contains(&now).then_some((now, *l, e))
                })
                .collect(),
        };
        out.sort_by_key(|x| x.0);
        out
    }

    /// The entry now at line `line` (1-based) of `file`.
    pub fn entry_at(&self, file: &Path, line: u32) -> Option<&index::LineEntry> {
        self.lines_in(file, line, line)
            .into_iter()
            .next()
            .map(|x| x.2)
    }
}

/// State shared between the owner task (the only writer) and the request handlers.
#[derive(Default)]
pub struct Shared {
    pub view: RwLock<Arc<View>>,
    pub docs: RwLock<HashMap<PathBuf, Doc>>,
    pub caps: OnceLock<Caps>,
}

impl Shared {
    pub fn view(&self) -> Arc<View> {
        self.view
            .read()
            .map(|v| v.clone())
            .unwrap_or_else(|_| Arc::new(View::default()))
    }
}

/// Run the language server on stdin/stdout until the client says `exit`.
pub fn run_stdio() -> anyhow::Result<()> {
    crate::sigbus::install();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()?;
    rt.block_on(async {
        // A message that is not JSON-RPC reaches the server as one of these requests, which
        // answer it with the JSON-RPC error (`stdin_filter`).
        let (service, socket) = tower_lsp_server::LspService::build(server::Backend::new)
            .custom_method(
                stdin_filter::PARSE_ERROR_METHOD,
                server::Backend::parse_error,
            )
            .custom_method(
                stdin_filter::INVALID_REQUEST_METHOD,
                server::Backend::invalid_request,
            )
            .finish();
        let stdin = stdin_filter::stdin();
        tower_lsp_server::Server::new(stdin, tokio::io::stdout(), socket)
            .serve(service)
            .await;
    });
    // Do not wait for a long analysis of a capture nobody will look at any more.
    rt.shutdown_timeout(std::time::Duration::from_millis(500));
    Ok(())
}
