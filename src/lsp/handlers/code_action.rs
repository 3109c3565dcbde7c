//! `textDocument/codeAction`: each fix of each finding on the requested lines, as a real edit
//! computed against the current text (the buffer, or the file), or a command that explains; and
//! on a training loop's header, "Record a memory capture here" (`memlsp_capture`).

use std::path::Path;

use serde_json::json;
use tower_lsp_server::ls_types::*;

use crate::findings::FixKind;
use crate::lsp::View;
use crate::lsp::commands;
use crate::lsp::to_proto;
use crate::source::edits;

/// Actions for the lines of `p.range` of `path`; `text` is its current text, `text_of` gives
/// other files' (an allocator setting goes into the entry script); `disabled_support` says
/// whether the client shows disabled actions with their reason.
pub fn code_actions(
    view: &View,
    path: &Path,
    text: &str,
    p: &CodeActionParams,
    text_of: &dyn Fn(&Path) -> Option<String>,
    disabled_support: bool,
) -> Vec<CodeActionOrCommand> {
    let mut out = record_capture(view, path, text, p);
    let path = path.to_path_buf();
    let text = text.to_string();
    let first = p.range.start.line.saturating_add(1);
    let last = p.range.end.line.saturating_add(1).max(first);
    for (line, _, entry) in view.lines_in(&path, first, last) {
        for lf in &entry.findings {
            let f = &lf.finding;
            let diag = view.published(&path, line - 1, f.code);
            for fix in &f.fixes {
                // "Add loss.detach() — peak 23.1 → 11.8 GiB (simulated)"
                let title = crate::present::editor::fix_title(fix);
                let mut action = CodeAction {
                    title: title.clone(),
                    kind: Some(CodeActionKind::QUICKFIX),
                    diagnostics: diag.map(|d| vec![d.clone()]),
                    ..Default::default()
                };
                if fix.kind == FixKind::Advice {
                    action.command = Some(Command {
                        title: title.clone(),
                        command: commands::EXPLAIN.into(),
                        arguments: Some(vec![json!({
                            "code": f.code,
                            "title": fix.title,
                            "url": f.code.docs_url(),
                        })]),
                    });
                    out.push(CodeActionOrCommand::CodeAction(action));
                    continue;
                }
                // An allocator setting belongs in the entry script (the outermost user
                // frame), before anything imports torch; every other fix edits this line.
                let (target, target_line) = match (&fix.kind, &fix.target) {
                    (FixKind::AllocConf { .. }, Some(t)) => (t.file.clone(), t.line),
                    _ => (path.clone(), line),
                };
                let target_text = if target == path {
                    Some(text.clone())
                } else {
                    text_of(&target)
                };
                let target_str = target.to_string_lossy().into_owned();
                // A bug in edit computation must not take the server down.
                let edits = match &target_text {
                    Some(t) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        edits::edits_for(&fix.kind, &target_str, t, target_line)
                    }))
                    .unwrap_or_else(|_| Err(edits::NoEdit("computing the edit failed".into()))),
                    None => Err(edits::NoEdit(format!("cannot read {target_str}"))),
                };
                let ws_edit = match &edits {
                    Ok(e) if !e.is_empty() => to_proto::workspace_edit(
                        e,
                        &|f: &str| {
                            if f == target_str {
                                target_text.clone()
                            } else {
                                text_of(Path::new(f))
                            }
                        },
                        &|f: &str| to_proto::uri(Path::new(f)),
                        view.encoding,
                    ),
                    _ => None,
                };
                match ws_edit {
                    Some(edit) => {
                        action.edit = Some(edit);
                        action.is_preferred = Some(fix.preferred);
                    }
                    None => {
                        let reason = match edits {
                            Err(edits::NoEdit(r)) => r,
                            Ok(_) => "nothing to change on this line".into(),
                        };
                        action.title = format!("{title} (no edit: {reason})");
                        if disabled_support {
                            action.disabled = Some(CodeActionDisabled { reason });
                        }
                    }
                }
                out.push(CodeActionOrCommand::CodeAction(action));
            }
        }
    }
    out
}

/// "Record a memory capture here" on the header of a training loop: `memlsp_capture` started
/// before the loop, stepped at the end of each iteration, stopped after it.
fn record_capture(
    view: &View,
    path: &Path,
    text: &str,
    p: &CodeActionParams,
) -> Vec<CodeActionOrCommand> {
    let line = p.range.start.line.saturating_add(1);
    let file = path.to_string_lossy().into_owned();
    let Ok((framework, e)) = edits::record_capture(&file, text, line) else {
        return Vec::new();
    };
    let what = match framework {
        edits::CaptureFramework::Torch => "snapshots after steps 1 and 10 and at an OOM",
        edits::CaptureFramework::Jax => "a trace of warm steps 2-4",
    };
    let edit = to_proto::workspace_edit(
        &e,
        &|_| Some(text.to_string()),
        &|f: &str| to_proto::uri(Path::new(f)),
        view.encoding,
    );
    edit.map(|edit| {
        CodeActionOrCommand::CodeAction(CodeAction {
            title: format!("Record a memory capture here (memlsp_capture: {what})"),
            kind: Some(CodeActionKind::REFACTOR_REWRITE),
            edit: Some(edit),
            ..Default::default()
        })
    })
    .into_iter()
    .collect()
}
