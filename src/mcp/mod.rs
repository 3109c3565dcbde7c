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

mod pages;
mod tools;
mod transport;

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
are taken from the workspace (default: the server's directory). Each finding code's page is the \
resource memlsp://findings/<CODE>.";

/// The server: its directory (the default workspace) and the reports it already made.
#[derive(Clone)]
pub struct Server {
    cwd: PathBuf,
    cache: Arc<tools::Cache>,
}

impl Server {
    pub fn new(cwd: PathBuf) -> Server {
        Server {
            cwd,
            cache: Arc::default(),
        }
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
        let ctx = tools::Ctx {
            cwd: self.cwd.clone(),
            cancel: cancel.clone(),
            cache: self.cache.clone(),
        };
        let work = tokio::task::spawn_blocking(move || tools::call(&name, args, &ctx));
        let result = tokio::select! {
            joined = work => match joined {
                Ok(r) => r,
                Err(e) => Err(format!("internal error: the analysis stopped ({e}); please report it")),
            },
            () = context.ct.cancelled() => {
                // The worker stops at its next progress point; nobody reads its answer.
                cancel.cancel();
                Err("the request was cancelled".to_string())
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
pub fn run_stdio() -> anyhow::Result<()> {
    // Captures are memory-mapped; survive one being truncated under the reader.
    crate::sigbus::install();
    let cwd = std::env::current_dir()?;
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
        let service = Server::new(cwd)
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
