//! Locate: capture paths → workspace files, the user-frame rule, fix edits.

pub mod edits;
pub mod frames;
pub mod paths;
pub mod workspace;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::findings::FixKind;
use crate::report::CaptureReport;
use paths::Resolver;

/// Source files larger than this are not read for fix edits.
const MAX_SOURCE_BYTES: u64 = 8 << 20;

/// Fill `Fix.edit` for every fix of `report` that is a local edit, against the current text of
/// the file its finding points at (resolved through `resolver`). Fixes whose file is not found,
/// or whose line no longer matches, keep `edit: None`.
pub fn resolve_fixes(report: &mut CaptureReport, resolver: &Resolver) {
    let mut texts: HashMap<PathBuf, Option<String>> = HashMap::new();
    for finding in &mut report.findings {
        let Some(loc) = &finding.location else {
            continue;
        };
        if finding
            .fixes
            .iter()
            .all(|f| f.kind == FixKind::Advice || f.edit.is_some())
        {
            continue;
        }
        let Some(local) = resolver.resolve(&loc.file) else {
            continue;
        };
        let text = texts
            .entry(local.clone())
            .or_insert_with(|| read_source(&local));
        let Some(text) = text else {
            continue;
        };
        let file = local.to_string_lossy();
        for fix in &mut finding.fixes {
            if fix.edit.is_none() && fix.kind != FixKind::Advice {
                fix.edit = edits::edits_for(&fix.kind, &file, text, loc.line).ok();
            }
        }
    }
}

/// A Python source as text, if it is readable, UTF-8 and not huge.
fn read_source(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.len() > MAX_SOURCE_BYTES {
        return None;
    }
    std::fs::read_to_string(path).ok()
}
