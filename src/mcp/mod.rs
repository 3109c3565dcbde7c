//! `memlsp mcp`: a Model Context Protocol server on stdio, for coding agents (the only module that
//! sees `rmcp`).
//!
//! Tools (`tools.rs`), each answering with the JSON of the other front ends as structured content
//! and a few lines of text:
//! - `analyze` — `memlsp report PATH --format json`;
//! - `explain_line` — what every capture of the workspace (scanned like `--check`) says about one
//!   line of one file;
//! - `diff` — `memlsp report EARLIER --diff LATER` (PT011);
//! - `compare_ranks` — `memlsp report DIR` on per-rank snapshots: the comparison rows and each
//!   rank's headline;
//! - `check_baseline` — `memlsp --check PATHS --baseline FILE`: passed or not, the BL001 findings.
//!
//! Resources (`pages.rs`): every finding code's page, `memlsp://findings/<CODE>`, compiled in.
//!
//! Analyses run on blocking threads, never on the executor; a capture that cannot be read is a
//! tool error carrying the one-line `CaptureError`, and the server keeps serving. A request the
//! client cancels raises the pipeline's cancel flag.
//!
//! Tools read only under the server's roots and spend at most a per-call budget of bytes,
//! captures and seconds (`confine.rs`).

mod confine;
mod pages;
mod tools;
mod transport;
mod views;

pub use confine::{Budget, Config};

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};

use crate::options::Cancel;

/// What an agent is told when it connects.
const INSTRUCTIONS: &str = "memlsp reads GPU memory captures (PyTorch CUDA snapshots *.pickle, JAX \
profiler captures *.xplane.pb) and pins memory to Python source lines. Every number is labelled \
measured, read, inferred or simulated. `analyze` explains one capture (or a directory of per-rank \
snapshots); `explain_line` says what the workspace's captures say about one line of a Python file; \
`diff` shows what grew between two snapshots of one run; `compare_ranks` compares per-rank \
snapshots; `check_baseline` checks captures against a recorded baseline like CI does. Relative paths \
are taken from the workspace (default: the server's directory). Paths outside the server's roots \
are refused, and each call has a budget of bytes, captures and seconds; an answer cut short by it \
says so (`budget` in the structured content). Each finding code's page is the resource \
memlsp://findings/<CODE>.";

/// The server: its directory (the default workspace), where it may read, each call's budget, and
/// the reports it already made.
#[derive(Clone)]
pub struct Server {
    cwd: PathBuf,
    roots: Arc<confine::Roots>,
    budget: Budget,
    cache: Arc<tools::Cache>,
}

impl Server {
    /// A server in `cwd` with `config`; `Err` (one line) when a root is not a directory.
    pub fn new(cwd: PathBuf, config: &Config) -> Result<Server, String> {
        Ok(Server {
            roots: Arc::new(confine::Roots::new(config, &cwd)?),
            cwd,
            budget: config.budget,
            cache: Arc::default(),
        })
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(
            Implementation::new("memlsp", crate::present::json::VERSION)
                .with_title("memlsp: GPU memory pinned to Python lines"),
        )
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::list()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if !tools::NAMES.contains(&name.as_str()) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{name}` (tools: {})", tools::NAMES.join(", ")),
                None,
            ));
        }
        let args = request.arguments.unwrap_or_default();
        let cancel = Cancel::new();
        let meter = confine::Meter::new(self.budget);
        let ctx = tools::Ctx {
            cwd: self.cwd.clone(),
            cancel: cancel.clone(),
            cache: self.cache.clone(),
            roots: self.roots.clone(),
            meter: meter.clone(),
        };
        let mut work = tokio::task::spawn_blocking(move || tools::call(&name, args, &ctx));
        let joined = |j: Result<Result<tools::Output, String>, tokio::task::JoinError>| match j {
            Ok(r) => r,
            Err(e) => Err(format!(
                "internal error: the analysis stopped ({e}); please report it"
            )),
        };
        let result = tokio::select! {
            j = &mut work => joined(j),
            () = context.ct.cancelled() => {
                // The worker stops at its next progress point; nobody reads its answer.
                cancel.cancel();
                Err("the request was cancelled".to_string())
            }
            () = tokio::time::sleep(meter.timeout()) => {
                // Out of time: the worker stops at its next progress point and answers with what
                // it has (a scan) or the budget's message.
                meter.expire();
                cancel.cancel();
                match tokio::time::timeout(std::time::Duration::from_secs(10), work).await {
                    Ok(j) => joined(j),
                    Err(_) => Err(meter.time_message()),
                }
            }
        };
        Ok(CallToolResponse::from(match result {
            Ok(out) => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(out.summary)]);
                r.structured_content = Some(out.structured);
                r
            }
            Err(message) => CallToolResult::error(vec![ContentBlock::text(message)]),
        }))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(pages::list()))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        pages::read(&request.uri)
            .map(ReadResourceResponse::from)
            .ok_or_else(|| {
                ErrorData::resource_not_found(
                    format!(
                        "{}: no such resource (finding pages are memlsp://findings/<CODE>, e.g. \
                         memlsp://findings/{})",
                        request.uri,
                        crate::findings::Code::ALL[0]
                    ),
                    None,
                )
            })
    }
}

/// Serve MCP on stdin/stdout until the client closes stdin.
pub fn run_stdio(config: Config) -> anyhow::Result<()> {
    // Captures are memory-mapped; survive one being truncated under the reader.
    crate::sigbus::install();
    let cwd = std::env::current_dir()?;
    let server = Server::new(cwd, &config).map_err(|e| anyhow::anyhow!(e))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()?;
    rt.block_on(async {
        // Pipes (how clients start a stdio server) go through the reactor, not the blocking pool
        // the analyses run on.
        // Stdin is read line by line on a thread of its own, every line answered
        // (`transport.rs`); stdout is rmcp's non-blocking pipe writer.
        let (_, out) = rmcp::transport::stdio_pipes();
        let input = std::io::BufReader::new(std::io::stdin());
        let service = server
            .serve(transport::Stdio::new(input, out))
            .await
            .map_err(|e| anyhow::anyhow!("MCP initialisation failed: {e}"))?;
        service.waiting().await?;
        anyhow::Ok(())
    })?;
    // Do not wait for a long analysis nobody will read any more.
    rt.shutdown_timeout(std::time::Duration::from_millis(500));
    Ok(())
}
