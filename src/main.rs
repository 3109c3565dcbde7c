use memlsp::cli::Run;

fn main() {
    let code = match memlsp::cli::run() {
        Run::Exit(code) => code,
        // A server analyses capture after capture for hours: keep its heap from fragmenting.
        Run::Lsp => {
            memlsp::process_memory::tune_allocator();
            served(memlsp::lsp::run_stdio())
        }
        Run::Mcp(args) => {
            memlsp::process_memory::tune_allocator();
            let config = memlsp::mcp::Config {
                roots: args.roots,
                allow_outside: args.allow_outside,
                budget: memlsp::mcp::Budget::default().with(
                    args.budget_bytes,
                    args.budget_captures,
                    args.budget_seconds,
                ),
            };
            served(memlsp::mcp::run_stdio(config))
        }
    };
    std::process::exit(code);
}

/// A server's exit status: 0 when the client closed it, else 2 with the error on one line.
fn served(result: anyhow::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("memlsp: {e:#}");
            2
        }
    }
}
