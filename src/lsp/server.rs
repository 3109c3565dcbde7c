//! Request and notification handlers.
//!
//! Notifications only forward to the owner task (`main_loop`); requests answer from the last
//! published `View`, so a running analysis never delays a hover or an inlay hint.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tower_lsp_server::jsonrpc::Result;
use tower_lsp_server::ls_types::*;
use tower_lsp_server::{Client, LanguageServer};

use crate::lsp::commands;
use crate::lsp::handlers;
use crate::lsp::main_loop::{Event, Owner};
use crate::lsp::progress::Bar;
use crate::lsp::to_proto::{self, Encoding};
use crate::lsp::{Caps, Doc, Shared};

/// Progress tokens of `memlsp.timeline` runs.
static TIMELINES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub struct Backend {
    client: Client,
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Event>,
    /// The timeline pages drawn lately.
    pages: handlers::timeline::Pages,
}

impl Backend {
    /// Build the backend and start its owner task (needs a running tokio runtime).
    pub fn new(client: Client) -> Backend {
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let owner = Owner::new(client.clone(), shared.clone(), tx.clone());
        tokio::spawn(owner.run(rx));
        Backend {
            client,
            shared,
            tx,
            pages: Default::default(),
        }
    }

    fn send(&self, ev: Event) {
        // Fails only after shutdown, when nothing is listening any more.
        let _ = self.tx.send(ev);
    }

    /// Wait until every notification received before this request has been applied.
    async fn barrier(&self) {
        let (tx, rx) = oneshot::channel();
        self.send(Event::Barrier(tx));
        let _ = tokio::time::timeout(Duration::from_secs(1), rx).await;
    }

    fn text_of(&self, path: &Path) -> Option<String> {
        if let Ok(docs) = self.shared.docs.read() {
            if let Some(d) = docs.get(path) {
                return Some(d.text.clone());
            }
        }
        std::fs::read_to_string(path).ok()
    }

    fn caps(&self) -> Caps {
        self.shared.caps.get().cloned().unwrap_or_default()
    }
}

/// A document's path in the form the index uses (canonical when it exists).
fn doc_path(uri: &Uri) -> Option<PathBuf> {
    let p = to_proto::path(uri)?;
    Some(std::fs::canonicalize(&p).unwrap_or(p))
}

/// Exit when the editor that started us is gone (it may die without sending `exit`).
fn exit_with_parent(pid: u32) {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    if !proc_dir.exists() {
        return; // not Linux, or the pid is from another namespace: nothing reliable to poll
    }
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if !proc_dir.exists() {
                eprintln!("memlsp: the client (pid {pid}) is gone; exiting");
                std::process::exit(0);
            }
        }
    });
}

fn client_caps(c: &ClientCapabilities) -> Caps {
    let ws = c.workspace.as_ref();
    let td = c.text_document.as_ref();
    Caps {
        encoding: Encoding::negotiate(
            c.general
                .as_ref()
                .and_then(|g| g.position_encodings.as_deref()),
        ),
        inlay_refresh: ws
            .and_then(|w| w.inlay_hint.as_ref())
            .and_then(|i| i.refresh_support)
            .unwrap_or(false),
        watched_files_dynamic: ws
            .and_then(|w| w.did_change_watched_files.as_ref())
            .and_then(|d| d.dynamic_registration)
            .unwrap_or(false),
        work_done_progress: c
            .window
            .as_ref()
            .and_then(|w| w.work_done_progress)
            .unwrap_or(false),
        configuration: ws.and_then(|w| w.configuration).unwrap_or(false),
        pull_diagnostics: td.and_then(|t| t.diagnostic.as_ref()).is_some(),
        disabled_code_actions: td
            .and_then(|t| t.code_action.as_ref())
            .and_then(|a| a.disabled_support)
            .unwrap_or(false),
        code_lens_refresh: ws
            .and_then(|w| w.code_lens.as_ref())
            .and_then(|c| c.refresh_support)
            .unwrap_or(false),
    }
}

impl LanguageServer for Backend {
    async fn initialize(&self, params: InitializeParams) -> Result<InitializeResult> {
        let caps = client_caps(&params.capabilities);
        let mut roots: Vec<PathBuf> = params
            .workspace_folders
            .iter()
            .flatten()
            .filter_map(|f| to_proto::path(&f.uri))
            .collect();
        #[allow(deprecated)]
        if roots.is_empty() {
            if let Some(p) = params.root_uri.as_ref().and_then(to_proto::path) {
                roots.push(p);
            }
        }
        let roots = roots
            .into_iter()
            .map(|r| std::fs::canonicalize(&r).unwrap_or(r))
            .collect();
        if let Some(pid) = params.process_id {
            exit_with_parent(pid);
        }
        let encoding = caps.encoding;
        let _ = self.shared.caps.set(caps);
        self.send(Event::Init {
            roots,
            init_options: params.initialization_options,
        });
        Ok(InitializeResult {
            server_info: Some(ServerInfo {
                name: "memlsp".into(),
                version: Some(env!("CARGO_PKG_VERSION").into()),
            }),
            capabilities: ServerCapabilities {
                position_encoding: Some(encoding.to_proto()),
                text_document_sync: Some(TextDocumentSyncCapability::Kind(
                    TextDocumentSyncKind::FULL,
                )),
                hover_provider: Some(HoverProviderCapability::Simple(true)),
                inlay_hint_provider: Some(OneOf::Left(true)),
                code_action_provider: Some(CodeActionProviderCapability::Options(
                    CodeActionOptions {
                        code_action_kinds: Some(vec![
                            CodeActionKind::QUICKFIX,
                            CodeActionKind::REFACTOR_REWRITE,
                        ]),
                        ..Default::default()
                    },
                )),
                code_lens_provider: Some(CodeLensOptions {
                    resolve_provider: Some(false),
                }),
                execute_command_provider: Some(ExecuteCommandOptions {
                    commands: commands::OFFERED.map(String::from).to_vec(),
                    ..Default::default()
                }),
                // Push only. Offering pull as well makes Neovim 0.11 and VS Code show every
                // finding twice (one pushed, one pulled); a pull request is still answered.
                diagnostic_provider: None,
                ..Default::default()
            },
            ..Default::default()
        })
    }

    async fn initialized(&self, _: InitializedParams) {
        self.send(Event::Initialized);
    }

    async fn shutdown(&self) -> Result<()> {
        self.send(Event::Shutdown);
        Ok(())
    }

    async fn did_open(&self, p: DidOpenTextDocumentParams) {
        if let Some(path) = doc_path(&p.text_document.uri) {
            self.send(Event::Open(
                path,
                Doc {
                    text: p.text_document.text,
                    version: p.text_document.version,
                },
            ));
        }
    }

    async fn did_change(&self, p: DidChangeTextDocumentParams) {
        // Full sync: the last change holds the whole text.
        let Some(change) = p.content_changes.into_iter().last() else {
            return;
        };
        if let Some(path) = doc_path(&p.text_document.uri) {
            self.send(Event::Change(
                path,
                Doc {
                    text: change.text,
                    version: p.text_document.version,
                },
            ));
        }
    }

    async fn did_close(&self, p: DidCloseTextDocumentParams) {
        if let Some(path) = doc_path(&p.text_document.uri) {
            self.send(Event::Close(path));
        }
    }

    async fn did_change_configuration(&self, p: DidChangeConfigurationParams) {
        let v = (!p.settings.is_null()).then_some(p.settings);
        self.send(Event::ConfigChanged(v));
    }

    async fn did_change_watched_files(&self, p: DidChangeWatchedFilesParams) {
        // Created, changed and deleted are handled alike: the owner stats each path.
        let paths = p
            .changes
            .iter()
            .filter_map(|c| to_proto::path(&c.uri))
            .collect();
        self.send(Event::Paths(paths));
    }

    async fn hover(&self, p: HoverParams) -> Result<Option<Hover>> {
        let Some(path) = doc_path(&p.text_document_position_params.text_document.uri) else {
            return Ok(None);
        };
        Ok(handlers::hover::hover(&self.shared.view(), &path, &p))
    }

    async fn inlay_hint(&self, p: InlayHintParams) -> Result<Option<Vec<InlayHint>>> {
        let Some(path) = doc_path(&p.text_document.uri) else {
            return Ok(None);
        };
        // Hints are placed against the buffer the client has now.
        self.barrier().await;
        let text = self.text_of(&path).unwrap_or_default();
        Ok(Some(handlers::inlay_hint::inlay_hints(
            &self.shared.view(),
            &path,
            &text,
            &p,
        )))
    }

    async fn diagnostic(
        &self,
        p: DocumentDiagnosticParams,
    ) -> Result<DocumentDiagnosticReportResult> {
        let path = doc_path(&p.text_document.uri);
        Ok(handlers::diagnostic::diagnostic(
            &self.shared.view(),
            path.as_deref(),
        ))
    }

    async fn code_action(&self, p: CodeActionParams) -> Result<Option<CodeActionResponse>> {
        let Some(path) = doc_path(&p.text_document.uri) else {
            return Ok(None);
        };
        self.barrier().await;
        let Some(text) = self.text_of(&path) else {
            return Ok(None);
        };
        Ok(Some(handlers::code_action::code_actions(
            &self.shared.view(),
            &path,
            &text,
            &p,
            &|f| self.text_of(f),
            self.caps().disabled_code_actions,
        )))
    }

    async fn code_lens(&self, p: CodeLensParams) -> Result<Option<Vec<CodeLens>>> {
        let Some(path) = doc_path(&p.text_document.uri) else {
            return Ok(None);
        };
        self.barrier().await;
        Ok(Some(handlers::code_lens::code_lenses(
            &self.shared.view(),
            &path,
        )))
    }

    async fn execute_command(&self, p: ExecuteCommandParams) -> Result<Option<LSPAny>> {
        match p.command.as_str() {
            commands::TIMELINE => {
                let arg = p.arguments.first().cloned().unwrap_or(Value::Null);
                let view = self.shared.view();
                let capture = handlers::timeline::target(&view, &arg)
                    .map_err(tower_lsp_server::jsonrpc::Error::invalid_params)?;
                // The same capture, options and workspace index as a page drawn lately: that page.
                let key = handlers::timeline::Key::of(&view, &capture);
                if let Some(page) = key.as_ref().and_then(|k| self.pages.get(k)) {
                    return Ok(Some(page));
                }
                // Analysing a capture takes a while: on a worker, never on the request loop,
                // with a progress bar where it lasts.
                let read = crate::analyze::reading_progress(&capture);
                let progress = read.as_ref().map(|r| r.0.clone()).unwrap_or_default();
                let title = format!(
                    "memlsp: timeline of {}",
                    crate::report::capture_name(&capture)
                );
                let job = tokio::task::spawn_blocking(move || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        handlers::timeline::page(&view, &capture, progress)
                    }))
                    .unwrap_or_else(|_| {
                        Err(format!(
                            "memlsp.timeline: {}: rendering the page failed; please report this with the capture",
                            capture.display()
                        ))
                    })
                });
                let bar = Bar {
                    client: &self.client,
                    shown: self.caps().work_done_progress,
                    token: ProgressToken::String(format!(
                        "memlsp/timeline/{}",
                        TIMELINES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    )),
                    title,
                    read,
                    simulating: Default::default(),
                };
                match bar.wait(job).await {
                    Ok(Ok(v)) => {
                        if let Some(k) = key.filter(|k| k.unchanged()) {
                            self.pages.put(k, v.clone());
                        }
                        Ok(Some(v))
                    }
                    Ok(Err(msg)) => {
                        let mut e = tower_lsp_server::jsonrpc::Error::internal_error();
                        e.message = msg.into();
                        Err(e)
                    }
                    Err(e) => Err(tower_lsp_server::jsonrpc::Error::invalid_params(
                        e.to_string(),
                    )),
                }
            }
            commands::REANALYZE => {
                self.pages.clear();
                let (tx, rx) = oneshot::channel();
                self.send(Event::Reanalyze(Some(tx)));
                let n = tokio::time::timeout(Duration::from_secs(5), rx)
                    .await
                    .ok()
                    .and_then(|r| r.ok())
                    .unwrap_or(0);
                Ok(Some(json!({ "captures": n })))
            }
            commands::EXPLAIN => {
                let arg = p.arguments.first().cloned().unwrap_or(Value::Null);
                let title = arg.get("title").and_then(Value::as_str).unwrap_or("");
                let url = arg.get("url").and_then(Value::as_str).unwrap_or("");
                self.client
                    .show_message(MessageType::INFO, format!("memlsp: {title} ({url})"))
                    .await;
                Ok(None)
            }
            other => Err(tower_lsp_server::jsonrpc::Error::invalid_params(format!(
                "unknown command {other}"
            ))),
        }
    }
}
