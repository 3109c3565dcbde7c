//! The architecture, as a test (rust-analyzer's `tidy.rs` style): reads `src/` and fails on an
//! import that goes up a layer, on LSP, MCP, clap or tokio outside their presenters, on a finding
//! code written as a string outside `src/findings.rs`, on a front end (`src/cli`, `src/lsp`,
//! `src/mcp`) that words a finding itself instead of calling `src/present`, and on an import
//! circle between files. The layers and the allowed directions are the table below and the one
//! in `docs/ARCHITECTURE.md`; keep both in step.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "architecture/sizes.rs"]
mod sizes;

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
            "process_memory",
            "sigbus",
            "test_rng",
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

/// Modules of one layer that must not import each other: the engines, the presenters; and the
/// renderings (`present`) know no front end.
const SIBLINGS: &[(&str, &str)] = &[
    ("torch", "xla"),
    ("xla", "torch"),
    ("cli", "lsp"),
    ("lsp", "cli"),
    ("cli", "mcp"),
    ("mcp", "cli"),
    ("lsp", "mcp"),
    ("mcp", "lsp"),
    ("present", "cli"),
    ("present", "lsp"),
    ("present", "mcp"),
];

/// Crates only some presenters may use.
const CONFINED: &[(&str, &[&str])] = &[
    ("tower_lsp_server", &["lsp"]),
    ("ls_types", &["lsp"]),
    ("tokio", &["lsp", "mcp"]),
    ("rmcp", &["mcp"]),
    ("clap", &["cli"]),
];

/// The front ends: they choose a format and write what `src/present` rendered.
const FRONT_ENDS: &[&str] = &["cli", "lsp", "mcp"];

/// Calls that build text: a front end's arguments to them may not read what a finding says.
const FORMATTERS: &[&str] = &[
    "format!",
    "format_args!",
    "write!",
    "writeln!",
    "print!",
    "println!",
    "eprint!",
    "eprintln!",
    ".push_str",
];

/// What a finding (its evidence, fixes) or a site says, and a report's headline: the fields of
/// `Finding`, `Evidence`, `Fix` and `Site` that a rendering shows. `bytes` is left out: budgets
/// and sizes of files have one too.
const FINDING_WORDS: &[&str] = &[
    "message",
    "severity",
    "code",
    "evidence",
    "fixes",
    "title",
    "text",
    "scope",
    "stack",
    "location",
    "percent",
    "percent_of",
    "bytes_label",
    "label",
    "blocks",
    "role",
    "reference_line",
    "carried_by",
    "headline",
];

/// Each `(line, field)` where `code` (comments and literals removed) reads one of
/// [`FINDING_WORDS`] as `.field` inside the parenthesised arguments of one of [`FORMATTERS`].
fn formats_a_finding(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    for f in FORMATTERS {
        for (at, _) in code.match_indices(f) {
            // A whole name: `format!`, not `eformat!`.
            if !f.starts_with('.') && code[..at].chars().next_back().is_some_and(word) {
                continue;
            }
            let rest = &code[at + f.len()..];
            let gap = rest.len() - rest.trim_start().len();
            if !rest[gap..].starts_with('(') {
                continue;
            }
            let from = at + f.len() + gap + 1;
            let mut depth = 1;
            let mut to = code.len();
            for (i, c) in code[from..].char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            to = from + i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let args = &code[from..to];
            for (i, _) in args.match_indices('.') {
                let name: String = args[i + 1..].chars().take_while(|c| word(*c)).collect();
                if FINDING_WORDS.contains(&name.as_str()) {
                    let line = code[..from + i].matches('\n').count() + 1;
                    out.push((line, name));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

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
        // Only an inline test module (`mod tests {`) ends the code; a test module declared in
        // its own file, or a single test-only item (`#[cfg(test)] fn …`), hides nothing after it.
        let unvisible = item.trim_start().strip_prefix("pub").map_or(item, |v| {
            let v = v.trim_start();
            v.strip_prefix('(')
                .and_then(|v| v.split_once(')'))
                .map_or(v, |(_, v)| v)
        });
        let inline_module =
            unvisible.trim_start().starts_with("mod ") && rest[item.len()..].starts_with('{');
        if inline_module {
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

/// The path after `at` (`a::b::{c, d::e}`), as segment lists.
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
                out.push(match *a {
                    "present" => format!(
                        "{shown}:{line}: `present` imports `crate::{target}`: a rendering knows no front end; pass it what it shows"
                    ),
                    _ => format!(
                        "{shown}:{line}: `{a}` imports `crate::{target}`: the {} must not depend on each other",
                        if matches!(*a, "cli" | "lsp" | "mcp") { "presenters" } else { "engines" }
                    ),
                });
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
    if FRONT_ENDS.contains(&top) {
        for (line, field) in formats_a_finding(code) {
            out.push(format!(
                "{shown}:{line}: a front end formats a finding itself (`.{field}` in a formatting call): render it in `src/present` (one file per format) and write what that returns"
            ));
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

/// The file-module that owns `path` (`lsp::server::CMD` → `lsp::server`): its longest prefix
/// that is a file under `src/`.
fn owner<'a>(path: &str, modules: &'a BTreeSet<String>) -> Option<&'a String> {
    let mut p = path;
    loop {
        if let Some(m) = modules.get(p) {
            return Some(m);
        }
        p = &p[..p.rfind("::")?];
    }
}

/// The other files one file's non-test code uses, with the line of each use: every `crate::`
/// and `super::` path, and every path through a module it imported by name (`use
/// crate::lsp::handlers;` … `handlers::code_action::code_actions(…)`). A file's own ancestors
/// and descendants do not count: a parent declares its children and they use what it defines.
fn file_uses(rel: &Path, text: &str, modules: &BTreeSet<String>) -> BTreeMap<String, usize> {
    let module = module_of(rel);
    let code = code_only(text);
    let code = non_test(&code);
    let direct = imports(code, &module);
    let mut uses: Vec<(usize, String)> = direct.clone();
    // Modules imported by name: the last segment (`self` stands for its parent) is a file-module.
    let mut named: BTreeMap<String, String> = BTreeMap::new();
    for (_, target) in &direct {
        let target = target.strip_suffix("::self").unwrap_or(target);
        if owner(target, modules).is_some_and(|m| m == target) {
            if let Some(last) = target.rsplit("::").next() {
                named.insert(last.to_string(), target.to_string());
            }
        }
    }
    let b = code.as_bytes();
    for (name, target) in &named {
        let needle = format!("{name}::");
        for (idx, _) in code.match_indices(&needle) {
            if idx > 0
                && (b[idx - 1].is_ascii_alphanumeric() || b[idx - 1] == b'_' || b[idx - 1] == b':')
            {
                continue;
            }
            let line = code[..idx].matches('\n').count() + 1;
            for p in path_after(code, idx + needle.len()) {
                uses.push((line, format!("{target}::{}", p.join("::"))));
            }
        }
    }
    let related = |other: &str| {
        other == module
            || other.is_empty()
            || module.is_empty()
            || module.starts_with(&format!("{other}::"))
            || other.starts_with(&format!("{module}::"))
    };
    let mut out = BTreeMap::new();
    for (line, target) in uses {
        if let Some(m) = owner(target.trim_end_matches("::"), modules) {
            if !related(m) {
                let first = out.entry(m.clone()).or_insert(line);
                *first = (*first).min(line);
            }
        }
    }
    out
}

/// Import circles between files: for each, the files around it, each with the line where it
/// uses the next (`src/a.rs:3 → src/b.rs:9 → src/a.rs`).
fn circles(files: &[(PathBuf, String)]) -> Vec<String> {
    let modules: BTreeSet<String> = files.iter().map(|(rel, _)| module_of(rel)).collect();
    let file_of: BTreeMap<String, &PathBuf> =
        files.iter().map(|(rel, _)| (module_of(rel), rel)).collect();
    let graph: BTreeMap<String, BTreeMap<String, usize>> = files
        .iter()
        .map(|(rel, text)| (module_of(rel), file_uses(rel, text, &modules)))
        .collect();
    // The shortest way from `from` back to `to`, breadth first.
    let way = |from: &str, to: &str| -> Option<Vec<String>> {
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([from.to_string()]);
        while let Some(m) = queue.pop_front() {
            if m == to {
                let mut path = vec![m];
                while let Some(p) = prev.get(path.last().unwrap()) {
                    path.push(p.clone());
                }
                path.reverse();
                return Some(path);
            }
            for next in graph.get(&m).into_iter().flat_map(|e| e.keys()) {
                if next != from && !prev.contains_key(next) {
                    prev.insert(next.clone(), m.clone());
                    queue.push_back(next.clone());
                }
            }
        }
        None
    };
    let mut seen: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut out = Vec::new();
    for (a, uses) in &graph {
        for b in uses.keys() {
            let Some(back) = way(b, a) else { continue };
            let mut ring: Vec<String> = std::iter::once(a.clone()).chain(back).collect();
            let mut key = ring[..ring.len() - 1].to_vec();
            key.sort();
            if !seen.insert(key) {
                continue;
            }
            let shown: Vec<String> = ring
                .windows(2)
                .map(|w| format!("src/{}:{}", file_of[&w[0]].display(), graph[&w[0]][&w[1]]))
                .collect();
            let last = ring.pop().unwrap();
            out.push(format!(
                "import circle: {} → src/{}: move what both need into a module both import",
                shown.join(" → "),
                file_of[&last].display()
            ));
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
    let mut texts = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let text = std::fs::read_to_string(f).unwrap();
        all.extend(violations(rel, &text));
        texts.push((rel.to_path_buf(), text));
    }
    all.extend(circles(&texts));
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
    let v = violations(
        Path::new("cli/mod.rs"),
        "#[cfg(test)]\nfn helper() {}\nfn f() { crate::lsp::run_stdio(); }\n#[cfg(test)]\npub(crate) mod tests { fn g() { crate::lsp::run_stdio(); } }\n",
    );
    assert_eq!(
        v.len(),
        1,
        "a test-only function hides nothing after it, an inline test module does: {v:?}"
    );
    // A front end that words a finding itself; the same words in `src/present` are its job.
    let plant = "fn f(f: &Finding) -> String {\n    format!(\n        \"{}: {}\",\n        f.code,\n        md(&f.message)\n    )\n}\n";
    let v = violations(Path::new("mcp/tools.rs"), plant);
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(
        v[0].starts_with("src/mcp/tools.rs:4: a front end formats a finding itself (`.code`"),
        "{v:?}"
    );
    assert!(v[1].starts_with("src/mcp/tools.rs:5:"), "{v:?}");
    let v = violations(
        Path::new("lsp/to_proto.rs"),
        "fn f(md: &mut String, s: &Site) { md.push_str(&pct(s.percent_of)); }\n",
    );
    assert_eq!(v.len(), 1, "{v:?}");
    let v = violations(
        Path::new("cli/report.rs"),
        "fn f(r: &CaptureReport) { println!(\"{}\", r.headline()); }\n",
    );
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(violations(Path::new("present/mcp_text.rs"), plant).is_empty());
    let v = violations(
        Path::new("present/hover.rs"),
        "use crate::lsp::index::LineEntry;\n",
    );
    assert!(v.iter().any(|m| m.contains("knows no front end")), "{v:?}");
    // Other text a front end writes, a field named in a string, a finding read outside a
    // formatting call: none of them is rendering a finding.
    let v = violations(
        Path::new("cli/check.rs"),
        "fn f(e: &E, b: &Budget, f: &Finding) {\n    eprintln!(\"memlsp: {e} .message\");\n    let s = format!(\"{}\", fmt_bytes(b.bytes));\n    let x = f.code == Code::BL001;\n    let t = present::text::check(&r, f.severity);\n}\n",
    );
    assert!(v.is_empty(), "{v:?}");
    let v = violations(Path::new("torch/patterns.rs"), "let c = \"PT002\";\n");
    assert!(v.iter().any(|m| m.contains("finding code")), "{v:?}");
    // Comments, strings and the test module do not count.
    let v = violations(
        Path::new("torch/sites.rs"),
        "// use crate::cli;\nlet s = \"crate::lsp::x\";\n#[cfg(test)]\nmod tests { use crate::cli::x; const C: &str = \"PT001\"; }\n",
    );
    assert!(v.is_empty(), "{v:?}");
}

/// An import circle between two files fails, also when one side reaches the other through a
/// module it imported by name; a parent and its children using each other is no circle.
#[test]
fn the_checker_catches_an_import_circle() {
    let file = |rel: &str, text: &str| (PathBuf::from(rel), text.to_string());
    let tree = |server: &str| {
        vec![
            file(
                "lsp/mod.rs",
                "pub mod handlers;\npub mod server;\npub struct View;\nfn run() { server::Backend::new(); }\n",
            ),
            file("lsp/handlers/mod.rs", "pub mod code_action;\n"),
            file(
                "lsp/handlers/code_action.rs",
                "use crate::lsp::View;\nuse crate::lsp::server::CMD_EXPLAIN;\n",
            ),
            file("lsp/server.rs", server),
        ]
    };
    let v = circles(&tree(
        "use crate::lsp::handlers;\nuse crate::lsp::View;\n\nfn f() { handlers::code_action::code_actions(); }\n",
    ));
    assert_eq!(
        v,
        [
            "import circle: src/lsp/handlers/code_action.rs:2 → src/lsp/server.rs:4 → src/lsp/handlers/code_action.rs: move what both need into a module both import"
        ],
    );
    let v = circles(&tree(
        "use super::handlers::code_action::{self, code_actions};\n",
    ));
    assert_eq!(v.len(), 1, "{v:?}");
    // One way only, or only through the parent, or only in the tests: no circle.
    assert!(circles(&tree("use crate::lsp::{View, handlers};\n")).is_empty());
    assert!(
        circles(&tree(
            "fn f() {}\n#[cfg(test)]\nmod tests { use crate::lsp::handlers::code_action::code_actions; }\n"
        ))
        .is_empty()
    );
}

/// The environment variables that inject faults into the language server exist only in
/// `src/lsp/test_hooks.rs`, which is compiled only with the `test-hooks` feature; the feature is
/// not a default and only the dev-dependency turns it on, so `cargo build` and `cargo install`
/// ship a server without them (the LSP tests that set them run the binary `cargo test` builds).
#[test]
fn fault_injection_is_compiled_only_for_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let gate = "#[cfg(feature = \"test-hooks\")]";
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let text = std::fs::read_to_string(f).unwrap();
        if rel == Path::new("lsp/test_hooks.rs") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (n, l) in lines.iter().enumerate() {
            let gated = n > 0 && lines[n - 1].trim() == gate;
            if l.contains("MEMLSP_TEST_") {
                wrong.push(format!(
                    "src/{}:{}: a test variable outside src/lsp/test_hooks.rs",
                    rel.display(),
                    n + 1
                ));
            }
            let uses = l.contains("test_hooks::") || l.trim() == "mod test_hooks;";
            if uses && !l.trim_start().starts_with("//") && !gated {
                wrong.push(format!(
                    "src/{}:{}: `{}` without `{gate}` on the line before",
                    rel.display(),
                    n + 1,
                    l.trim()
                ));
            }
        }
    }
    let lsp_mod = std::fs::read_to_string(src.join("lsp/mod.rs")).unwrap();
    assert!(
        lsp_mod.contains(&format!("{gate}\nmod test_hooks;")),
        "src/lsp/mod.rs must declare the hooks module behind `{gate}`"
    );
    // In Cargo.toml the feature is declared, is not a default, and only a dev-dependency turns it on.
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let mut section = "";
    for (n, l) in manifest.lines().enumerate() {
        let t = l.trim();
        if t.starts_with('[') {
            section = t;
            continue;
        }
        if t.starts_with('#') || !t.contains("test-hooks") {
            continue;
        }
        let declared = section == "[features]" && t.starts_with("test-hooks =");
        if !declared && section != "[dev-dependencies]" {
            wrong.push(format!(
                "Cargo.toml:{}: `{t}` in {section}: only the dev-dependency may turn on test-hooks",
                n + 1
            ));
        }
    }
    assert!(
        manifest.contains("\ntest-hooks = []"),
        "Cargo.toml declares no test-hooks feature"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
