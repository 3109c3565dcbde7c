//! PT005 (forward with no backward): wrap the loop that runs the forward in
//! `with torch.inference_mode():` — or, outside a loop, the statement itself. The culprit line is
//! where the output is dropped (`out = model(x)` in the loop). Lines are indented by four spaces
//! under the new `with`; a block holding a triple-quoted string is not touched (its text would
//! change), nor one already under `no_grad` / `inference_mode`.

use super::python::{Edit, NoEdit, Source, imports_module};

/// Edits that put the loop around 0-based line `idx` (or the statement) under inference mode.
pub(crate) fn inference_mode(src: &Source, idx: usize) -> Result<Vec<Edit>, NoEdit> {
    if !src.text.lines().any(|l| imports_module(l.trim(), "torch")) {
        return Err(NoEdit("the file does not import torch".into()));
    }
    let stmt = src.statement_start(idx);
    if !src.is_code_line(stmt) {
        return Err(NoEdit(format!("line {} holds no statement", idx + 1)));
    }
    // The enclosing blocks up to the function, innermost first: a `with` that already disables
    // grad means there is nothing to do; the nearest `for` / `while` runs the forward again and
    // again.
    let mut block = None;
    let mut width = src.indent(stmt).len();
    for i in (0..stmt).rev() {
        if !src.is_code_line(i) || src.indent(i).len() >= width {
            continue;
        }
        width = src.indent(i).len();
        let t = src.line_text(i).trim();
        if t.starts_with("with ") && (t.contains("no_grad") || t.contains("inference_mode")) {
            return Err(NoEdit(format!(
                "line {} already runs under `{}`",
                idx + 1,
                t.trim_end_matches(':')
            )));
        }
        if block.is_none()
            && (t.starts_with("for ") || t.starts_with("while ") || t.starts_with("async for "))
            && t.ends_with(':')
        {
            block = Some(i);
        }
        if t.starts_with("def ") || t.starts_with("async def ") || t.starts_with("class ") {
            break;
        }
    }
    let (first, last) = match block {
        Some(h) => (h, block_end(src, h)),
        None => (stmt, statement_last_line(src, stmt)),
    };
    let body: Vec<usize> = (first..=last).collect();
    if body
        .iter()
        .any(|&i| src.line_text(i).contains("\"\"\"") || src.line_text(i).contains("'''"))
    {
        return Err(NoEdit(
            "the block holds a triple-quoted string; re-indenting it would change its text".into(),
        ));
    }
    // The first line's indent and the `with` line are one insertion: two at one offset would
    // depend on the order a client applies them.
    let mut edits = vec![Edit::insert(
        src.line_starts[first],
        format!("{}with torch.inference_mode():\n    ", src.indent(first)),
    )];
    for i in body.into_iter().skip(1) {
        if !src.line_text(i).trim().is_empty() {
            edits.push(Edit::insert(src.line_starts[i], "    "));
        }
    }
    Ok(edits)
}

/// Last line of the block whose header is `h`: every following line indented deeper, or blank,
/// or continuing a statement (trailing blank lines are left out).
fn block_end(src: &Source, h: usize) -> usize {
    let width = src.indent(h).len();
    let mut last = h;
    for i in h + 1..src.line_count() {
        let t = src.line_text(i);
        if t.trim().is_empty() {
            continue;
        }
        if src.statement_line[i] && src.indent(i).len() <= width && !t.trim_start().starts_with('#')
        {
            break;
        }
        last = i;
    }
    last
}

/// Last physical line of the statement starting at `s`.
fn statement_last_line(src: &Source, s: usize) -> usize {
    let mut last = s;
    for i in s + 1..src.line_count() {
        if src.statement_line[i] {
            break;
        }
        last = i;
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(text: &str, line: u32) -> Result<String, NoEdit> {
        let src = Source::new(text);
        let mut edits = inference_mode(&src, src.line_index(line)?)?;
        edits.sort_by_key(|e| std::cmp::Reverse(e.start));
        let mut out = text.to_string();
        for e in edits {
            out.replace_range(e.start..e.end, &e.text);
        }
        Ok(out)
    }

    #[test]
    fn the_loop_that_runs_the_forward_goes_under_inference_mode() {
        let text = "import torch\n\ndef bench(model, xs):\n    for x in xs:\n        out = model(x)\n        t = out.sum()\n\n    return t\n";
        assert_eq!(
            apply(text, 5).unwrap(),
            "import torch\n\ndef bench(model, xs):\n    with torch.inference_mode():\n        for x in xs:\n            out = model(x)\n            t = out.sum()\n\n    return t\n"
        );
    }

    #[test]
    fn a_statement_outside_a_loop_is_wrapped_alone_and_nothing_is_guessed() {
        let text = "import torch\ny = model(\n    x)\nprint(y)\n";
        assert_eq!(
            apply(text, 2).unwrap(),
            "import torch\nwith torch.inference_mode():\n    y = model(\n        x)\nprint(y)\n"
        );
        let done =
            "import torch\nwith torch.no_grad():\n    for x in xs:\n        out = model(x)\n";
        assert!(apply(done, 4).unwrap_err().0.contains("already runs under"));
        assert!(
            apply("out = model(x)\n", 1)
                .unwrap_err()
                .0
                .contains("import torch")
        );
        let doc = "import torch\nfor x in xs:\n    \"\"\"doc\n    \"\"\"\n    out = model(x)\n";
        assert!(apply(doc, 5).unwrap_err().0.contains("triple-quoted"));
    }
}
