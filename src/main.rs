fn main() {
    std::process::exit(memlsp::cli::main());
}
