//! Tidy: no non-test source file over 1,000 lines and no function over 200 lines in `src/`
//! (docs/ARCHITECTURE.md). A test module (inline after `#[cfg(test)]`, or a file declared as one)
//! does not count. `ALLOWED` names what is being split right now; an entry that is no longer over
//! its limit fails too, so the list only shrinks.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{code_only, rust_files};

pub const MAX_FILE_LINES: usize = 1000;
pub const MAX_FN_LINES: usize = 200;

/// Over a limit today, each being split by another branch of this round (issue 27). Each entry
/// is to be removed when its split lands: `src/FILE` for a file, `src/FILE::fn` for a function.
const ALLOWED: &[&str] = &[];

/// Functions with a body in `code` (comments and literals already emptied) longer than
/// `max` lines, counted from the `fn` line to the closing brace: (name, first line, lines).
pub fn long_functions(code: &str, max: usize) -> Vec<(String, usize, usize)> {
    let b: Vec<char> = code.chars().collect();
    let mut lines = Vec::with_capacity(b.len());
    let mut line = 1;
    for c in &b {
        lines.push(line);
        line += usize::from(*c == '\n');
    }
    let line_at = |i: usize| lines[i];
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 < b.len() {
        let word = b[i] == 'f' && b[i + 1] == 'n' && b[i + 2].is_whitespace();
        if !word || (i > 0 && is_ident(b[i - 1])) {
            i += 1;
            continue;
        }
        let mut j = i + 2;
        while j < b.len() && b[j].is_whitespace() {
            j += 1;
        }
        let start = j;
        while j < b.len() && is_ident(b[j]) {
            j += 1;
        }
        if j == start {
            i += 2; // `fn(u32) -> u32`: a type, not an item
            continue;
        }
        let name: String = b[start..j].iter().collect();
        // The body: the first `{` outside the signature's brackets, unless a `;` ends it first.
        let (open, end) = body_open(&b, j);
        j = end;
        let Some(open) = open else {
            i = j;
            continue;
        };
        let close = matching(&b, open);
        let (first, last) = (line_at(i), line_at(close));
        if last - first + 1 > max {
            out.push((name, first, last - first + 1));
        }
        i = open + 1; // nested functions are measured on their own too
    }
    out
}

/// The `{` that opens the body of the item whose header starts at `from`: the first one outside
/// its brackets, unless a `;` ends the item first (then `None`); and where the scan stopped.
fn body_open(b: &[char], from: usize) -> (Option<usize>, usize) {
    let mut depth = 0i32;
    let mut j = from;
    while j < b.len() {
        match b[j] {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ';' if depth == 0 => return (None, j),
            '{' if depth == 0 => return (Some(j), j),
            _ => {}
        }
        j += 1;
    }
    (None, j)
}

/// `code` (comments and literals already emptied) with every item under `#[cfg(test)]` that has
/// a body (a test module, a test-only function) blanked, line breaks kept, and how many lines
/// were blanked.
pub fn outside_tests(code: &str) -> (String, usize) {
    const MARK: &str = "#[cfg(test)]";
    let mut b: Vec<char> = code.chars().collect();
    let mut blanked = 0;
    let mut from = 0;
    loop {
        let text: String = b[from..].iter().collect();
        let Some(off) = text.find(MARK) else { break };
        let at = from + text[..off].chars().count();
        let (open, j) = body_open(&b, at + MARK.chars().count());
        let Some(open) = open else {
            from = j.min(b.len());
            continue;
        };
        let close = matching(&b, open);
        blanked += b[at..=close].iter().filter(|c| **c == '\n').count() + 1;
        for c in &mut b[at..=close] {
            if *c != '\n' {
                *c = ' ';
            }
        }
        from = close + 1;
    }
    (b.into_iter().collect(), blanked)
}

/// The index of the `}` that closes the `{` at `open` (the last index when none does).
fn matching(b: &[char], open: usize) -> usize {
    let mut braces = 0i32;
    for (k, c) in b.iter().enumerate().skip(open) {
        match c {
            '{' => braces += 1,
            '}' => {
                braces -= 1;
                if braces == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    b.len() - 1
}

/// Files declared as test modules (`#[cfg(test)]` then `mod name;`), relative to `src/`.
fn test_module_files(files: &[(PathBuf, String)]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for (rel, text) in files {
        let dir = match rel.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => rel.parent().unwrap().to_path_buf(),
            _ => rel.with_extension(""),
        };
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for w in lines.windows(2) {
            if w[0] != "#[cfg(test)]" {
                continue;
            }
            if let Some(name) = w[1].strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                out.insert(dir.join(format!("{name}.rs")));
                out.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

/// Every file and function of `src/` over its limit, as `src/FILE (N lines)` and
/// `src/FILE::fn (line L, N lines)`, keyed by the allow-list's spelling.
pub fn oversized(src: &Path) -> Vec<(String, String)> {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    paths.sort();
    let files: Vec<(PathBuf, String)> = paths
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(src).unwrap().to_path_buf();
            (rel, std::fs::read_to_string(p).unwrap())
        })
        .collect();
    let tests = test_module_files(&files);
    let mut out = Vec::new();
    for (rel, text) in &files {
        if tests.contains(rel) {
            continue;
        }
        let (code, test_lines) = outside_tests(&code_only(text));
        let file = format!("src/{}", rel.display());
        let lines = text.trim_end().lines().count() - test_lines;
        if lines > MAX_FILE_LINES {
            out.push((
                file.clone(),
                format!("{file} ({lines} lines outside its tests)"),
            ));
        }
        for (name, line, n) in long_functions(&code, MAX_FN_LINES) {
            let key = format!("{file}::{name}");
            out.push((key.clone(), format!("{key} (line {line}, {n} lines)")));
        }
    }
    out
}

#[test]
fn no_file_over_1000_lines_and_no_function_over_200() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = oversized(&src);
    let mut wrong: Vec<String> = found
        .iter()
        .filter(|(key, _)| !ALLOWED.contains(&key.as_str()))
        .map(|(_, what)| {
            format!("{what}: split it along its steps (a file into a module directory, a function into named functions)")
        })
        .collect();
    for a in ALLOWED {
        if !found.iter().any(|(key, _)| key == a) {
            wrong.push(format!(
                "{a} is within its limit now: remove it from ALLOWED in tests/architecture/sizes.rs"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "at most {MAX_FILE_LINES} lines a file and {MAX_FN_LINES} a function:\n{}",
        wrong.join("\n")
    );
}

/// The measure itself: a long function is caught (also a method, also one nested in another),
/// a signature with `;` inside brackets or a bodiless trait method is no body, `fn` types are
/// no items, and comments and strings do not count braces.
#[test]
fn the_size_check_catches_a_long_function() {
    let body = "    let x = 1;\n".repeat(200);
    let src = format!(
        "trait T {{ fn decl(&self, a: [u8; 4]); }}\n\
         impl S {{\n    fn long(&self, f: fn(u32) -> u32, a: [u8; 2]) -> u32 {{\n{body}        0\n    }}\n}}\n\
         fn short() {{ let s = \"{{{{{{\"; // }}}}\n}}\n\
         fn outer() {{\n    fn inner() {{\n{body}    }}\n}}\n"
    );
    let code = code_only(&src);
    let long = long_functions(&code, MAX_FN_LINES);
    let names: Vec<(&str, usize, usize)> =
        long.iter().map(|(n, l, c)| (n.as_str(), *l, *c)).collect();
    assert_eq!(
        names,
        vec![("long", 3, 203), ("outer", 209, 204), ("inner", 210, 202)],
        "{long:?}"
    );
    // Test code does not count: a test module, a test-only function.
    let tests = format!(
        "fn a() {{}}\n#[cfg(test)]\n#[allow(unused)]\nmod tests {{\n    fn t() {{\n{body}    }}\n}}\n\
         #[cfg(test)]\nfn helper() {{\n{body}}}\n#[cfg(test)]\nmod other;\nfn b() {{}}\n"
    );
    let (code, blanked) = outside_tests(&code_only(&tests));
    assert_eq!(
        blanked,
        206 + 203,
        "the test module and the test-only function"
    );
    assert!(long_functions(&code, MAX_FN_LINES).is_empty());
    assert_eq!(
        tests.lines().count() - blanked,
        4,
        "a, the `mod other;` pair and b"
    );
    let fits = "fn f() {\n".to_string() + &"    g();\n".repeat(198) + "}\n";
    assert!(long_functions(&code_only(&fits), MAX_FN_LINES).is_empty());
    let over = "fn f() {\n".to_string() + &"    g();\n".repeat(199) + "}\n";
    assert_eq!(long_functions(&code_only(&over), MAX_FN_LINES).len(), 1);
}

/// Largest file the repository may track. Real captures stay in `../shared`; generated bench
/// inputs go under `target/`. A 218 MB generated snapshot once landed by accident as `./--help`
/// (a generator given `--help` as its output path).
const MAX_TRACKED_BYTES: u64 = 4 << 20;

/// Tracked files over `max` bytes: (path, bytes).
fn oversized_tracked(root: &Path, max: u64) -> Result<Vec<(String, u64)>, String> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let mut big = Vec::new();
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        // A tracked file deleted in the work tree is not a file to weigh.
        if let Ok(meta) = std::fs::metadata(root.join(&name)) {
            if meta.len() > max {
                big.push((name, meta.len()));
            }
        }
    }
    Ok(big)
}

#[test]
fn no_tracked_file_is_a_capture_sized_blob() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    match oversized_tracked(root, MAX_TRACKED_BYTES) {
        Ok(big) => assert!(
            big.is_empty(),
            "tracked files over {MAX_TRACKED_BYTES} bytes (captures belong in ../shared, bench \
             inputs under target/): {big:?}"
        ),
        Err(e) if std::env::var_os("MEMLSP_REQUIRE_SHARED").is_some() => {
            panic!("cannot list tracked files: {e}")
        }
        Err(e) => eprintln!("skipped: cannot list tracked files ({e})"),
    }
}

#[test]
fn the_blob_check_names_a_big_tracked_file() {
    let dir = std::env::temp_dir().join(format!("memlsp-blob-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(&dir)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(ok, "git {args:?} failed");
    };
    git(&["init", "-q"]);
    std::fs::write(dir.join("--help"), vec![0u8; 2048]).unwrap();
    std::fs::write(dir.join("small"), b"x").unwrap();
    git(&["add", "--", "--help", "small"]);
    let big = oversized_tracked(&dir, 1024).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(big, vec![("--help".to_string(), 2048)]);
}
