//! Turn a finding's `FixKind` into text edits against the current text of a file.
//!
//! No Python parser: a small scanner that knows strings, comments, brackets and line
//! continuations is enough to find the accumulating expression, the `jax.jit(...)` call or the
//! owning `def` on a line the capture named. When the line no longer looks like what the fix
//! expects (the file changed since the capture), the answer is [`NoEdit`] with the reason, never a
//! guess. Columns are 0-based UTF-8 byte columns; the language server converts them.

use crate::findings::{FixKind, TextEdit};

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

/// Edits for `kind` at 1-based `line` of `text` (the file or the editor buffer). `file` is copied
/// into the edits. Returns `NoEdit` with a reason when the line no longer matches the capture.
pub fn edits_for(
    kind: &FixKind,
    file: &str,
    text: &str,
    line: u32,
) -> Result<Vec<TextEdit>, NoEdit> {
    let src = Source::new(text);
    let at = |line: u32| src.line_index(line);
    let edits = match kind {
        FixKind::Advice => return Err(NoEdit("advice only: there is no local edit".into())),
        FixKind::AllocConf { value } => alloc_conf(&src, value)?,
        FixKind::DetachAccumulated { item } => detach_accumulated(&src, at(line)?, *item)?,
        FixKind::DetachCpuAppend => wrap_append(&src, at(line)?, Wrap::DetachCpu)?,
        FixKind::DeviceGetAppend => wrap_append(&src, at(line)?, Wrap::DeviceGet)?,
        FixKind::DonateArgnums { argnums } => donate_argnums(&src, at(line)?, argnums)?,
        FixKind::JaxCheckpoint => jax_checkpoint(&src, at(line)?)?,
    };
    Ok(edits.into_iter().map(|e| src.text_edit(file, e)).collect())
}

/// An edit in byte offsets of the whole text: replace `start..end` with `text`.
struct Edit {
    start: usize,
    end: usize,
    text: String,
}

impl Edit {
    fn insert(at: usize, text: impl Into<String>) -> Self {
        Edit {
            start: at,
            end: at,
            text: text.into(),
        }
    }
}

/// The file text with its line starts and, per line, whether a statement may start there (not
/// inside a string, a bracket or after a `\` continuation).
struct Source<'a> {
    text: &'a str,
    b: &'a [u8],
    line_starts: Vec<usize>,
    statement_line: Vec<bool>,
}

impl<'a> Source<'a> {
    fn new(text: &'a str) -> Self {
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

    fn line_count(&self) -> usize {
        if self.b.is_empty() {
            0
        } else {
            self.line_starts.len()
        }
    }

    /// 0-based index of 1-based `line`, or why it does not exist.
    fn line_index(&self, line: u32) -> Result<usize, NoEdit> {
        let n = self.line_count();
        match (line as usize).checked_sub(1) {
            Some(i) if i < n => Ok(i),
            _ => Err(NoEdit(format!(
                "line {line} is past the end of the file ({n} lines)"
            ))),
        }
    }

    /// Byte range of line `idx` without its line break.
    fn line_span(&self, idx: usize) -> (usize, usize) {
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

    fn line_text(&self, idx: usize) -> &'a str {
        let (s, e) = self.line_span(idx);
        &self.text[s..e]
    }

    fn indent(&self, idx: usize) -> &'a str {
        let t = self.line_text(idx);
        &t[..t.len() - t.trim_start().len()]
    }

    /// A line that starts a statement and holds code (not blank, not only a comment).
    fn is_code_line(&self, idx: usize) -> bool {
        let t = self.line_text(idx).trim_start();
        self.statement_line[idx] && !t.is_empty() && !t.starts_with('#')
    }

    /// The statement line that line `idx` belongs to (itself unless it continues an earlier one).
    fn statement_start(&self, mut idx: usize) -> usize {
        while idx > 0 && !self.statement_line[idx] {
            idx -= 1;
        }
        idx
    }

    fn line_of(&self, off: usize) -> usize {
        self.line_starts.partition_point(|&s| s <= off) - 1
    }

    fn text_edit(&self, file: &str, e: Edit) -> TextEdit {
        let idx = self.line_of(e.start);
        let start = self.line_starts[idx];
        TextEdit {
            file: file.to_string(),
            line: idx as u32 + 1,
            start_col: (e.start - start) as u32,
            end_col: (e.end - start) as u32,
            new_text: e.text,
        }
    }

    fn find_statement_lines(&self) -> Vec<bool> {
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
    fn statements_on(&self, idx: usize) -> Vec<(usize, usize)> {
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
const QUOTE: u8 = b'"';
/// What [`Code`] yields for a `\` line continuation.
const CONTINUATION: u8 = b'\\';

/// The code bytes of a text from an offset: a string literal comes back as one [`QUOTE`] at its
/// start, a comment as one `#`, a `\`-newline as one [`CONTINUATION`].
struct Code<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Code<'a> {
    fn new(b: &'a [u8], i: usize) -> Self {
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
fn skip_string(b: &[u8], i: usize) -> usize {
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

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
        i += 1;
    }
    i
}

/// `e` moved back over whitespace, not before `s`.
fn trim_end(b: &[u8], s: usize, mut e: usize) -> usize {
    while e > s && b[e - 1].is_ascii_whitespace() {
        e -= 1;
    }
    e
}

/// End of the statement starting at `s`: the first top-level newline, `#` or `;`.
fn statement_end(b: &[u8], s: usize) -> usize {
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
fn matching_close(b: &[u8], open: usize) -> Option<usize> {
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
fn split_top_level(b: &[u8], s: usize, e: usize) -> Vec<(usize, usize)> {
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
fn skip_blank(b: &[u8], a: usize, z: usize) -> usize {
    Code::new(b, a)
        .take_while(|(i, _)| *i < z)
        .find(|(_, c)| !c.is_ascii_whitespace() && *c != b'#' && *c != CONTINUATION)
        .map_or(z, |(i, _)| i)
}

/// An expression that `.detach()` can follow without parentheses: names, attributes, calls,
/// subscripts, literals; no top-level operator or space.
fn is_primary(b: &[u8], s: usize, e: usize) -> bool {
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
fn method_calls(b: &[u8], s: usize, e: usize, name: &str) -> Vec<usize> {
    let pat = format!(".{name}");
    Code::new(b, s)
        .take_while(|(i, _)| *i < e)
        .filter(|(i, c)| *c == b'(' && b[..*i].ends_with(pat.as_bytes()))
        .map(|(i, _)| i)
        .collect()
}

/// How to wrap an expression.
#[derive(Clone, Copy)]
enum Wrap {
    Detach,
    Item,
    DetachCpu,
    DeviceGet,
}

impl Wrap {
    /// Calls that mean the value is already off the graph / off the device.
    fn already(self) -> &'static [&'static str] {
        match self {
            Wrap::Detach | Wrap::Item => &[".detach(", ".item(", ".tolist(", "float(", "int("],
            Wrap::DetachCpu => &[
                ".detach(", ".cpu(", ".item(", ".tolist(", ".numpy(", "float(",
            ],
            Wrap::DeviceGet => &["device_get(", ".item(", ".tolist(", "np.asarray("],
        }
    }

    fn edits(self, b: &[u8], s: usize, e: usize) -> Vec<Edit> {
        let suffix = match self {
            Wrap::Detach => ".detach()",
            Wrap::Item => ".item()",
            Wrap::DetachCpu => ".detach().cpu()",
            Wrap::DeviceGet => {
                return vec![Edit::insert(s, "jax.device_get("), Edit::insert(e, ")")];
            }
        };
        if is_primary(b, s, e) {
            vec![Edit::insert(e, suffix)]
        } else {
            vec![Edit::insert(s, "("), Edit::insert(e, format!("){suffix}"))]
        }
    }
}

/// Wrap the expression `s..e`, unless it is already converted.
fn wrap(src: &Source, idx: usize, s: usize, e: usize, how: Wrap) -> Result<Vec<Edit>, NoEdit> {
    let expr = &src.text[s..e];
    if let Some(done) = how.already().iter().find(|p| calls(expr, p)) {
        return Err(NoEdit(format!(
            "line {} already converts `{expr}` ({done}…)",
            idx + 1
        )));
    }
    Ok(how.edits(src.b, s, e))
}

/// Whether `expr` contains the call `pat` (`.detach(`, `float(`): a bare name must not be the
/// tail of a longer one (`print(` is not `int(`).
fn calls(expr: &str, pat: &str) -> bool {
    expr.match_indices(pat)
        .any(|(i, _)| pat.starts_with('.') || i == 0 || !is_ident(expr.as_bytes()[i - 1]))
}

/// The single argument of the first `.append(…)` on the line, as a byte range.
fn append_arg(src: &Source, idx: usize) -> Option<Result<(usize, usize), NoEdit>> {
    let (s, e) = src.line_span(idx);
    let open = *method_calls(src.b, s, e, "append").first()?;
    let Some(close) = matching_close(src.b, open) else {
        return Some(Err(NoEdit(format!(
            "line {}: `.append(` is not closed",
            idx + 1
        ))));
    };
    let args = split_top_level(src.b, open + 1, close);
    Some(match args.as_slice() {
        [one] => Ok(*one),
        _ => Err(NoEdit(format!(
            "line {}: `.append(…)` does not take exactly one argument",
            idx + 1
        ))),
    })
}

fn wrap_append(src: &Source, idx: usize, how: Wrap) -> Result<Vec<Edit>, NoEdit> {
    let (s, e) = append_arg(src, idx).ok_or_else(|| {
        NoEdit(format!(
            "line {} no longer contains `.append(…)`: `{}`",
            idx + 1,
            src.line_text(idx).trim()
        ))
    })??;
    wrap(src, idx, s, e, how)
}

/// PT002: the value accumulated on the line (`total += loss`, `total = total + loss`,
/// `losses.append(loss)`) gets `.detach()` / `.item()`.
fn detach_accumulated(src: &Source, idx: usize, item: bool) -> Result<Vec<Edit>, NoEdit> {
    let how = if item { Wrap::Item } else { Wrap::Detach };
    if let Some(arg) = append_arg(src, idx) {
        let (s, e) = arg?;
        return wrap(src, idx, s, e, how);
    }
    for (s, e) in src.statements_on(idx) {
        if let Some((a, z)) = accumulated(src.b, s, e) {
            return wrap(src, idx, a, z, how);
        }
    }
    Err(NoEdit(format!(
        "line {} no longer contains an accumulation (`total += loss`, `total = total + loss` \
         or `losses.append(loss)`): `{}`",
        idx + 1,
        src.line_text(idx).trim()
    )))
}

/// In the statement `s..e`: the added expression of `x += E`, `x = x + E` or `x = E + x`.
fn accumulated(b: &[u8], s: usize, e: usize) -> Option<(usize, usize)> {
    // The first top-level `+=` or plain `=`.
    let mut depth = 0usize;
    let mut op = None;
    for (i, c) in Code::new(b, s).take_while(|(i, _)| *i < e) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b'=' if depth == 0 => {
                let prev = if i > s { b[i - 1] } else { b' ' };
                let next = b.get(i + 1).copied().unwrap_or(b' ');
                if prev == b'+' {
                    op = Some((i - 1, i + 1, true));
                } else if !b"=!<>:-*/%&|^@".contains(&prev) && next != b'=' {
                    op = Some((i, i + 1, false));
                }
                break;
            }
            _ => {}
        }
    }
    let (op_start, op_end, augmented) = op?;
    let rhs = (skip_ws(b, op_end), e);
    if rhs.0 >= rhs.1 {
        return None;
    }
    if augmented {
        return Some(rhs);
    }
    // `x = x + E` / `x = E + x`: the target must reappear as one operand of a top-level `+`.
    let target = std::str::from_utf8(&b[s..trim_end(b, s, op_start)]).ok()?;
    let mut depth = 0usize;
    let plus = Code::new(b, rhs.0)
        .take_while(|(i, _)| *i < rhs.1)
        .find(|&(i, c)| {
            match c {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
            c == b'+' && depth == 0 && b.get(i + 1) != Some(&b'=')
        })
        .map(|(i, _)| i)?;
    let left = (rhs.0, trim_end(b, rhs.0, plus));
    let right = (skip_ws(b, plus + 1), rhs.1);
    let text = |(a, z): (usize, usize)| std::str::from_utf8(&b[a..z]).ok();
    if text(left)? == target {
        Some(right)
    } else if text(right)? == target {
        Some(left)
    } else {
        None
    }
}

/// JX005: `donate_argnums=(…)` on the `jax.jit(...)` call or decorator on the line, or on the
/// decorators of the function the line belongs to.
fn donate_argnums(src: &Source, idx: usize, argnums: &[u32]) -> Result<Vec<Edit>, NoEdit> {
    if argnums.is_empty() {
        return Err(NoEdit("no argument to donate".into()));
    }
    let mut candidates = vec![idx];
    if let Some(def) = owner_def(src, idx) {
        candidates.extend(decorators(src, def));
    }
    for cand in candidates {
        if let Some(target) = jit_target(src, cand) {
            return donate_into(src, cand, target, argnums);
        }
    }
    Err(NoEdit(format!(
        "line {} no longer contains a `jax.jit(…)` call or decorator: `{}`",
        idx + 1,
        src.line_text(idx).trim()
    )))
}

/// Where on line `idx` a jit is configured.
enum JitTarget {
    /// `jax.jit(` / `jit(` / `partial(jax.jit, ` call: offset of its `(`.
    Call(usize),
    /// A bare `@jax.jit` / `@jit` decorator: the range of the name after `@`.
    Bare(usize, usize),
}

fn jit_target(src: &Source, idx: usize) -> Option<JitTarget> {
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

fn tuple_text(nums: &[u32]) -> String {
    match nums {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            nums.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn donate_into(
    src: &Source,
    idx: usize,
    target: JitTarget,
    argnums: &[u32],
) -> Result<Vec<Edit>, NoEdit> {
    let b = src.b;
    let line = idx + 1;
    match target {
        JitTarget::Bare(s, e) => {
            let kwarg = format!("donate_argnums={}", tuple_text(argnums));
            let (partial, import) = partial_name(src);
            let mut edits = Vec::new();
            if let Some(imp) = import {
                edits.push(imp);
            }
            edits.push(Edit {
                start: s,
                end: e,
                text: format!("{partial}({}, {kwarg})", &src.text[s..e]),
            });
            Ok(edits)
        }
        JitTarget::Call(open) => {
            let close = matching_close(b, open)
                .ok_or_else(|| NoEdit(format!("line {line}: the jit call is not closed")))?;
            let args = split_top_level(b, open + 1, close);
            let mut static_nums = Vec::new();
            for &(a, z) in &args {
                let arg = &src.text[a..z];
                let Some((key, value)) = arg.split_once('=') else {
                    continue;
                };
                match key.trim() {
                    "donate_argnums" | "donate_argnames" => {
                        return Err(NoEdit(format!("line {line} already donates: `{arg}`")));
                    }
                    "static_argnums" => static_nums = int_list(value),
                    _ => {}
                }
            }
            let donate: Vec<u32> = argnums
                .iter()
                .copied()
                .filter(|n| !static_nums.contains(n))
                .collect();
            if donate.is_empty() {
                return Err(NoEdit(format!(
                    "line {line}: argument(s) {} are static (`static_argnums`) and cannot be donated",
                    tuple_text(argnums)
                )));
            }
            let kwarg = format!("donate_argnums={}", tuple_text(&donate));
            let Some(&(_, last_end)) = args.last() else {
                return Err(NoEdit(format!("line {line}: the jit call has no function")));
            };
            // After the last argument, keeping a trailing comma where the call had one.
            let after = skip_blank(b, last_end, close);
            if b.get(after) == Some(&b',') && after < close {
                Ok(vec![Edit::insert(after + 1, format!(" {kwarg},"))])
            } else {
                Ok(vec![Edit::insert(last_end, format!(", {kwarg}"))])
            }
        }
    }
}

/// Integers in `5`, `(1, 2)`, `[0]`.
fn int_list(value: &str) -> Vec<u32> {
    value
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The name to call `functools.partial` by in this file, and the import edit when it is missing.
fn partial_name(src: &Source) -> (&'static str, Option<Edit>) {
    let top_level = |pred: &dyn Fn(&str) -> bool| {
        (0..src.line_count()).any(|i| src.is_code_line(i) && pred(src.line_text(i)))
    };
    if top_level(&|t| t.starts_with("from functools import") && t.contains("partial")) {
        return ("partial", None);
    }
    if top_level(&|t| t.trim_end() == "import functools") {
        return ("functools.partial", None);
    }
    (
        "partial",
        Some(Edit::insert(
            import_position(src),
            "from functools import partial\n",
        )),
    )
}

/// Where a new top-level import goes: before the first import that is not `from __future__`,
/// else after the last `__future__` import, else at the top.
fn import_position(src: &Source) -> usize {
    let mut after_future = 0;
    for i in 0..src.line_count() {
        if !src.is_code_line(i) || !src.indent(i).is_empty() {
            continue;
        }
        let t = src.line_text(i);
        if t.starts_with("from __future__") {
            after_future = src.line_starts.get(i + 1).copied().unwrap_or(src.b.len());
        } else if t.starts_with("import ") || t.starts_with("from ") {
            return src.line_starts[i];
        }
    }
    after_future
}

/// `def` / `async def` on line `idx` (trimmed).
fn is_def(t: &str) -> bool {
    let t = t.trim_start();
    t.starts_with("def ") || t.starts_with("async def ")
}

/// The line of the `def` whose body holds line `idx` (or `idx` itself when it is a `def`, or the
/// `def` under the decorator on `idx`). `None` at module or class level.
fn owner_def(src: &Source, idx: usize) -> Option<usize> {
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
fn decorators(src: &Source, def: usize) -> Vec<usize> {
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

/// JX002: `@jax.checkpoint` above the `def` that owns the line.
fn jax_checkpoint(src: &Source, idx: usize) -> Result<Vec<Edit>, NoEdit> {
    let def = owner_def(src, idx).ok_or_else(|| {
        NoEdit(format!(
            "line {} is not inside a function, so there is no `def` to checkpoint",
            idx + 1
        ))
    })?;
    for d in decorators(src, def) {
        let t = src.line_text(d).trim();
        if t.contains("checkpoint") || t.contains("remat") {
            return Err(NoEdit(format!(
                "`{}` is already rematerialised: `{t}`",
                src.line_text(def).trim().trim_end_matches(':')
            )));
        }
    }
    Ok(vec![Edit::insert(
        src.line_starts[def],
        format!("{}@jax.checkpoint\n", src.indent(def)),
    )])
}

/// PT008: `PYTORCH_ALLOC_CONF` set before the first top-level `import torch`.
fn alloc_conf(src: &Source, value: &str) -> Result<Vec<Edit>, NoEdit> {
    if src.text.contains("PYTORCH_ALLOC_CONF") || src.text.contains("PYTORCH_CUDA_ALLOC_CONF") {
        return Err(NoEdit(
            "the file already sets PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF".into(),
        ));
    }
    let imports = |t: &str, module: &str| {
        let rest = t
            .strip_prefix("import ")
            .or_else(|| t.strip_prefix("from "))
            .map(str::trim_start);
        rest.and_then(|r| r.strip_prefix(module))
            .is_some_and(|r| r.is_empty() || r.starts_with([' ', '.', ',', '\t', '#', '\r']))
    };
    let top = |i: usize| src.is_code_line(i) && src.indent(i).is_empty();
    let torch = (0..src.line_count())
        .find(|&i| top(i) && imports(src.line_text(i), "torch"))
        .ok_or_else(|| {
            NoEdit(format!(
                "the file has no top-level `import torch`; set PYTORCH_ALLOC_CONF={value} in the \
                 environment that starts it"
            ))
        })?;
    let has_os = (0..torch).any(|i| {
        top(i)
            && src
                .line_text(i)
                .strip_prefix("import os")
                .is_some_and(|r| r.is_empty() || r.starts_with([' ', ',', '#', '\r']))
    });
    let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
    let mut text = String::new();
    if !has_os {
        text.push_str("import os\n");
    }
    text.push_str(&format!(
        "os.environ.setdefault(\"PYTORCH_ALLOC_CONF\", \"{escaped}\")\n"
    ));
    Ok(vec![Edit::insert(src.line_starts[torch], text)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apply `kind` at `line` and return the new text (or the reason there is no edit).
    fn fix(kind: FixKind, text: &str, line: u32) -> Result<String, String> {
        let edits = edits_for(&kind, "f.py", text, line).map_err(|e| e.0)?;
        Ok(apply(text, &edits))
    }

    fn apply(text: &str, edits: &[TextEdit]) -> String {
        let starts: Vec<usize> = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        let mut sorted: Vec<&TextEdit> = edits.iter().collect();
        sorted.sort_by_key(|e| std::cmp::Reverse((e.line, e.start_col)));
        let mut out = text.to_string();
        for e in sorted {
            assert_eq!(e.file, "f.py");
            let base = starts[e.line as usize - 1];
            out.replace_range(
                base + e.start_col as usize..base + e.end_col as usize,
                &e.new_text,
            );
        }
        out
    }

    const DETACH: FixKind = FixKind::DetachAccumulated { item: false };
    const ITEM: FixKind = FixKind::DetachAccumulated { item: true };

    fn donate(nums: &[u32]) -> FixKind {
        FixKind::DonateArgnums {
            argnums: nums.to_vec(),
        }
    }

    #[test]
    fn detach_wraps_the_accumulated_value() {
        let t = "for x, y in data:\n    loss = crit(model(x), y)\n    total += loss\n";
        assert_eq!(
            fix(DETACH, t, 3).unwrap(),
            "for x, y in data:\n    loss = crit(model(x), y)\n    total += loss.detach()\n"
        );
        assert_eq!(
            fix(ITEM, t, 3).unwrap(),
            "for x, y in data:\n    loss = crit(model(x), y)\n    total += loss.item()\n"
        );
    }

    #[test]
    fn detach_handles_assignment_append_and_compound_values() {
        assert_eq!(
            fix(DETACH, "total = total + loss\n", 1).unwrap(),
            "total = total + loss.detach()\n"
        );
        assert_eq!(
            fix(DETACH, "total = loss + total\n", 1).unwrap(),
            "total = loss.detach() + total\n"
        );
        assert_eq!(
            fix(DETACH, "losses.append(out[\"loss\"])  # keep\n", 1).unwrap(),
            "losses.append(out[\"loss\"].detach())  # keep\n"
        );
        assert_eq!(
            fix(DETACH, "stats['loss'] += loss * w  # running sum\n", 1).unwrap(),
            "stats['loss'] += (loss * w).detach()  # running sum\n"
        );
        assert_eq!(
            fix(DETACH, "x = 1; total += crit(out, y)\r\n", 1).unwrap(),
            "x = 1; total += crit(out, y).detach()\r\n"
        );
        assert_eq!(
            fix(DETACH, "self.history.append(\n    loss\n)\n", 1).unwrap(),
            "self.history.append(\n    loss.detach()\n)\n"
        );
    }

    #[test]
    fn a_fix_applied_once_reads_as_already_applied() {
        let cases: [(FixKind, &str, u32); 5] = [
            (DETACH, "total += loss\n", 1),
            (FixKind::DetachCpuAppend, "history.append(out)\n", 1),
            (
                FixKind::DonateArgnums {
                    argnums: vec![0, 1],
                },
                "step = jax.jit(train_step)\n",
                1,
            ),
            (
                FixKind::JaxCheckpoint,
                "def block(x):\n    return x @ x\n",
                2,
            ),
            (
                FixKind::AllocConf {
                    value: "expandable_segments:True".into(),
                },
                "import torch\n",
                1,
            ),
        ];
        for (kind, text, line) in cases {
            let fixed = fix(kind.clone(), text, line).unwrap();
            let after = line + fixed.lines().count() as u32 - text.lines().count() as u32;
            let again = edits_for(&kind, "f.py", &fixed, after).unwrap_err();
            assert!(again.already_applied(), "{kind:?}: {}", again.0);
        }
        // A line that changed for another reason is not "already applied".
        let changed = edits_for(&DETACH, "f.py", "print('hi')\n", 1).unwrap_err();
        assert!(!changed.already_applied(), "{}", changed.0);
    }

    #[test]
    fn detach_refuses_when_already_detached_or_line_changed() {
        for t in [
            "total += loss.detach()\n",
            "total += loss.item()\n",
            "total += float(loss)\n",
            "losses.append(loss.detach().cpu())\n",
        ] {
            let err = fix(DETACH, t, 1).unwrap_err();
            assert!(err.starts_with("line 1 already converts"), "{t}: {err}");
        }
        let err = fix(DETACH, "a\nout = model(x)\n", 2).unwrap_err();
        assert!(
            err.starts_with("line 2 no longer contains an accumulation"),
            "{err}"
        );
        // Operators inside strings and comments are not code.
        assert!(fix(DETACH, "print('total += loss')  # total += loss\n", 1).is_err());
        assert!(fix(DETACH, "if total == loss: pass\n", 1).is_err());
        assert!(fix(DETACH, "total = other + loss\n", 1).is_err());
        assert_eq!(
            fix(DETACH, "x\n", 5).unwrap_err(),
            "line 5 is past the end of the file (1 lines)"
        );
        assert!(fix(DETACH, "", 1).is_err());
    }

    #[test]
    fn columns_are_utf8_bytes() {
        let t = "合計 += loss\n";
        let edits = edits_for(&DETACH, "f.py", t, 1).unwrap();
        assert_eq!(edits.len(), 1);
        assert_eq!(edits[0].line, 1);
        assert_eq!(edits[0].start_col, "合計 += loss".len() as u32);
        assert_eq!(edits[0].start_col, edits[0].end_col);
        assert_eq!(edits[0].new_text, ".detach()");
    }

    #[test]
    fn detach_cpu_append() {
        assert_eq!(
            fix(
                FixKind::DetachCpuAppend,
                "    feats.append(model.enc(x)[0])\n",
                1
            )
            .unwrap(),
            "    feats.append(model.enc(x)[0].detach().cpu())\n"
        );
        assert_eq!(
            fix(FixKind::DetachCpuAppend, "outs.append(a @ b)\n", 1).unwrap(),
            "outs.append((a @ b).detach().cpu())\n"
        );
        assert!(
            fix(FixKind::DetachCpuAppend, "outs.append(a.cpu())\n", 1)
                .unwrap_err()
                .contains("already converts")
        );
        assert!(
            fix(FixKind::DetachCpuAppend, "outs += [a]\n", 1)
                .unwrap_err()
                .starts_with("line 1 no longer contains `.append(…)`")
        );
    }

    #[test]
    fn device_get_append() {
        // d_grads_kept.py line 51.
        let t = "    for _ in range(steps):\n        params, grads, loss = sgd_step_jit(params, x, y)\n        grad_history.append(grads)  # CULPRIT(growth): every step's grads stay alive\n";
        assert_eq!(
            fix(FixKind::DeviceGetAppend, t, 3).unwrap(),
            t.replace("append(grads)", "append(jax.device_get(grads))")
        );
        assert!(fix(FixKind::DeviceGetAppend, "h.append(jax.device_get(g))\n", 1).is_err());
    }

    #[test]
    fn donate_argnums_on_a_jit_call() {
        // b_mlp_nodonate.py line 57.
        let t = "train_step_jit = jax.jit(train_step)  # CULPRIT(no-donation): params/opt_state not donated\n";
        assert_eq!(
            fix(donate(&[0, 1]), t, 1).unwrap(),
            "train_step_jit = jax.jit(train_step, donate_argnums=(0, 1))  # CULPRIT(no-donation): params/opt_state not donated\n"
        );
        assert_eq!(
            fix(donate(&[0]), "step = jit(f, static_argnums=(2,))\n", 1).unwrap(),
            "step = jit(f, static_argnums=(2,), donate_argnums=(0,))\n"
        );
        assert_eq!(
            fix(donate(&[0, 1]), "step = jax.jit(f, static_argnums=1)\n", 1).unwrap(),
            "step = jax.jit(f, static_argnums=1, donate_argnums=(0,))\n"
        );
        assert_eq!(
            fix(donate(&[0]), "step = jax.jit(\n    f,\n)\n", 1).unwrap(),
            "step = jax.jit(\n    f, donate_argnums=(0,),\n)\n"
        );
        assert!(
            fix(donate(&[1]), "step = jax.jit(f, static_argnums=(1,))\n", 1)
                .unwrap_err()
                .contains("static")
        );
        assert!(
            fix(donate(&[0]), "step = jax.jit(f, donate_argnums=(0,))\n", 1)
                .unwrap_err()
                .contains("already donates")
        );
        assert!(
            fix(donate(&[0]), "step = make_step(f)\n", 1)
                .unwrap_err()
                .starts_with("line 1 no longer contains a `jax.jit(…)`")
        );
        assert!(fix(donate(&[0]), "step = myjax.jit(f)\n", 1).is_err());
    }

    #[test]
    fn donate_argnums_on_decorators() {
        let t = "import jax\n\n@partial(jax.jit, static_argnums=(2,))\ndef step(p, s, n):\n    return p\n";
        assert_eq!(
            fix(donate(&[0, 1]), t, 4).unwrap(),
            t.replace(
                "static_argnums=(2,))",
                "static_argnums=(2,), donate_argnums=(0, 1))"
            )
        );
        // A line in the body finds the decorator of its function.
        assert_eq!(fix(donate(&[0, 1]), t, 5), fix(donate(&[0, 1]), t, 4));
        let bare = "\"\"\"Doc.\"\"\"\nfrom __future__ import annotations\nimport jax\n\n\n@jax.jit\ndef step(p, x):\n    return p\n";
        assert_eq!(
            fix(donate(&[0]), bare, 7).unwrap(),
            "\"\"\"Doc.\"\"\"\nfrom __future__ import annotations\nfrom functools import partial\nimport jax\n\n\n@partial(jax.jit, donate_argnums=(0,))\ndef step(p, x):\n    return p\n"
        );
        let with_functools = "import functools\nimport jax\n@jax.jit\ndef step(p):\n    return p\n";
        assert_eq!(
            fix(donate(&[0]), with_functools, 3).unwrap(),
            "import functools\nimport jax\n@functools.partial(jax.jit, donate_argnums=(0,))\ndef step(p):\n    return p\n"
        );
    }

    #[test]
    fn checkpoint_goes_above_the_owning_def() {
        let t = "import jax\n\n\ndef attention(p, x):\n    q = x @ p\n    for i in range(3):\n        s = jnp.einsum(\"a\", q,\n                       q)\n    return s\n";
        let want = "import jax\n\n\n@jax.checkpoint\ndef attention(p, x):\n    q = x @ p\n    for i in range(3):\n        s = jnp.einsum(\"a\", q,\n                       q)\n    return s\n";
        assert_eq!(fix(FixKind::JaxCheckpoint, t, 7).unwrap(), want);
        assert_eq!(fix(FixKind::JaxCheckpoint, t, 8).unwrap(), want);
        assert_eq!(fix(FixKind::JaxCheckpoint, t, 4).unwrap(), want);
        let method = "class Block:\n    @staticmethod\n    def mlp(x):\n        return x * 2\n";
        assert_eq!(
            fix(FixKind::JaxCheckpoint, method, 4).unwrap(),
            "class Block:\n    @staticmethod\n    @jax.checkpoint\n    def mlp(x):\n        return x * 2\n"
        );
        assert!(
            fix(FixKind::JaxCheckpoint, "x = 1\ny = f(x)\n", 2)
                .unwrap_err()
                .contains("not inside a function")
        );
        assert!(
            fix(
                FixKind::JaxCheckpoint,
                "@jax.checkpoint\ndef f(x):\n    return x\n",
                3
            )
            .unwrap_err()
            .contains("already rematerialised")
        );
    }

    #[test]
    fn alloc_conf_goes_before_import_torch() {
        let value = "expandable_segments:True".to_string();
        let kind = FixKind::AllocConf {
            value: value.clone(),
        };
        let t = "\"\"\"Train.\n\nimport torch in a docstring\n\"\"\"\nimport argparse\nimport torchvision\nimport torch.nn as nn\n";
        assert_eq!(
            fix(kind.clone(), t, 99).unwrap(),
            "\"\"\"Train.\n\nimport torch in a docstring\n\"\"\"\nimport argparse\nimport torchvision\nimport os\nos.environ.setdefault(\"PYTORCH_ALLOC_CONF\", \"expandable_segments:True\")\nimport torch.nn as nn\n"
        );
        assert_eq!(
            fix(kind.clone(), "import os\nfrom torch import nn\n", 1).unwrap(),
            "import os\nos.environ.setdefault(\"PYTORCH_ALLOC_CONF\", \"expandable_segments:True\")\nfrom torch import nn\n"
        );
        assert!(
            fix(kind.clone(), "import numpy\n", 1)
                .unwrap_err()
                .contains("no top-level `import torch`")
        );
        assert!(
            fix(
                kind,
                "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"x\"\nimport torch\n",
                1
            )
            .unwrap_err()
            .contains("already sets")
        );
    }

    #[test]
    fn advice_has_no_edit() {
        assert_eq!(
            fix(FixKind::Advice, "x = 1\n", 1).unwrap_err(),
            "advice only: there is no local edit"
        );
    }

    /// Every kind on every line of odd text: no panic, and every edit lies inside its line on
    /// character boundaries.
    #[test]
    fn never_panics_and_edits_stay_in_bounds() {
        let mut texts = vec![
            "x = '''unterminated\n(((\n]]]\ntotal += \\\n  loss\n".to_string(),
            "\t\tlosses.append(\n@jax.jit\ndef\n@\n@partial(\nimport torch\r\n".to_string(),
            "é = \"ü\" ; total += λ  # ç\nx.append(é, ü)\njax.jit(f,, )\njit()\n".to_string(),
            "def f(:\n  @jax.checkpoint\n    total = total +\n= + =\n+=\n'\n\"\"\"\n".to_string(),
            "total += loss\\".to_string(),
            String::new(),
            "\n\n\n".to_string(),
        ];
        if let Some(dir) = crate::testdata::shared("jax_cpu_captures") {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Ok(t) = std::fs::read_to_string(e.path().join(format!("{name}.py"))) {
                    texts.push(t);
                }
            }
        }
        assert!(texts.len() >= 7);
        let kinds = [
            DETACH,
            ITEM,
            FixKind::DetachCpuAppend,
            FixKind::DeviceGetAppend,
            donate(&[0, 1]),
            donate(&[]),
            FixKind::JaxCheckpoint,
            FixKind::AllocConf {
                value: "a\"b".into(),
            },
            FixKind::Advice,
        ];
        let mut made = 0;
        for text in &texts {
            let lines: Vec<&str> = text.split('\n').collect();
            for kind in &kinds {
                for line in 0..=lines.len() as u32 + 1 {
                    let Ok(edits) = edits_for(kind, "f.py", text, line) else {
                        continue;
                    };
                    assert!(!edits.is_empty());
                    made += 1;
                    for e in &edits {
                        let l = lines[e.line as usize - 1];
                        assert!(e.start_col <= e.end_col && e.end_col as usize <= l.len());
                        assert!(l.is_char_boundary(e.start_col as usize));
                        assert!(l.is_char_boundary(e.end_col as usize));
                    }
                }
            }
        }
        assert!(made > 0);
    }

    #[test]
    fn scanner_skips_strings_and_marks_continuations() {
        let src = Source::new(
            "a = '''x\nimport torch\n'''\nb = (1,\n  2)\nc = 1 + \\\n  2\nd = 'it''s' # (\n",
        );
        assert_eq!(
            src.statement_line,
            [true, false, false, true, false, true, false, true]
        );
    }
}
