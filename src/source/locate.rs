//! The locate step, run once per report for every front end: recorded paths → workspace files,
//! the exact line of JAX findings (the `jax.jit` line, the `append` inside a loop) and donation
//! positions from the program text, and each fix's target file, line and edit.
//!
//! Program text is read here and nowhere else: the workspace file a recorded path resolves to,
//! else the recorded path itself when it exists, else a file of the same name beside the capture
//! or in one of its parent folders (a capture recorded on another machine and copied into the
//! project). Only `.py` files under [`MAX_SOURCE_BYTES`] are read.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::edits;
use super::paths::Resolver;
use super::python;
use crate::findings::{
    Evidence, Finding, Fix, FixKind, FixTarget, Location, Refine, Resolved, Stack, TextEdit,
};
use crate::frames::FrameFilter;
use crate::options::LocateOptions;
use crate::report::CaptureReport;
use crate::torch::ranks::RankComparison;

/// Source files larger than this are not read.
pub const MAX_SOURCE_BYTES: u64 = 8 << 20;

/// Resolves one run's reports against a workspace.
pub struct Locator {
    resolver: Arc<Resolver>,
    /// Which frames are the user's (the entry script of an allocator setting).
    frames: FrameFilter,
    texts: RefCell<HashMap<PathBuf, Option<Arc<str>>>>,
    /// Recorded paths already resolved (each costs file-system checks), for the whole run.
    resolved: RefCell<HashMap<String, Option<Resolved>>>,
    /// Rank comparisons already shown: (as analysed, as shown).
    ranks: RefCell<Vec<(Arc<RankComparison>, Arc<RankComparison>)>>,
    /// Stacks already resolved, by the address of the stack as analysed: (as analysed, as
    /// resolved), so a stack shared by sites, findings and ranks stays one value. Holding the
    /// analysed stack keeps its address from being reused.
    stacks: RefCell<HashMap<usize, (Stack, Stack)>>,
}

impl Locator {
    /// A locator over the workspace `opts` names (its Python files are indexed now).
    pub fn new(opts: &LocateOptions, frames: FrameFilter) -> Locator {
        Locator::with_resolver(
            Arc::new(Resolver::new(
                opts.workspace.clone(),
                opts.path_mappings.clone(),
            )),
            frames,
        )
    }

    /// A locator over an existing resolver (the server keeps one per workspace).
    pub fn with_resolver(resolver: Arc<Resolver>, frames: FrameFilter) -> Locator {
        Locator {
            resolver,
            frames,
            texts: RefCell::new(HashMap::new()),
            resolved: RefCell::new(HashMap::new()),
            ranks: RefCell::new(Vec::new()),
            stacks: RefCell::new(HashMap::new()),
        }
    }

    /// `cmp` with its paths shown relative to the workspace; the same value for every report
    /// that shares `cmp`.
    fn shown_ranks(&self, cmp: &Arc<RankComparison>) -> Arc<RankComparison> {
        let mut done = self.ranks.borrow_mut();
        if let Some((_, shown)) = done
            .iter()
            .find(|(from, shown)| Arc::ptr_eq(from, cmp) || Arc::ptr_eq(shown, cmp))
        {
            return shown.clone();
        }
        let mut shown = RankComparison::clone(cmp);
        for row in &mut shown.rows {
            let abs = std::path::absolute(&row.path).unwrap_or_else(|_| row.path.clone());
            row.path = PathBuf::from(self.resolver.relative(&abs));
        }
        let shown = Arc::new(shown);
        done.push((cmp.clone(), shown.clone()));
        shown
    }

    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// Locate everything in `report`. Refinements are consumed: locate a fresh copy of the
    /// engine's report when the workspace changes.
    pub fn locate(&self, report: &mut CaptureReport) {
        let capture = std::path::absolute(&report.path).unwrap_or_else(|_| report.path.clone());
        report.shown_path = Some(self.resolver.relative(&capture));
        if let crate::report::Engine::Torch(t) = &mut report.engine {
            // The other ranks' snapshots, shown the way this one is: once per comparison, which
            // every rank's report shares.
            if let Some(c) = &mut t.rank_comparison {
                *c = self.shown_ranks(c);
            }
            // The sites of the memory-over-time picture.
            for b in t.series.iter_mut().flat_map(|s| s.bands.iter_mut()) {
                self.resolve_all(b.location.iter_mut());
                self.resolve_stack(&mut b.stack);
            }
        }
        for f in &mut report.findings {
            self.refine(f, &capture);
            self.resolve_all(f.location.iter_mut());
            self.note_ambiguous(f);
            self.resolve_stack(&mut f.stack);
            let targets: Vec<Option<(String, u32)>> = f
                .fixes
                .iter()
                .map(|fix| fix_target(f, &fix.kind, &self.frames))
                .collect();
            for (fix, target) in f.fixes.iter_mut().zip(targets) {
                self.place_fix(fix, target);
            }
        }
        for s in &mut report.sites {
            self.resolve_all(s.location.iter_mut().chain(s.callers.iter_mut()));
            self.resolve_stack(&mut s.stack);
        }
    }

    /// Resolve a stack's frames; the stack is copied only where a frame changes, and once per
    /// run however many reports share it.
    fn resolve_stack(&self, stack: &mut Stack) {
        let key = Arc::as_ptr(stack) as *const Location as usize;
        if let Some((_, done)) = self.stacks.borrow().get(&key) {
            *stack = done.clone();
            return;
        }
        let resolved: Vec<Option<Resolved>> = stack.iter().map(|l| self.resolve(&l.file)).collect();
        let analysed = stack.clone();
        if stack.iter().zip(&resolved).any(|(l, r)| l.resolved != *r) {
            let mut fresh: Vec<Location> = stack.to_vec();
            for (l, r) in fresh.iter_mut().zip(resolved) {
                l.resolved = r;
            }
            *stack = fresh.into();
        }
        self.stacks
            .borrow_mut()
            .insert(key, (analysed, stack.clone()));
    }

    fn resolve_all<'a>(&self, locs: impl Iterator<Item = &'a mut Location>) {
        for l in locs {
            l.resolved = self.resolve(&l.file);
        }
    }

    /// The local file of a recorded path, resolved once per run.
    fn resolve(&self, recorded: &str) -> Option<Resolved> {
        if let Some(r) = self.resolved.borrow().get(recorded) {
            return r.clone();
        }
        let r = self.resolver.resolve(recorded).map(|local| Resolved {
            shown: self.resolver.relative(&local),
            local,
        });
        self.resolved
            .borrow_mut()
            .insert(recorded.to_string(), r.clone());
        r
    }

    /// A finding whose recorded file is left unresolved because only its file name matches and
    /// several workspace files share it says so, naming them (a guess would put it on the wrong
    /// file).
    fn note_ambiguous(&self, f: &mut Finding) {
        let Some(l) = f.location.as_ref().filter(|l| l.resolved.is_none()) else {
            return;
        };
        let candidates = self.resolver.ambiguous(&l.file);
        if candidates.is_empty() {
            return;
        }
        let note = format!(
            "{} is not placed in the workspace: only its file name matches, and {} files share \
             it ({}); map the recorded directory with --path-map FROM=TO",
            l.file,
            candidates.len(),
            candidates.join(", ")
        );
        if !f.evidence.iter().any(|e| e.text == note) {
            f.evidence.push(crate::findings::Evidence::inferred(note));
        }
    }

    /// Make a JAX finding's line exact from the program text.
    fn refine(&self, f: &mut Finding, capture: &Path) {
        let Some(refine) = f.refine.take() else {
            return;
        };
        let Some(at) = f.location.clone() else {
            return;
        };
        let text = self.program_text(&at.file, capture);
        match refine {
            Refine::JitLine { function } => {
                let line = text
                    .as_deref()
                    .and_then(|t| python::find_jit_line(t, at.line, &function));
                match line {
                    Some(line) => {
                        let jit = Location::new(at.file.clone(), line, function.clone());
                        move_to(f, &at, jit);
                    }
                    None if text.is_none() => f.evidence.push(Evidence::inferred(
                        "the program text was not found: the location is the call site of the jitted function, not the jax.jit line",
                    )),
                    None => f.evidence.push(Evidence::inferred(format!(
                        "no jax.jit line for `{function}` in {}: the location is the call site of the jitted function",
                        self.resolver.display_path(&at.file)
                    ))),
                }
                let sig = text
                    .as_deref()
                    .and_then(|t| python::signature(t, &function));
                if let Some(sig) = sig {
                    donate_by_signature(f, &sig);
                }
            }
            Refine::InFunction { needle } => {
                if let Some(line) = text
                    .as_deref()
                    .and_then(|t| python::find_in_function(t, at.line, needle))
                {
                    let mut to = at.clone();
                    to.line = line;
                    move_to(f, &at, to);
                }
            }
        }
    }

    /// Target and edit of one fix.
    fn place_fix(&self, fix: &mut Fix, target: Option<(String, u32)>) {
        fix.target = None;
        fix.edit = None;
        let Some((recorded, line)) = target else {
            return;
        };
        let Some(Resolved { local, .. }) = self.resolve(&recorded) else {
            return;
        };
        if let Some(text) = self.read(&local) {
            fix.edit = edits::edits_for(&fix.kind, &local.to_string_lossy(), &text, line)
                .ok()
                .map(|es| {
                    es.into_iter()
                        .map(|e| TextEdit {
                            shown: Some(self.resolver.relative(Path::new(&e.file))),
                            ..e
                        })
                        .collect()
                });
        }
        fix.target = Some(FixTarget { file: local, line });
    }

    /// The program text of a recorded `.py` path (see the module docs for where it is looked for).
    fn program_text(&self, recorded: &str, capture: &Path) -> Option<Arc<str>> {
        if !recorded.ends_with(".py") {
            return None;
        }
        let mut candidates: Vec<PathBuf> = self
            .resolve(recorded)
            .map(|r| r.local)
            .into_iter()
            .collect();
        candidates.push(PathBuf::from(recorded));
        if let Some(name) = Path::new(recorded).file_name() {
            let mut d = capture.parent();
            for _ in 0..5 {
                let Some(here) = d else { break };
                candidates.push(here.join(name));
                d = here.parent();
            }
        }
        candidates
            .into_iter()
            .filter(|p| p.is_file())
            .find_map(|p| self.read(&p))
    }

    /// A Python source as text, if it is readable, UTF-8 and not huge (read once per run).
    fn read(&self, path: &Path) -> Option<Arc<str>> {
        if let Some(t) = self.texts.borrow().get(path) {
            return t.clone();
        }
        let text = std::fs::metadata(path)
            .ok()
            .filter(|m| m.len() <= MAX_SOURCE_BYTES)
            .and_then(|_| std::fs::read_to_string(path).ok())
            .map(Arc::from);
        self.texts
            .borrow_mut()
            .insert(path.to_path_buf(), text.clone());
        text
    }
}

/// Move a finding from `from` to `to` (its location, and the stack frame that was the location).
fn move_to(f: &mut Finding, from: &Location, to: Location) {
    if f.stack.iter().any(|l| l.same_place(from)) {
        for l in Arc::make_mut(&mut f.stack)
            .iter_mut()
            .filter(|l| l.same_place(from))
        {
            *l = to.clone();
        }
    }
    f.location = Some(to);
}

/// Donation positions from the function's signature; the message and fix titles say the new
/// `donate_argnums=(…)`.
fn donate_by_signature(f: &mut Finding, sig: &[String]) {
    for i in 0..f.fixes.len() {
        let FixKind::DonateArgnums { argnums, args } = &f.fixes[i].kind else {
            continue;
        };
        let args: Vec<(Option<String>, u32)> = args
            .iter()
            .map(|(name, guess)| match name {
                Some(n) => (
                    Some(n.clone()),
                    sig.iter().position(|s| s == n).unwrap_or(0) as u32,
                ),
                None => (None, *guess),
            })
            .collect();
        let new = crate::xla::diagnose::argnum_set(&args);
        if new == *argnums {
            continue;
        }
        let old_text = format!(
            "donate_argnums=({})",
            crate::xla::diagnose::argnums_tuple(argnums)
        );
        let new_text = format!(
            "donate_argnums=({})",
            crate::xla::diagnose::argnums_tuple(&new)
        );
        f.message = f.message.replace(&old_text, &new_text);
        for fix in &mut f.fixes {
            fix.title = fix.title.replace(&old_text, &new_text);
        }
        f.fixes[i].kind = FixKind::DonateArgnums { argnums: new, args };
    }
}

/// The recorded file and 1-based line a fix of `finding` edits, if it is a local edit: the
/// culprit line, except for an allocator setting, which goes into the entry script (the
/// outermost user frame) where it runs before anything imports torch.
pub fn fix_target(
    finding: &Finding,
    kind: &FixKind,
    frames: &FrameFilter,
) -> Option<(String, u32)> {
    let loc = finding.location.as_ref()?;
    match kind {
        FixKind::Advice => None,
        FixKind::AllocConf { .. } => finding
            .stack
            .iter()
            .rev()
            .find(|l| frames.is_user(&l.file) && l.resolved.is_some())
            .or(Some(loc))
            .map(|l| (l.file.clone(), l.line)),
        _ => Some((loc.file.clone(), loc.line)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::{Code, Severity};
    use crate::report::Engine;

    fn loc(file: &str, line: u32) -> Location {
        Location::new(file, line, "f")
    }

    fn report(path: PathBuf, findings: Vec<Finding>) -> CaptureReport {
        let snap = crate::torch::model::Snapshot::default();
        let opts = crate::options::AnalysisOptions::default();
        let a = crate::torch::analyse(&snap, &opts);
        CaptureReport {
            path,
            engine: Engine::Torch(Box::new(crate::torch::summary::summarize(&snap, &a, 10))),
            sites: vec![],
            findings,
            shown_path: None,
        }
    }

    fn locator(resolver: Resolver) -> Locator {
        Locator::with_resolver(Arc::new(resolver), FrameFilter::default())
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
        let mut excluded = report(ws.path().join("s.pickle"), vec![finding.clone()]);
        let mut report = report(ws.path().join("s.pickle"), vec![finding]);
        let resolver = Arc::new(resolver);
        Locator::with_resolver(resolver.clone(), FrameFilter::default()).locate(&mut report);
        let fixes = &report.findings[0].fixes;
        let alloc = fixes[0].edit.as_ref().unwrap();
        assert_eq!(Path::new(&alloc[0].file), ws.path().join("train.py"));
        assert_eq!((alloc[0].line, alloc[0].start_col), (1, 0));
        let detach = fixes[1].edit.as_ref().unwrap();
        assert_eq!(Path::new(&detach[0].file), ws.path().join("model.py"));
        assert_eq!(detach[0].line, 4);
        assert_eq!(fixes[2].edit, None);
        // `--exclude-frames train.py` (userFrameExcludes) moves the entry script: the CLI used to
        // ignore it here and pick the target with the default rule.
        Locator::with_resolver(resolver, FrameFilter::new(vec!["/job/train.py".into()]))
            .locate(&mut excluded);
        let alloc = excluded.findings[0].fixes[0].target.as_ref().unwrap();
        assert_eq!(alloc.file, ws.path().join("model.py"));
    }

    #[test]
    fn a_jit_line_not_found_says_why() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("run.py"), "import jax\n\nstep(params)\n").unwrap();
        let evidence = |file: &str| {
            let mut f =
                Finding::new(Code::JX005, Severity::Warning, "m").at(Some(loc(file, 3)), vec![]);
            f.refine = Some(Refine::JitLine {
                function: "step".into(),
            });
            let mut r = report(ws.path().join("c.xplane.pb"), vec![f]);
            locator(Resolver::new(vec![ws.path().to_path_buf()], vec![])).locate(&mut r);
            r.findings[0].evidence.last().unwrap().text.clone()
        };
        // The file is there and has no jax.jit for `step`.
        assert_eq!(
            evidence("/job/run.py"),
            "no jax.jit line for `step` in run.py: the location is the call site of the jitted function"
        );
        // The file is not in the workspace.
        assert!(
            evidence("/job/elsewhere.py").starts_with("the program text was not found"),
            "{}",
            evidence("/job/elsewhere.py")
        );
    }

    #[test]
    fn a_name_two_files_share_is_left_unresolved_with_a_note_naming_them() {
        let ws = tempfile::tempdir().unwrap();
        for d in ["a", "b"] {
            std::fs::create_dir_all(ws.path().join(d)).unwrap();
            std::fs::write(ws.path().join(d).join("model.py"), "x = 1\n").unwrap();
        }
        let mut r = report(
            ws.path().join("s.pickle"),
            vec![
                Finding::new(Code::PT005, Severity::Information, "m")
                    .at(Some(loc("/cluster/run/model.py", 1)), vec![]),
            ],
        );
        locator(Resolver::new(vec![ws.path().to_path_buf()], vec![])).locate(&mut r);
        let f = &r.findings[0];
        assert_eq!(f.location.as_ref().unwrap().resolved, None);
        assert_eq!(
            f.evidence.last().unwrap().text,
            "/cluster/run/model.py is not placed in the workspace: only its file name matches, \
             and 2 files share it (a/model.py, b/model.py); map the recorded directory with \
             --path-map FROM=TO"
        );
    }

    #[test]
    fn a_forward_with_no_backward_gets_the_inference_mode_edit_on_its_loop() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(
            ws.path().join("bench.py"),
            "import torch\nfor x in xs:\n    out = model(x)\n",
        )
        .unwrap();
        let mut r = report(
            ws.path().join("s.pickle"),
            vec![
                Finding::new(Code::PT005, Severity::Information, "m")
                    .at(Some(loc("/job/bench.py", 3)), vec![])
                    .fix(Fix::new("inference mode", FixKind::InferenceMode)),
            ],
        );
        locator(Resolver::new(vec![ws.path().to_path_buf()], vec![])).locate(&mut r);
        let edit = r.findings[0].fixes[0].edit.as_ref().expect("an edit");
        assert_eq!((edit[0].line, edit[0].start_col), (2, 0));
        assert_eq!(edit[0].new_text, "with torch.inference_mode():\n    ");
        assert_eq!((edit[1].line, edit[1].new_text.as_str()), (3, "    "));
    }

    #[test]
    fn unresolved_files_get_no_edit() {
        let resolver = Resolver::with_files(vec![], vec![], vec![]);
        let mut report = report(
            "s.pickle".into(),
            vec![
                Finding::new(Code::PT003, Severity::Warning, "m")
                    .at(Some(loc("/nowhere/x.py", 1)), vec![])
                    .fix(Fix::new("cpu", FixKind::DetachCpuAppend)),
            ],
        );
        locator(resolver).locate(&mut report);
        assert_eq!(report.findings[0].fixes[0].edit, None);
    }
}
