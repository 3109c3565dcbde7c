//! Two fix recipes on a forward's line.
//!
//! - PT005, two graphs alive at the peak (`DropOutput`): the loop rebinds `out = model(x)`, so
//!   the previous output (and the graph it holds) is released only after the next forward built
//!   its own. Inserting `out = None` before that statement drops it first; unlike `del out` it
//!   also runs on the first iteration, when `out` is not yet bound.
//! - PT018, materialised attention (`ScaledDotProductAttention`): the call of the hand-written
//!   attention on the line becomes `torch.nn.functional.scaled_dot_product_attention(`. The
//!   positional order (query, key, value, mask) is the same as the usual hand-written one, but
//!   the mask convention and the scale must be checked: a suggestion, never the preferred fix.

use super::python::{Edit, NoEdit, Source, imports_module, is_ident};

/// The name a simple assignment `name = <call>` binds on the statement at 0-based `stmt`.
fn assigned_call<'a>(src: &Source<'a>, stmt: usize) -> Option<&'a str> {
    let t = src.line_text(stmt).trim_start();
    let b = t.as_bytes();
    let n = b.iter().take_while(|&&c| is_ident(c)).count();
    if n == 0 || b[0].is_ascii_digit() {
        return None;
    }
    let rest = t[n..].trim_start();
    let value = rest.strip_prefix('=')?;
    if value.starts_with('=') || !value.contains('(') {
        return None;
    }
    Some(&t[..n])
}

/// Insert `name = None` before the forward at 0-based line `idx` that rebinds `name` in a loop.
pub(crate) fn drop_output(src: &Source, idx: usize) -> Result<Vec<Edit>, NoEdit> {
    let stmt = src.statement_start(idx);
    let Some(name) = assigned_call(src, stmt) else {
        return Err(NoEdit(format!(
            "line {} does not assign a call's result to a name",
            idx + 1
        )));
    };
    // The enclosing blocks up to the function: a loop must rebind the name each iteration.
    let mut width = src.indent(stmt).len();
    let mut in_loop = false;
    for i in (0..stmt).rev() {
        if !src.is_code_line(i) || src.indent(i).len() >= width {
            continue;
        }
        width = src.indent(i).len();
        let t = src.line_text(i).trim();
        if (t.starts_with("for ") || t.starts_with("while ") || t.starts_with("async for "))
            && t.ends_with(':')
        {
            in_loop = true;
            break;
        }
        if t.starts_with("def ") || t.starts_with("async def ") || t.starts_with("class ") {
            break;
        }
    }
    if !in_loop {
        return Err(NoEdit(format!(
            "line {} is not in a loop: there is no previous `{name}` to drop",
            idx + 1
        )));
    }
    // Already dropped on the line before?
    if let Some(prev) = (0..stmt).rev().find(|&i| src.is_code_line(i)) {
        let p = src.line_text(prev).trim();
        if p == format!("del {name}") || p.replace(' ', "") == format!("{name}=None") {
            return Err(NoEdit(format!(
                "`{name}` is already dropped before line {}",
                idx + 1
            )));
        }
    }
    Ok(vec![Edit::insert(
        src.line_starts[stmt],
        format!(
            "{}{name} = None  # drop the previous output and its graph before the next forward\n",
            src.indent(stmt)
        ),
    )])
}

/// Replace the call of `callee` (with any `module.` prefix) on 0-based line `idx` by
/// `torch.nn.functional.scaled_dot_product_attention`.
pub(crate) fn sdpa(src: &Source, idx: usize, callee: &str) -> Result<Vec<Edit>, NoEdit> {
    const SDPA: &str = "torch.nn.functional.scaled_dot_product_attention";
    if !src.text.lines().any(|l| imports_module(l.trim(), "torch")) {
        return Err(NoEdit("the file does not import torch".into()));
    }
    let (start, end) = src.line_span(idx);
    let line = &src.text[start..end];
    let b = line.as_bytes();
    let mut from = 0;
    while let Some(p) = line[from..].find(callee) {
        let s = from + p;
        let e = s + callee.len();
        from = e;
        let before_ok = s == 0 || !is_ident(b[s - 1]);
        let after = line[e..].trim_start();
        if !before_ok || !after.starts_with('(') {
            continue;
        }
        // Take a dotted prefix (`nn_utils.`, `F.`) with the name.
        let mut q = s;
        while q > 0 && (is_ident(b[q - 1]) || b[q - 1] == b'.') {
            q -= 1;
        }
        let called = &line[q..e];
        if called == SDPA || called == "F.scaled_dot_product_attention" {
            return Err(NoEdit("the line already calls the fused attention".into()));
        }
        return Ok(vec![Edit {
            start: start + q,
            end: start + e,
            text: SDPA.into(),
        }]);
    }
    Err(NoEdit(format!("line {} does not call `{callee}`", idx + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(
        text: &str,
        line: u32,
        f: impl Fn(&Source, usize) -> Result<Vec<Edit>, NoEdit>,
    ) -> Result<String, NoEdit> {
        let src = Source::new(text);
        let edits = f(&src, src.line_index(line)?)?;
        let mut out = text.to_string();
        for e in edits.into_iter().rev() {
            out.replace_range(e.start..e.end, &e.text);
        }
        Ok(out)
    }

    #[test]
    fn the_previous_output_is_dropped_before_the_forward_that_rebinds_it() {
        let text = "import torch\nfor x in xs:\n    out = model(x)\n    y = out.sum()\n";
        assert_eq!(
            apply(text, 3, drop_output).unwrap(),
            "import torch\nfor x in xs:\n    out = None  # drop the previous output and its graph before the next forward\n    out = model(x)\n    y = out.sum()\n"
        );
        // Outside a loop, not an assignment of a call, or already dropped: no edit.
        assert!(
            apply("out = model(x)\n", 1, drop_output)
                .unwrap_err()
                .0
                .contains("not in a loop")
        );
        assert!(
            apply("for x in xs:\n    f(x)\n", 2, drop_output)
                .unwrap_err()
                .0
                .contains("assign")
        );
        assert!(
            apply(
                "for x in xs:\n    del out\n    out = model(x)\n",
                3,
                drop_output
            )
            .unwrap_err()
            .0
            .contains("already dropped")
        );
        assert!(apply("for x in xs:\n    ok = a == b(x)\n", 2, drop_output).is_ok());
        assert!(apply("for x in xs:\n    ok == b(x)\n", 2, drop_output).is_err());
    }

    #[test]
    fn the_hand_written_attention_call_becomes_the_fused_one() {
        let text =
            "import torch\n        attn = nn_utils.scaled_dot_product_attention(q, k, v, mask)\n";
        assert_eq!(
            apply(text, 2, |s, i| sdpa(s, i, "scaled_dot_product_attention")).unwrap(),
            "import torch\n        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, mask)\n"
        );
        let text = "import torch\nx = my_attention(q, k, v)\n";
        assert_eq!(
            apply(text, 2, |s, i| sdpa(s, i, "attention"))
                .unwrap_err()
                .0,
            "line 2 does not call `attention`"
        );
        assert!(
            apply("x = attention(q, k, v)\n", 1, |s, i| sdpa(
                s,
                i,
                "attention"
            ))
            .unwrap_err()
            .0
            .contains("import torch")
        );
    }
}
