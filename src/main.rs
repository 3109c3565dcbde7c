fn main() {
    // The CLI (`--check`, `report`) is wired by the CLI front end; no arguments or `lsp` start
    // the language server on stdio.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args[0] == "lsp" {
        if let Err(e) = memlsp::lsp::run_stdio() {
            eprintln!("memlsp: {e:#}");
            std::process::exit(2);
        }
        return;
    }
    std::process::exit(0);
}
