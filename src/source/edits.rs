//! Turn a finding's `FixKind` into text edits against the current text of a file: the fix
//! recipes, over the scanner of `super::python`, which finds the accumulating expression, the
//! `jax.jit(...)` call or the owning `def` on a line the capture named. When the line no longer looks like what the fix
//! expects (the file changed since the capture), the answer is [`NoEdit`] with the reason, never a
//! guess. Columns are 0-based UTF-8 byte columns; the language server converts them.

use crate::findings::{FixKind, TextEdit};

use super::python;
use super::python::{
    Code, Edit, JitTarget, Source, decorators, is_ident, is_primary, jit_target, matching_close,
    method_calls, owner_def, skip_blank, skip_ws, split_top_level, trim_end,
};

pub use super::python::NoEdit;

/// Edits for `kind` at 1-based `line` of `text` (the file or the editor buffer). `file` is copied
/// into the edits. Returns `NoEdit` with a reason when the line no longer matches the capture.
pub fn edits_for(
    kind: &FixKind,
    file: &str,
    text: &str,
    line: u32,
) -> Result<Vec<TextEdit>, NoEdit> {
    edits_in(kind, file, &Source::new(text), line)
}

/// [`edits_for`] on a file already scanned (the server checks every finding of a file against
/// one scan of its text).
pub(crate) fn edits_in(
    kind: &FixKind,
    file: &str,
    src: &Source,
    line: u32,
) -> Result<Vec<TextEdit>, NoEdit> {
    let at = |line: u32| src.line_index(line);
    let edits = match kind {
        FixKind::Advice => return Err(NoEdit("advice only: there is no local edit".into())),
        FixKind::AllocConf { value } => alloc_conf(src, value)?,
        FixKind::DetachAccumulated { item } => detach_accumulated(src, at(line)?, *item)?,
        FixKind::DetachCpuAppend => wrap_append(src, at(line)?, Wrap::DetachCpu)?,
        FixKind::DeviceGetAppend => wrap_append(src, at(line)?, Wrap::DeviceGet)?,
        FixKind::DonateArgnums { argnums, .. } => donate_argnums(src, at(line)?, argnums)?,
        FixKind::JaxCheckpoint => jax_checkpoint(src, at(line)?)?,
        FixKind::InferenceMode => super::inference_mode::inference_mode(src, at(line)?)?,
        FixKind::DropOutput => super::forward_edits::drop_output(src, at(line)?)?,
        FixKind::ScaledDotProductAttention { callee } => {
            super::forward_edits::sdpa(src, at(line)?, callee)?
        }
    };
    Ok(edits.into_iter().map(|e| src.text_edit(file, e)).collect())
}

/// The framework a training loop runs, for "Record a memory capture here".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureFramework {
    Torch,
    Jax,
}

/// The training loop whose header is at 1-based `line` of `text`: a `for`/`while` statement
/// whose body steps a model (`.backward(` or an optimizer's `.step(` in a file that imports torch;
/// a call of a `jax.jit` function or of a `…step(` function in a file that imports jax).
pub fn training_loop_at(text: &str, line: u32) -> Option<CaptureFramework> {
    let src = Source::new(text);
    let idx = src.line_index(line).ok()?;
    training_loop(&src, idx).map(|(framework, _, _)| framework)
}

/// [`training_loop_at`] on a scanned file: the framework, the body's indent and last line.
fn training_loop<'a>(src: &Source<'a>, idx: usize) -> Option<(CaptureFramework, &'a str, usize)> {
    let (body_indent, end) = loop_body(src, idx)?;
    let body: String = (idx + 1..=end)
        .map(|i| src.line_text(i))
        .collect::<Vec<_>>()
        .join("\n");
    let imports = |m: &str| {
        (0..src.line_count()).any(|i| {
            src.is_code_line(i) && python::imports_module(src.line_text(i).trim_start(), m)
        })
    };
    if imports("torch") && (body.contains(".backward(") || body.contains(".step(")) {
        return Some((CaptureFramework::Torch, body_indent, end));
    }
    if imports("jax") && (body.contains("step(") || body.contains("_jit(")) {
        return Some((CaptureFramework::Jax, body_indent, end));
    }
    None
}

/// The last line of the body of the loop whose header is line `idx` (0-based), and the body's
/// indent; `None` when line `idx` is not a `for`/`while` header with an indented body.
fn loop_body<'a>(src: &Source<'a>, idx: usize) -> Option<(&'a str, usize)> {
    if !src.is_code_line(idx) {
        return None;
    }
    let t = src.line_text(idx).trim_start();
    let header = (t.starts_with("for ") || t.starts_with("while ") || t.starts_with("async for "))
        && t.trim_end().ends_with(':');
    if !header {
        return None;
    }
    let indent = src.indent(idx).len();
    let mut body_indent = None;
    let mut last = None;
    for i in idx + 1..src.line_count() {
        let text = src.line_text(i);
        if text.trim().is_empty() {
            continue;
        }
        if src.is_code_line(i) && src.indent(i).len() <= indent {
            break;
        }
        if src.is_code_line(i) && body_indent.is_none() {
            body_indent = Some(src.indent(i));
        }
        if !text.trim_start().starts_with('#') || !src.statement_line[i] {
            last = Some(i);
        }
    }
    Some((body_indent?, last?))
}

/// "Record a memory capture here": start `memlsp_capture` before the loop at 1-based `line`,
/// step it at the end of each iteration, stop it after the loop (and import it).
pub fn record_capture(
    file: &str,
    text: &str,
    line: u32,
) -> Result<(CaptureFramework, Vec<TextEdit>), NoEdit> {
    let src = Source::new(text);
    if text.contains("memlsp_capture.") {
        return Err(NoEdit(
            "the file already records a memory capture (memlsp_capture)".into(),
        ));
    }
    let idx = src.line_index(line)?;
    let (framework, body_indent, last) = training_loop(&src, idx).ok_or_else(|| {
        NoEdit(format!(
            "line {line} is not the header of a training loop (a for/while loop whose body calls \
             .backward()/.step() or a jitted step)"
        ))
    })?;
    let indent = src.indent(idx);
    let start = match framework {
        CaptureFramework::Torch => format!(
            "{indent}# memlsp: snapshots after steps 1 and 10 (and at an OOM) in memlsp-captures/; start\n\
             {indent}# it before the model is built to give parameters and optimizer state a stack too\n\
             {indent}_memlsp_capture = memlsp_capture.torch(\"memlsp-captures\", steps=(1, 10))\n\
             {indent}_memlsp_capture.start()\n"
        ),
        CaptureFramework::Jax => format!(
            "{indent}# memlsp: a profiler trace of warm steps 2-4 in memlsp-captures/\n\
             {indent}_memlsp_capture = memlsp_capture.jax(\"memlsp-captures\", steps=(2, 4))\n\
             {indent}_memlsp_capture.start()\n"
        ),
    };
    let (_, end) = src.line_span(last);
    let mut edits = [
        Edit::insert(import_position(&src), "import memlsp_capture\n"),
        Edit::insert(src.line_starts[idx], start),
        Edit::insert(
            end,
            format!("\n{body_indent}_memlsp_capture.step()\n{indent}_memlsp_capture.stop()"),
        ),
    ];
    edits.sort_by_key(|e| e.start);
    Ok((
        framework,
        edits.into_iter().map(|e| src.text_edit(file, e)).collect(),
    ))
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

/// `(0,)`, `(0, 1)`: argnums as a Python tuple.
fn tuple_text(nums: &[u32]) -> String {
    format!("({})", crate::xla::diagnose::argnums_tuple(nums))
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
    let top = |i: usize| src.is_code_line(i) && src.indent(i).is_empty();
    let torch = (0..src.line_count())
        .find(|&i| top(i) && python::imports_module(src.line_text(i), "torch"))
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

    fn apply_all(text: &str, edits: &[TextEdit]) -> String {
        let src = Source::new(text);
        let mut out = text.to_string();
        let mut at: Vec<(usize, &TextEdit)> = edits
            .iter()
            .map(|e| {
                (
                    src.line_starts[e.line as usize - 1] + e.start_col as usize,
                    e,
                )
            })
            .collect();
        at.sort_by_key(|x| std::cmp::Reverse(x.0));
        for (off, e) in at {
            out.insert_str(off, &e.new_text);
        }
        out
    }

    #[test]
    fn record_a_capture_around_a_torch_training_loop() {
        let text = "import torch\n\ndef train(model, opt, loader):\n    for x, y in loader:\n        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n\n    return model\n";
        assert_eq!(training_loop_at(text, 4), Some(CaptureFramework::Torch));
        assert_eq!(training_loop_at(text, 5), None, "not on a body line");
        let (_, edits) = record_capture("t.py", text, 4).unwrap();
        let out = apply_all(text, &edits);
        assert_eq!(
            out,
            "import memlsp_capture\nimport torch\n\ndef train(model, opt, loader):\n    # memlsp: snapshots after steps 1 and 10 (and at an OOM) in memlsp-captures/; start\n    # it before the model is built to give parameters and optimizer state a stack too\n    _memlsp_capture = memlsp_capture.torch(\"memlsp-captures\", steps=(1, 10))\n    _memlsp_capture.start()\n    for x, y in loader:\n        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n        _memlsp_capture.step()\n    _memlsp_capture.stop()\n\n    return model\n"
        );
        let again = record_capture("t.py", &out, 9).unwrap_err();
        assert!(again.already_applied(), "{again:?}");
    }

    #[test]
    fn record_a_capture_around_a_jax_loop_at_the_end_of_the_file() {
        let text = "import jax\nstep_jit = jax.jit(step)\nfor i in range(5):\n    params, loss = step_jit(params, batch)";
        assert_eq!(training_loop_at(text, 3), Some(CaptureFramework::Jax));
        let out = apply_all(text, &record_capture("t.py", text, 3).unwrap().1);
        assert!(out.ends_with("    params, loss = step_jit(params, batch)\n    _memlsp_capture.step()\n_memlsp_capture.stop()"), "{out}");
        assert!(out.contains("_memlsp_capture = memlsp_capture.jax(\"memlsp-captures\", steps=(2, 4))\n_memlsp_capture.start()\nfor i in range(5):"), "{out}");
        // Only torch itself makes a loop with `.step(` a torch training loop.
        assert_eq!(
            training_loop_at(
                "import torchvision
for x in data:
    sched.step()
",
                2
            ),
            None
        );
        // A loop that trains nothing gets no action.
        assert_eq!(
            training_loop_at("import jax\nfor i in range(3):\n    print(i)\n", 2),
            None
        );
    }

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
            args: vec![],
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
                    args: vec![],
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
        // And the real programs bundled with the fixtures.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for rel in [
            "fixtures/jax/decorator_nodonate.py",
            "fixtures/jax/scan_layers.py",
            "fixtures/jax/grads_kept.py",
            "fixtures/torch/train_leak.py",
            "fixtures/lsp/proj/train.py",
            "fixtures/lsp/proj/model.py",
        ] {
            texts.push(std::fs::read_to_string(root.join(rel)).unwrap());
        }
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
