//! The one Python scanner: strings, comments, brackets, line continuations, statements,
//! decorators and `jax.jit(...)` calls — enough to place a fix edit and to find the jit line a
//! JAX finding belongs to, without a Python parser. Used by `edits` (fix recipes) and `locate`
//! (the `jax.jit` line, a function's signature, a line inside a function).

use crate::findings::TextEdit;

/// Why no edit could be made (the line changed since the capture, no match, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoEdit(pub String);

impl NoEdit {
    /// The line already has the fix (the user applied it after the capture was taken). Every
    /// "already" reason below is worded with that word, and the tests pin each one.
    pub fn already_applied(&self) -> bool {
        self.0.contains("already ")
    }
}

/// An edit in byte offsets of the whole text: replace `start..end` with `text`.
pub(crate) struct Edit {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) text: String,
}

impl Edit {
    pub(crate) fn insert(at: usize, text: impl Into<String>) -> Self {
        Edit {
            start: at,
            end: at,
            text: text.into(),
        }
    }
}

/// The file text with its line starts and, per line, whether a statement may start there (not
/// inside a string, a bracket or after a `\` continuation).
pub(crate) struct Source<'a> {
    pub(crate) text: &'a str,
    pub(crate) b: &'a [u8],
    pub(crate) line_starts: Vec<usize>,
    pub(crate) statement_line: Vec<bool>,
}

impl<'a> Source<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let b = text.as_bytes();
        let mut line_starts = vec![0];
        line_starts.extend(
            b.iter()
                .enumerate()
                .filter(|(_, c)| **c == b'\n')
                .map(|(i, _)| i + 1),
        );
        if line_starts.len() > 1 && line_starts.last() == Some(&b.len()) {
            // A final newline does not start another line.
            line_starts.pop();
        }
        let mut src = Source {
            text,
            b,
            line_starts,
            statement_line: Vec::new(),
        };
        src.statement_line = src.find_statement_lines();
        src
    }

    pub(crate) fn line_count(&self) -> usize {
        if self.b.is_empty() {
            0
        } else {
            self.line_starts.len()
        }
    }

    /// 0-based index of 1-based `line`, or why it does not exist.
    pub(crate) fn line_index(&self, line: u32) -> Result<usize, NoEdit> {
        let n = self.line_count();
        match (line as usize).checked_sub(1) {
            Some(i) if i < n => Ok(i),
            _ => Err(NoEdit(format!(
                "line {line} is past the end of the file ({n} lines)"
            ))),
        }
    }

    /// Byte range of line `idx` without its line break.
    pub(crate) fn line_span(&self, idx: usize) -> (usize, usize) {
        let start = self.line_starts[idx];
        let mut end = self
            .line_starts
            .get(idx + 1)
            .map_or(self.b.len(), |s| s - 1);
        for c in [b'\n', b'\r'] {
            if end > start && self.b[end - 1] == c {
                end -= 1;
            }
        }
        (start, end)
    }

    pub(crate) fn line_text(&self, idx: usize) -> &'a str {
        let (s, e) = self.line_span(idx);
        &self.text[s..e]
    }

    pub(crate) fn indent(&self, idx: usize) -> &'a str {
        let t = self.line_text(idx);
        &t[..t.len() - t.trim_start().len()]
    }

    /// A line that starts a statement and holds code (not blank, not only a comment).
    pub(crate) fn is_code_line(&self, idx: usize) -> bool {
        let t = self.line_text(idx).trim_start();
        self.statement_line[idx] && !t.is_empty() && !t.starts_with('#')
    }

    /// The statement line that line `idx` belongs to (itself unless it continues an earlier one).
    pub(crate) fn statement_start(&self, mut idx: usize) -> usize {
        while idx > 0 && !self.statement_line[idx] {
            idx -= 1;
        }
        idx
    }

    pub(crate) fn line_of(&self, off: usize) -> usize {
        self.line_starts.partition_point(|&s| s <= off) - 1
    }

    pub(crate) fn text_edit(&self, file: &str, e: Edit) -> TextEdit {
        let idx = self.line_of(e.start);
        let start = self.line_starts[idx];
        TextEdit {
            file: file.to_string(),
            line: idx as u32 + 1,
            start_col: (e.start - start) as u32,
            end_col: (e.end - start) as u32,
            new_text: e.text,
            shown: None,
        }
    }

    pub(crate) fn find_statement_lines(&self) -> Vec<bool> {
        let mut flags = vec![true; self.line_starts.len()];
        let mut depth = 0usize;
        let mut code = Code::new(self.b, 0);
        while let Some((i, c)) = code.next() {
            match c {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth = depth.saturating_sub(1),
                b'\n' if depth > 0 => {
                    if let Some(f) = flags.get_mut(self.line_of(i) + 1) {
                        *f = false;
                    }
                }
                QUOTE | CONTINUATION => {
                    // Lines that start inside the string (or after the `\`) continue this one.
                    let (first, last) = (self.line_of(i) + 1, self.line_of(code.i));
                    for f in flags.iter_mut().take(last + 1).skip(first) {
                        *f = false;
                    }
                }
                _ => {}
            }
        }
        flags
    }

    /// Statements that begin on line `idx` (split at top-level `;`), as byte ranges without
    /// the trailing comment; the last one may run on over continuation lines.
    pub(crate) fn statements_on(&self, idx: usize) -> Vec<(usize, usize)> {
        let (start, line_end) = self.line_span(idx);
        let mut out = Vec::new();
        let mut s = start;
        loop {
            let e = statement_end(self.b, s);
            out.push((s, e));
            if e >= line_end || self.b.get(e) != Some(&b';') {
                break;
            }
            s = e + 1;
        }
        out.into_iter()
            .map(|(s, e)| (skip_ws(self.b, s), trim_end(self.b, s, e)))
            .filter(|(s, e)| s < e)
            .collect()
    }
}

/// What [`Code`] yields for a whole string literal.
pub(crate) const QUOTE: u8 = b'"';
/// What [`Code`] yields for a `\` line continuation.
pub(crate) const CONTINUATION: u8 = b'\\';

/// The code bytes of a text from an offset: a string literal comes back as one [`QUOTE`] at its
/// start, a comment as one `#`, a `\`-newline as one [`CONTINUATION`].
pub(crate) struct Code<'a> {
    b: &'a [u8],
    pub(crate) i: usize,
}

impl<'a> Code<'a> {
    pub(crate) fn new(b: &'a [u8], i: usize) -> Self {
        Code { b, i }
    }
}

impl Iterator for Code<'_> {
    type Item = (usize, u8);

    fn next(&mut self) -> Option<(usize, u8)> {
        let (b, i) = (self.b, self.i);
        let c = *b.get(i)?;
        match c {
            b'\'' | b'"' => {
                self.i = skip_string(b, i);
                Some((i, QUOTE))
            }
            b'#' => {
                self.i = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |p| i + p);
                Some((i, b'#'))
            }
            b'\\' if b.get(i + 1) == Some(&b'\n') => {
                self.i = i + 2;
                Some((i, CONTINUATION))
            }
            b'\\' if b.get(i + 1) == Some(&b'\r') && b.get(i + 2) == Some(&b'\n') => {
                self.i = i + 3;
                Some((i, CONTINUATION))
            }
            _ => {
                self.i = i + 1;
                Some((i, c))
            }
        }
    }
}

/// Offset just past the string literal whose opening quote is at `i` (or the end of the text).
pub(crate) fn skip_string(b: &[u8], i: usize) -> usize {
    let q = b[i];
    let triple = b.get(i + 1) == Some(&q) && b.get(i + 2) == Some(&q);
    let mut j = if triple { i + 3 } else { i + 1 };
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'\n' if !triple => return j,
            c if c == q => {
                if !triple {
                    return j + 1;
                }
                if b.get(j + 1) == Some(&q) && b.get(j + 2) == Some(&q) {
                    return j + 3;
                }
                j += 1;
            }
            _ => j += 1,
        }
    }
    b.len()
}

pub(crate) fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

pub(crate) fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
        i += 1;
    }
    i
}

/// `e` moved back over whitespace, not before `s`.
pub(crate) fn trim_end(b: &[u8], s: usize, mut e: usize) -> usize {
    while e > s && b[e - 1].is_ascii_whitespace() {
        e -= 1;
    }
    e
}

/// End of the statement starting at `s`: the first top-level newline, `#` or `;`.
pub(crate) fn statement_end(b: &[u8], s: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in Code::new(b, s) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b'\n' | b'#' | b';' if depth == 0 => return i,
            _ => {}
        }
    }
    b.len()
}

/// Offset of the bracket closing the one at `open`.
pub(crate) fn matching_close(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in Code::new(b, open) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Top-level `,`-separated pieces of `s..e` (trimmed, empty ones dropped).
pub(crate) fn split_top_level(b: &[u8], s: usize, e: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut piece = s;
    let push = |a: usize, z: usize, out: &mut Vec<(usize, usize)>| {
        let (a, z) = (skip_blank(b, a, z), trim_end(b, a, z));
        if a < z {
            out.push((a, z));
        }
    };
    for (i, c) in Code::new(b, s).take_while(|(i, _)| *i < e) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                push(piece, i, &mut out);
                piece = i + 1;
            }
            _ => {}
        }
    }
    push(piece, e, &mut out);
    out
}

/// `a` moved forward over whitespace, comments and line breaks, not past `z`.
pub(crate) fn skip_blank(b: &[u8], a: usize, z: usize) -> usize {
    Code::new(b, a)
        .take_while(|(i, _)| *i < z)
        .find(|(_, c)| !c.is_ascii_whitespace() && *c != b'#' && *c != CONTINUATION)
        .map_or(z, |(i, _)| i)
}

/// An expression that `.detach()` can follow without parentheses: names, attributes, calls,
/// subscripts, literals; no top-level operator or space.
pub(crate) fn is_primary(b: &[u8], s: usize, e: usize) -> bool {
    let mut depth = 0usize;
    for (_, c) in Code::new(b, s).take_while(|(i, _)| *i < e) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ if depth > 0 => {}
            c if is_ident(c) || c == b'.' || c == QUOTE => {}
            _ => return false,
        }
    }
    true
}

/// Offsets of `(` in `s..e` that directly follow `.name` (a method call).
pub(crate) fn method_calls(b: &[u8], s: usize, e: usize, name: &str) -> Vec<usize> {
    let pat = format!(".{name}");
    Code::new(b, s)
        .take_while(|(i, _)| *i < e)
        .filter(|(i, c)| *c == b'(' && b[..*i].ends_with(pat.as_bytes()))
        .map(|(i, _)| i)
        .collect()
}

/// Where on line `idx` a jit is configured.
pub(crate) enum JitTarget {
    /// `jax.jit(` / `jit(` / `partial(jax.jit, ` call: offset of its `(`.
    Call(usize),
    /// A bare `@jax.jit` / `@jit` decorator: the range of the name after `@`.
    Bare(usize, usize),
}

pub(crate) fn jit_target(src: &Source, idx: usize) -> Option<JitTarget> {
    let (s, e) = src.line_span(idx);
    let b = src.b;
    // Offset where the name `…jit` that ends at `end` starts, if it is `jit` or `jax.jit`.
    let jit_name = |end: usize| -> Option<usize> {
        let name_start = b[..end]
            .iter()
            .rposition(|&c| !(is_ident(c) || c == b'.'))
            .map_or(0, |p| p + 1);
        let name = std::str::from_utf8(&b[name_start.max(s)..end]).ok()?;
        matches!(name, "jit" | "jax.jit").then_some(name_start.max(s))
    };
    for (i, c) in Code::new(b, s).take_while(|(i, _)| *i < e) {
        if c != b'(' {
            continue;
        }
        if jit_name(i).is_some() {
            return Some(JitTarget::Call(i));
        }
        if b[..i].ends_with(b"partial") {
            let first = skip_blank(b, i + 1, b.len());
            let mut k = first;
            while k < b.len() && (is_ident(b[k]) || b[k] == b'.') {
                k += 1;
            }
            if k > first && jit_name(k) == Some(first) {
                return Some(JitTarget::Call(i));
            }
        }
    }
    let t = src.line_text(idx).trim();
    let name = t.strip_prefix('@')?.split('#').next()?.trim();
    if matches!(name, "jit" | "jax.jit") {
        let at = s + src.line_text(idx).find('@')? + 1;
        let start = skip_ws(b, at);
        return Some(JitTarget::Bare(start, start + name.len()));
    }
    None
}

/// `def` / `async def` on line `idx` (trimmed).
pub(crate) fn is_def(t: &str) -> bool {
    let t = t.trim_start();
    t.starts_with("def ") || t.starts_with("async def ")
}

/// The line of the `def` whose body holds line `idx` (or `idx` itself when it is a `def`, or the
/// `def` under the decorator on `idx`). `None` at module or class level.
pub(crate) fn owner_def(src: &Source, idx: usize) -> Option<usize> {
    let idx = src.statement_start(idx);
    if is_def(src.line_text(idx)) {
        return Some(idx);
    }
    if src.line_text(idx).trim_start().starts_with('@') {
        return (idx + 1..src.line_count())
            .filter(|&i| src.is_code_line(i))
            .find(|&i| !src.line_text(i).trim_start().starts_with('@'))
            .filter(|&i| is_def(src.line_text(i)));
    }
    let mut indent = src.indent(idx).len();
    for i in (0..idx).rev() {
        if !src.is_code_line(i) {
            continue;
        }
        let ind = src.indent(i).len();
        if ind >= indent {
            continue;
        }
        let t = src.line_text(i).trim_start();
        if is_def(t) {
            return Some(i);
        }
        if t.starts_with("class ") || ind == 0 {
            return None;
        }
        indent = ind;
    }
    None
}

/// Decorator lines directly above the `def` on line `def`, nearest first.
pub(crate) fn decorators(src: &Source, def: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for i in (0..def).rev() {
        let t = src.line_text(i).trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if !src.statement_line[i] {
            // Inside a multi-line decorator: keep walking up to its first line.
            continue;
        }
        if !t.starts_with('@') {
            break;
        }
        out.push(i);
    }
    out
}

/// Whether the (trimmed) line `t` imports `module` or something inside it: `import torch`,
/// `import torch.nn as nn`, `from torch import nn`, but not `import torchvision`.
pub fn imports_module(t: &str, module: &str) -> bool {
    let rest = t
        .strip_prefix("import ")
        .or_else(|| t.strip_prefix("from "))
        .map(str::trim_start);
    rest.and_then(|r| r.strip_prefix(module))
        .is_some_and(|r| r.is_empty() || r.starts_with([' ', '.', ',', '\t', '#', '\r']))
}

/// The line holding the `jax.jit(...)` call or decorator that compiled `fn_name`, given the
/// line that called the jitted function.
pub fn find_jit_line(text: &str, call_line: u32, fn_name: &str) -> Option<u32> {
    let src = Source::new(text);
    let call = src.line_index(call_line).ok()?;
    if jit_target(&src, call).is_some() {
        return Some(call_line);
    }
    // The callee names on the call line: identifiers directly followed by `(`.
    let (s, e) = src.line_span(call);
    let mut callees: Vec<&str> = Code::new(src.b, s)
        .take_while(|(i, _)| *i < e)
        .filter(|(_, c)| *c == b'(')
        .filter_map(|(i, _)| {
            let start = src.b[s..i]
                .iter()
                .rposition(|&c| !is_ident(c))
                .map_or(s, |p| s + p + 1);
            (start < i).then(|| &src.text[start..i])
        })
        .collect();
    callees.push(fn_name);
    let lines = || (0..src.line_count()).filter(|&i| src.is_code_line(i));
    for name in callees {
        for i in lines() {
            let t = src.line_text(i).trim_start();
            // `name = jax.jit(...)`
            if let Some(rest) = t.strip_prefix(name) {
                let rest = rest.trim_start();
                if rest.starts_with('=') && !rest.starts_with("==") && jit_target(&src, i).is_some()
                {
                    return Some(i as u32 + 1);
                }
            }
            // `@jax.jit` / `@partial(jax.jit, …)` decorating `def name(`
            if is_def(t) && def_name(t) == Some(name) {
                if let Some(d) = decorators(&src, i)
                    .into_iter()
                    .find(|&d| jit_target(&src, d).is_some())
                {
                    return Some(d as u32 + 1);
                }
            }
        }
    }
    // `jax.jit(fn_name` anywhere (e.g. `step = jax.jit(train_step, ...)` under another name).
    let wanted = format!("jit({fn_name}");
    lines()
        .find(|&i| code_of_line(&src, i).contains(&wanted))
        .map(|i| i as u32 + 1)
}

/// The name a `def` line defines.
fn def_name(t: &str) -> Option<&str> {
    let rest = t
        .trim_start()
        .strip_prefix("async ")
        .unwrap_or(t.trim_start());
    let rest = rest.strip_prefix("def ")?.trim_start();
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// The code of line `idx`: comments dropped, string literals as `""`.
fn code_of_line(src: &Source, idx: usize) -> String {
    let (s, e) = src.line_span(idx);
    let mut out = String::new();
    let mut last = s;
    for (i, c) in Code::new(src.b, s).take_while(|(i, _)| *i < e) {
        match c {
            b'#' => {
                out.push_str(&src.text[last..i]);
                return out;
            }
            QUOTE => {
                out.push_str(&src.text[last..i]);
                out.push_str("\"\"");
                last = e.min(skip_string(src.b, i));
            }
            _ => {}
        }
    }
    out.push_str(&src.text[last.min(e)..e]);
    out
}

/// Positional parameter names of `def fn_name(...)` (up to `*args`; `self` and `/` skipped).
pub fn signature(text: &str, fn_name: &str) -> Option<Vec<String>> {
    let src = Source::new(text);
    let def = (0..src.line_count())
        .filter(|&i| src.is_code_line(i))
        .find(|&i| is_def(src.line_text(i)) && def_name(src.line_text(i)) == Some(fn_name))?;
    let (s, e) = src.line_span(def);
    let open = Code::new(src.b, s)
        .take_while(|(i, _)| *i < e)
        .find(|(_, c)| *c == b'(')?
        .0;
    let close = matching_close(src.b, open)?;
    let mut out = Vec::new();
    for (a, z) in split_top_level(src.b, open + 1, close) {
        let param = &src.text[a..z];
        let name = param.split([':', '=']).next().unwrap_or("").trim();
        if name.starts_with('*') {
            break;
        }
        if !name.is_empty() && name != "/" && name != "self" {
            out.push(name.to_string());
        }
    }
    Some(out)
}

/// First line after `def_line` inside that function's body whose code contains `needle`.
pub fn find_in_function(text: &str, def_line: u32, needle: &str) -> Option<u32> {
    let src = Source::new(text);
    let def = src.line_index(def_line).ok()?;
    let def_indent = src.indent(def).len();
    for i in def + 1..src.line_count() {
        if src.is_code_line(i) && src.indent(i).len() <= def_indent {
            break;
        }
        if code_of_line(&src, i).contains(needle) {
            return Some(i as u32 + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROGRAM: &str = "import jax
def train_step(params, opt_state, x, y=None, *rest):
    return params

step = jax.jit(train_step)  # a comment with jit(

@partial(jax.jit, static_argnums=2)
def eval_step(params, batch):
    return params

def loop(params, o, x):
    hist = []
    for _ in range(3):
        params = step(params, o, x)
        hist.append(params)
        e = eval_step(params, x)
    out = train_step_jit(params)
    return params
";

    #[test]
    fn jit_line_is_found_from_the_call_site() {
        // `step(...)` on line 14 was made by `step = jax.jit(train_step)` on line 5.
        assert_eq!(find_jit_line(PROGRAM, 14, "train_step"), Some(5));
        // A decorated function: the decorator line.
        assert_eq!(find_jit_line(PROGRAM, 16, "eval_step"), Some(7));
        // `train_step_jit(` is a name ending in `jit`, not a jit call: fall back to the
        // `jax.jit(train_step` line.
        assert_eq!(find_jit_line(PROGRAM, 17, "train_step"), Some(5));
        assert_eq!(find_jit_line(PROGRAM, 99, "train_step"), None);
    }

    #[test]
    fn signature_and_append_line() {
        assert_eq!(
            signature(PROGRAM, "train_step"),
            Some(vec![
                "params".into(),
                "opt_state".into(),
                "x".into(),
                "y".into()
            ])
        );
        assert_eq!(find_in_function(PROGRAM, 11, ".append("), Some(15));
        assert_eq!(find_in_function(PROGRAM, 2, ".append("), None);
    }
}
