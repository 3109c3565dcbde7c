//! Turn a finding's `FixKind` into text edits against the current text of a file.

use crate::findings::{FixKind, TextEdit};

/// Why no edit could be made (the line changed since the capture, no match, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoEdit(pub String);

/// Edits for `kind` at 1-based `line` of `text` (the file or the editor buffer). `file` is copied
/// into the edits. Returns `NoEdit` with a reason when the line no longer matches the capture.
pub fn edits_for(
    kind: &FixKind,
    _file: &str,
    _text: &str,
    _line: u32,
) -> Result<Vec<TextEdit>, NoEdit> {
    match kind {
        _ => Err(NoEdit("not implemented yet".into())),
    }
}
