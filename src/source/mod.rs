//! Locate: capture paths → workspace files, the user-frame rule, fix edits.

pub mod edits;
pub mod frames;
pub mod paths;
pub mod workspace;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::findings::{Finding, FixKind, Location};
use crate::report::CaptureReport;
use frames::FrameFilter;
use paths::Resolver;

/// Source files larger than this are not read for fix edits.
const MAX_SOURCE_BYTES: u64 = 8 << 20;

/// Fill `Fix.edit` for every fix of `report` that is a local edit, against the current text of
/// the file [`fix_target`] names. Fixes whose file is not found, or whose line no longer matches,
/// keep `edit: None`.
pub fn resolve_fixes(report: &mut CaptureReport, resolver: &Resolver) {
    let mut texts: HashMap<PathBuf, Option<String>> = HashMap::new();
    for finding in &mut report.findings {
        let targets: Vec<Option<(PathBuf, u32)>> = finding
            .fixes
            .iter()
            .map(|fix| match fix.edit {
                None => fix_target(finding, &fix.kind, resolver),
                Some(_) => None,
            })
            .collect();
        for (fix, target) in finding.fixes.iter_mut().zip(targets) {
            let Some((local, line)) = target else {
                continue;
            };
            let text = texts
                .entry(local.clone())
                .or_insert_with(|| read_source(&local));
            if let Some(text) = text {
                fix.edit = edits::edits_for(&fix.kind, &local.to_string_lossy(), text, line).ok();
            }
        }
    }
}

/// The local file and 1-based line a fix of `finding` edits, if it is a local edit and the file
/// resolves: the culprit line, except for an allocator setting, which goes into the entry script
/// (the outermost user frame) where it runs before anything imports torch.
pub fn fix_target(
    finding: &Finding,
    kind: &FixKind,
    resolver: &Resolver,
) -> Option<(PathBuf, u32)> {
    let loc = finding.location.as_ref()?;
    let culprit = || Some((resolver.resolve(&loc.file)?, loc.line));
    match kind {
        FixKind::Advice => None,
        FixKind::AllocConf { .. } => entry_script(&finding.stack, resolver).or_else(culprit),
        _ => culprit(),
    }
}

/// The outermost user frame of `stack` (innermost first) that resolves to a local file.
fn entry_script(stack: &[Location], resolver: &Resolver) -> Option<(PathBuf, u32)> {
    let filter = FrameFilter::default();
    stack
        .iter()
        .rev()
        .filter(|l| filter.is_user(&l.file))
        .find_map(|l| Some((resolver.resolve(&l.file)?, l.line)))
}

/// A Python source as text, if it is readable, UTF-8 and not huge.
fn read_source(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.len() > MAX_SOURCE_BYTES {
        return None;
    }
    std::fs::read_to_string(path).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::{Code, Fix, Severity};
    use crate::report::{CaptureKind, EngineData};

    fn loc(file: &str, line: u32) -> Location {
        Location {
            file: file.into(),
            line,
            function: "f".into(),
        }
    }

    #[test]
    fn alloc_conf_goes_into_the_entry_script_and_detach_into_the_culprit() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(
            ws.path().join("train.py"),
            "import torch\nfrom model import Net\nNet()(x)\n",
        )
        .unwrap();
        std::fs::write(
            ws.path().join("model.py"),
            "import torch\n\ndef fwd(x):\n    total += x\n",
        )
        .unwrap();
        let resolver = Resolver::new(vec![ws.path().to_path_buf()], vec![]);
        let culprit = loc("/job/model.py", 4);
        let stack = vec![
            loc(
                "/usr/lib/python3/site-packages/torch/nn/modules/module.py",
                1,
            ),
            culprit.clone(),
            loc("/job/train.py", 3),
            loc("<frozen runpy>", 88),
        ];
        let finding = Finding::new(Code::PT008, Severity::Error, "m")
            .at(Some(culprit), stack)
            .fix(Fix::new(
                "allocator",
                FixKind::AllocConf {
                    value: "expandable_segments:True".into(),
                },
            ))
            .fix(Fix::new(
                "detach",
                FixKind::DetachAccumulated { item: false },
            ))
            .fix(Fix::advice("read the docs"));
        let mut report = CaptureReport {
            path: ws.path().join("s.pickle"),
            kind: CaptureKind::TorchSnapshot,
            headline: String::new(),
            engine: EngineData::None,
            sites: vec![],
            findings: vec![finding],
            text: String::new(),
        };
        resolve_fixes(&mut report, &resolver);
        let fixes = &report.findings[0].fixes;
        let alloc = fixes[0].edit.as_ref().unwrap();
        assert_eq!(Path::new(&alloc[0].file), ws.path().join("train.py"));
        assert_eq!((alloc[0].line, alloc[0].start_col), (1, 0));
        let detach = fixes[1].edit.as_ref().unwrap();
        assert_eq!(Path::new(&detach[0].file), ws.path().join("model.py"));
        assert_eq!(detach[0].line, 4);
        assert_eq!(fixes[2].edit, None);
    }

    #[test]
    fn unresolved_files_get_no_edit() {
        let resolver = Resolver::with_files(vec![], vec![], vec![]);
        let mut report = CaptureReport {
            path: "s.pickle".into(),
            kind: CaptureKind::TorchSnapshot,
            headline: String::new(),
            engine: EngineData::None,
            sites: vec![],
            findings: vec![
                Finding::new(Code::PT003, Severity::Warning, "m")
                    .at(Some(loc("/nowhere/x.py", 1)), vec![])
                    .fix(Fix::new("cpu", FixKind::DetachCpuAppend)),
            ],
            text: String::new(),
        };
        resolve_fixes(&mut report, &resolver);
        assert_eq!(report.findings[0].fixes[0].edit, None);
    }
}
