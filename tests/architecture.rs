//! The architecture, as a test (rust-analyzer's `tidy.rs` style): reads `src/` and fails on an
//! import that goes up a layer, on LSP, MCP, clap or tokio outside their presenters, and on a finding
//! code written as a string outside `src/findings.rs`. The layers and the allowed directions are
//! the table below and the one in `docs/ARCHITECTURE.md`; keep both in step.

use std::path::{Path, PathBuf};

/// Layers, bottom first. A module may import its own layer and the layers below.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "foundation",
        &[
            "error",
            "options",
            "findings",
            "frames",
            "site",
            "hugepages",
            "sigbus",
            "timings",
        ],
    ),
    ("model", &["torch::model"]),
    (
        "decode",
        &[
            "pickle",
            "torch::load",
            "torch::budget",
            "torch::intern",
            "xla::pb",
            "xla::wire",
            "xla::space",
            "xla::hlo",
            "xla::capture",
        ],
    ),
    ("analyse", &["torch", "xla"]),
    ("report", &["report"]),
    ("compare", &["baseline"]),
    ("locate", &["source"]),
    ("pipeline", &["analyze"]),
    ("present", &["present", "cli", "lsp", "mcp"]),
];

/// Modules of one layer that must not import each other: the engines, the presenters.
const SIBLINGS: &[(&str, &str)] = &[
    ("torch", "xla"),
    ("xla", "torch"),
    ("cli", "lsp"),
    ("lsp", "cli"),
    ("cli", "mcp"),
    ("mcp", "cli"),
    ("lsp", "mcp"),
    ("mcp", "lsp"),
];

/// Crates only some presenters may use.
const CONFINED: &[(&str, &[&str])] = &[
    ("tower_lsp_server", &["lsp"]),
    ("ls_types", &["lsp"]),
    ("tokio", &["lsp", "mcp"]),
    ("rmcp", &["mcp"]),
    ("clap", &["cli"]),
];

/// The layer of a module path (`xla::plan`), by longest listed prefix.
fn layer(module: &str) -> Option<(usize, &'static str)> {
    let mut best: Option<(usize, &'static str, usize)> = None;
    for (i, (_, mods)) in LAYERS.iter().enumerate() {
        for m in mods.iter() {
            let hit = module == *m || module.starts_with(&format!("{m}::"));
            if hit && best.is_none_or(|b| m.len() > b.2) {
                best = Some((i, m, m.len()));
            }
        }
    }
    best.map(|(i, m, _)| (i, m))
}

/// Source with comments removed and string/char literals emptied, line breaks kept.
fn code_only(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == '*' && b[i + 1] == '/') {
                if b[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&b, i) {
            // Raw string: r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match b.get(j) {
                    None => break,
                    Some('"') if (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some('\n') => out.push('\n'),
                    _ => {}
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                if b.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && b.get(i + 2) == Some(&'\'') {
            out.push_str("' '");
            i += 3;
        } else if c == '\'' && next == Some('\\') {
            // '\n', '\u{…}'
            let mut j = i + 2;
            while j < b.len() && b[j] != '\'' {
                j += 1;
            }
            out.push_str("' '");
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

/// The part of a file outside its test module: up to the first `#[cfg(test)]` at the start of a
/// line that opens an inline module (`mod tests {`). A test module declared in its own file
/// (`#[cfg(test)]\nmod presenter_tests;`) does not hide the rest of the file.
fn non_test(code: &str) -> &str {
    let mut from = 0;
    while let Some(off) = code[from..].find("\n#[cfg(test)]") {
        let at = from + off;
        let rest = code[at + "\n#[cfg(test)]".len()..].trim_start();
        let item = rest.split(['{', ';']).next().unwrap_or("");
        let declared_elsewhere =
            item.trim_start().starts_with("mod ") && rest[item.len()..].starts_with(';');
        if !declared_elsewhere {
            return &code[..at];
        }
        from = at + 1;
    }
    code
}

/// Module path of a file under `src/` (`src/xla/mod.rs` → `xla`, `src/lib.rs` → ``).
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
        parts.pop();
    }
    parts.join("::")
}

/// Every `crate::…` / `super::…` path in `code` as an absolute module path, with its line.
fn imports(code: &str, module: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let ident = |i: usize| -> (String, usize) {
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        (code[i..j].to_string(), j)
    };
    // The path after `at` (`a::b::{c, d::e}`), as segment lists.
    fn path_after(code: &str, at: usize) -> Vec<Vec<String>> {
        let b = code.as_bytes();
        let mut segs: Vec<String> = Vec::new();
        let mut i = at;
        loop {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if i < b.len() && b[i] == b'{' {
                // Top-level items of the group.
                let mut depth = 0;
                let mut start = i + 1;
                let mut groups = Vec::new();
                for j in i..b.len() {
                    match b[j] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                groups.push(code[start..j].to_string());
                                break;
                            }
                        }
                        b',' if depth == 1 => {
                            groups.push(code[start..j].to_string());
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
                let mut out = Vec::new();
                for g in groups {
                    let g = g.trim();
                    if g.is_empty() {
                        continue;
                    }
                    for tail in path_after(g, 0) {
                        let mut p = segs.clone();
                        p.extend(tail);
                        out.push(p);
                    }
                }
                return out;
            }
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            if j == i {
                break;
            }
            segs.push(code[i..j].to_string());
            if code[j..].starts_with("::") {
                i = j + 2;
            } else {
                break;
            }
        }
        vec![segs]
    }
    let parent = |m: &str, up: usize| -> String {
        let mut parts: Vec<&str> = if m.is_empty() {
            vec![]
        } else {
            m.split("::").collect()
        };
        // `super` is the parent module, for `x.rs` and `x/mod.rs` alike.
        for _ in 0..up {
            parts.pop();
        }
        parts.join("::")
    };
    for (idx, _) in code.match_indices("crate::") {
        if idx > 0
            && (b[idx - 1].is_ascii_alphanumeric() || b[idx - 1] == b'_' || b[idx - 1] == b'$')
        {
            continue;
        }
        let line = code[..idx].matches('\n').count() + 1;
        for p in path_after(code, idx + "crate::".len()) {
            if !p.is_empty() {
                out.push((line, p.join("::")));
            }
        }
    }
    let mut i = 0;
    while let Some(off) = code[i..].find("super::") {
        let idx = i + off;
        i = idx + 1;
        if idx > 0
            && (b[idx - 1].is_ascii_alphanumeric() || b[idx - 1] == b'_' || b[idx - 1] == b':')
        {
            continue;
        }
        let line = code[..idx].matches('\n').count() + 1;
        let mut up = 0;
        let mut j = idx;
        while code[j..].starts_with("super::") {
            up += 1;
            j += "super::".len();
        }
        let (first, _) = ident(j);
        let base = parent(module, up);
        for p in path_after(code, j) {
            let joined = if base.is_empty() {
                p.join("::")
            } else if p.is_empty() || first.is_empty() {
                base.clone()
            } else {
                format!("{base}::{}", p.join("::"))
            };
            out.push((line, joined));
        }
    }
    out
}

/// Every rule violation in one file's text (`rel` is its path under `src/`).
fn violations(rel: &Path, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let module = module_of(rel);
    let shown = format!("src/{}", rel.display());
    let is_test_file = rel
        .file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with("_tests.rs"));
    let code = code_only(text);
    let code = if is_test_file { "" } else { non_test(&code) };
    let Some((from, from_name)) = layer(&module).or(if module.is_empty() {
        Some((usize::MAX, "crate root"))
    } else {
        None
    }) else {
        out.push(format!(
            "{shown}: module `{module}` has no layer: add it to LAYERS in tests/architecture.rs and to docs/ARCHITECTURE.md"
        ));
        return out;
    };
    for (line, target) in imports(code, &module) {
        let Some((to, to_name)) = layer(&target) else {
            continue; // a macro or an item of the crate root
        };
        if from != usize::MAX && to > from {
            out.push(format!(
                "{shown}:{line}: `crate::{target}` goes up from {} (`{from_name}`) to {} (`{to_name}`); data flows decode → model → analyse → locate → present: move the shared piece down, or pass the data in",
                LAYERS[from].0, LAYERS[to].0
            ));
        }
        for (a, b) in SIBLINGS {
            let top = module.split("::").next().unwrap_or("");
            let target_top = target.split("::").next().unwrap_or("");
            if top == *a
                && target_top == *b
                && from_name != to_name
                && layer(&target).is_some_and(|l| l.0 == from)
            {
                out.push(format!(
                    "{shown}:{line}: `{a}` imports `crate::{target}`: the {} must not depend on each other",
                    if matches!(*a, "cli" | "lsp" | "mcp") { "presenters" } else { "engines" }
                ));
            }
        }
    }
    let top = module.split("::").next().unwrap_or("");
    for (krate, homes) in CONFINED {
        if !homes.contains(&top) {
            for (n, l) in code.lines().enumerate() {
                let hit = l.match_indices(krate).any(|(i, _)| {
                    let before = l[..i].chars().next_back();
                    let after = &l[i + krate.len()..];
                    before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                        && after.starts_with("::")
                });
                if hit {
                    out.push(format!(
                        "{shown}:{}: `{krate}` is used outside {}: only {} may know it",
                        n + 1,
                        homes
                            .iter()
                            .map(|h| format!("`src/{h}`"))
                            .collect::<Vec<_>>()
                            .join(" and "),
                        if homes.len() == 1 {
                            "that presenter"
                        } else {
                            "those presenters"
                        }
                    ));
                }
            }
        }
    }
    if rel != Path::new("findings.rs") {
        // Codes as strings, in the text with literals intact but outside tests.
        let raw = if is_test_file { "" } else { non_test(text) };
        for (n, l) in raw.lines().enumerate() {
            if l.trim_start().starts_with("//") {
                continue;
            }
            let bytes = l.as_bytes();
            for (i, _) in l.match_indices('"') {
                let rest = &bytes[i + 1..];
                let code = rest.len() >= 6
                    && matches!(&rest[..2], b"PT" | b"JX" | b"BL")
                    && rest[2..5].iter().all(u8::is_ascii_digit)
                    && rest[5] == b'"';
                if code {
                    out.push(format!(
                        "{shown}:{}: a finding code written as a string: use `findings::Code`",
                        n + 1
                    ));
                }
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn layers_point_one_way_and_presenter_crates_stay_home() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(files.len() > 40, "{} files", files.len());
    let mut all = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let text = std::fs::read_to_string(f).unwrap();
        all.extend(violations(rel, &text));
    }
    assert!(all.is_empty(), "{}", all.join("\n"));
}

/// The checker itself catches what it must (this is how a new upward import fails the build).
#[test]
fn the_checker_catches_each_kind_of_violation() {
    let v = violations(
        Path::new("torch/sites.rs"),
        "use crate::cli::render_text;\nuse super::model::Snapshot;\n",
    );
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("src/torch/sites.rs:1: `crate::cli::render_text` goes up from analyse")
    );
    let v = violations(
        Path::new("xla/plan.rs"),
        "use crate::{findings::Code, source::locate};\n",
    );
    assert_eq!(v.len(), 1, "{v:?}");
    let v = violations(Path::new("xla/space.rs"), "use super::plan::Plan;\n");
    assert_eq!(v.len(), 1, "decode may not import the analyses: {v:?}");
    let v = violations(
        Path::new("torch/mod.rs"),
        "fn f() { crate::xla::analyse(); }\n",
    );
    assert!(v.iter().any(|m| m.contains("engines")), "{v:?}");
    let v = violations(
        Path::new("report.rs"),
        "fn f() -> tokio::task::JoinHandle<()> {}\n",
    );
    assert!(
        v.iter().any(|m| m.contains("`tokio` is used outside")),
        "{v:?}"
    );
    let v = violations(
        Path::new("cli/report.rs"),
        "fn f() { rmcp::serve_server(); crate::mcp::run_stdio(); }\n",
    );
    assert!(
        v.iter()
            .any(|m| m.contains("`rmcp` is used outside `src/mcp`")),
        "{v:?}"
    );
    assert!(v.iter().any(|m| m.contains("presenters")), "{v:?}");
    let v = violations(
        Path::new("mcp/tools.rs"),
        "fn f() -> tokio::task::JoinHandle<()> { crate::lsp::run_stdio() }\n",
    );
    assert_eq!(v.len(), 1, "tokio is allowed in mcp, lsp is not: {v:?}");
    let v = violations(
        Path::new("cli/mod.rs"),
        "mod check;\n#[cfg(test)]\nmod presenter_tests;\nfn f() { crate::lsp::run_stdio(); }\n",
    );
    assert!(
        v.iter().any(|m| m.contains("presenters")),
        "a test module in its own file hides nothing after it: {v:?}"
    );
    let v = violations(Path::new("torch/patterns.rs"), "let c = \"PT002\";\n");
    assert!(v.iter().any(|m| m.contains("finding code")), "{v:?}");
    // Comments, strings and the test module do not count.
    let v = violations(
        Path::new("torch/sites.rs"),
        "// use crate::cli;\nlet s = \"crate::lsp::x\";\n#[cfg(test)]\nmod tests { use crate::cli::x; const C: &str = \"PT001\"; }\n",
    );
    assert!(v.is_empty(), "{v:?}");
}
