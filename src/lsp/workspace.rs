//! Which files are captures, finding them at start, and watching them afterwards.
//!
//! The server watches the workspace itself (`notify` + `notify-debouncer-full`) because some
//! clients accept a `didChangeWatchedFiles` registration and then never send events (Neovim 0.11
//! on Linux). Client events, when they come, go down the same path; the result cache removes
//! the duplicates.

use std::path::{Path, PathBuf};
use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};
use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// Directories never scanned or watched for captures.
const SKIP_DIRS: [&str; 6] = [
    ".git",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
];

/// Decides whether a path is a capture of this workspace.
#[derive(Clone, Debug)]
pub struct CaptureMatcher {
    roots: Vec<PathBuf>,
    globs: GlobSet,
    ignores: Vec<Gitignore>,
}

impl CaptureMatcher {
    /// Returns the matcher and the globs that did not parse.
    pub fn new(roots: &[PathBuf], globs: &[String]) -> (CaptureMatcher, Vec<String>) {
        let mut b = GlobSetBuilder::new();
        let mut bad = Vec::new();
        for g in globs {
            match Glob::new(g) {
                Ok(g) => {
                    b.add(g);
                }
                Err(e) => bad.push(format!("{g}: {e}")),
            }
        }
        let globs = b.build().unwrap_or_else(|_| GlobSet::empty());
        let ignores = roots
            .iter()
            .map(|r| {
                let mut gb = GitignoreBuilder::new(r);
                gb.add(r.join(".gitignore"));
                gb.build().unwrap_or_else(|_| Gitignore::empty())
            })
            .collect();
        (
            CaptureMatcher {
                roots: roots.to_vec(),
                globs,
                ignores,
            },
            bad,
        )
    }

    /// True when `path` (which may no longer exist) is a capture the server should read.
    pub fn is_capture(&self, path: &Path) -> bool {
        for (root, gi) in self.roots.iter().zip(&self.ignores) {
            let Ok(rel) = path.strip_prefix(root) else {
                continue;
            };
            if rel.components().any(|c| {
                let s = c.as_os_str().to_string_lossy();
                SKIP_DIRS.contains(&s.as_ref())
            }) {
                return false;
            }
            if gi.matched_path_or_any_parents(path, false).is_ignore() {
                return false;
            }
            return self.globs.is_match(rel);
        }
        false
    }

    /// Every capture under the roots (respects `.gitignore`, skips `.venv`, `node_modules`, …).
    pub fn scan(&self) -> Vec<PathBuf> {
        self.scan_under(&self.roots)
    }

    /// Every capture under `dirs` (each inside a root), with the same rules as `scan`.
    pub fn scan_under(&self, dirs: &[PathBuf]) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for root in dirs {
            let walker = ignore::WalkBuilder::new(root)
                .hidden(false)
                .git_global(false)
                .require_git(false)
                .filter_entry(|e| {
                    let name = e.file_name().to_string_lossy();
                    !(e.file_type().is_some_and(|t| t.is_dir())
                        && SKIP_DIRS.contains(&name.as_ref()))
                })
                .build();
            for entry in walker.flatten() {
                if entry.file_type().is_some_and(|t| t.is_file()) && self.is_capture(entry.path()) {
                    out.push(entry.into_path());
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// A running server-side watcher; dropping it stops watching.
pub struct Watcher {
    _debouncer: notify_debouncer_full::Debouncer<
        notify::RecommendedWatcher,
        notify_debouncer_full::RecommendedCache,
    >,
}

/// Watch `roots` recursively; `on_paths` receives the paths of every debounced change (created,
/// modified, removed and renamed alike: the server stats each path to see what happened).
pub fn watch(
    roots: &[PathBuf],
    debounce: Duration,
    on_paths: impl Fn(Vec<PathBuf>) + Send + 'static,
    on_error: impl Fn(String) + Send + 'static,
) -> Result<Watcher, String> {
    let mut debouncer = notify_debouncer_full::new_debouncer(
        debounce,
        None,
        move |res: notify_debouncer_full::DebounceEventResult| match res {
            Ok(events) => {
                let mut paths: Vec<PathBuf> = events
                    .into_iter()
                    .filter(|e| !e.kind.is_access() || is_close_write(&e.kind))
                    .flat_map(|e| e.event.paths)
                    .collect();
                paths.sort();
                paths.dedup();
                if !paths.is_empty() {
                    on_paths(paths);
                }
            }
            Err(errs) => {
                for e in errs {
                    on_error(e.to_string());
                }
            }
        },
    )
    .map_err(|e| e.to_string())?;
    for r in roots {
        debouncer
            .watch(r, notify::RecursiveMode::Recursive)
            .map_err(|e| format!("{}: {e}", r.display()))?;
    }
    Ok(Watcher {
        _debouncer: debouncer,
    })
}

fn is_close_write(kind: &notify::EventKind) -> bool {
    matches!(
        kind,
        notify::EventKind::Access(notify::event::AccessKind::Close(
            notify::event::AccessMode::Write
        ))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_globs_pick_captures_and_skip_environments() {
        let roots = vec![PathBuf::from("/ws")];
        let globs: Vec<String> = crate::lsp::config::DEFAULT_GLOBS
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (m, bad) = CaptureMatcher::new(&roots, &globs);
        assert!(bad.is_empty());
        assert!(m.is_capture(Path::new("/ws/a.pickle")));
        assert!(m.is_capture(Path::new("/ws/runs/x/memory_snapshot.json")));
        assert!(m.is_capture(Path::new("/ws/jax/b.xplane.pb")));
        assert!(!m.is_capture(Path::new("/ws/train.py")));
        assert!(!m.is_capture(Path::new("/ws/config.json")));
        assert!(!m.is_capture(Path::new("/ws/.venv/lib/x.pickle")));
        assert!(!m.is_capture(Path::new("/ws/node_modules/x.pkl")));
        assert!(!m.is_capture(Path::new("/elsewhere/a.pickle")));
    }
}
