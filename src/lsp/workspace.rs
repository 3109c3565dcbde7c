//! Which files are captures, finding them at start, and watching them afterwards.
//!
//! The server watches the workspace itself (`notify` + `notify-debouncer-full`) because some
//! clients accept a `didChangeWatchedFiles` registration and then never send events (Neovim 0.11
//! on Linux). Client events, when they come, go down the same path; the result cache removes
//! the duplicates.

use std::path::{Path, PathBuf};
use std::time::Duration;

use globset::GlobSet;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// Directories whose events are ignored (the same places `source::workspace::walk` never
/// enters; hidden directories are skipped as well).
const SKIP_DIRS: [&str; 6] = [
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    "site-packages",
    "dist-packages",
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
        // Compiled like `--check` compiles them, so the editor and CI see the same captures.
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for g in globs {
            match crate::source::workspace::capture_globset(std::slice::from_ref(g)) {
                Ok(_) => good.push(g.as_str()),
                Err(e) => bad.push(format!("{g}: {e}")),
            }
        }
        let globs =
            crate::source::workspace::capture_globset(&good).unwrap_or_else(|_| GlobSet::empty());
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

    /// True for a directory strictly inside a root that the scan would enter.
    pub fn is_scanned_dir(&self, path: &Path) -> bool {
        self.roots.iter().any(|root| {
            path.strip_prefix(root).is_ok_and(|rel| {
                rel.components().next().is_some()
                    && !rel.components().any(|c| {
                        let s = c.as_os_str().to_string_lossy();
                        s.starts_with('.') || SKIP_DIRS.contains(&s.as_ref())
                    })
            })
        })
    }

    /// True when `path` (which may no longer exist) is a capture the server should read.
    pub fn is_capture(&self, path: &Path) -> bool {
        for (root, gi) in self.roots.iter().zip(&self.ignores) {
            let Ok(rel) = path.strip_prefix(root) else {
                continue;
            };
            let mut dirs = rel.components().rev().skip(1);
            if dirs.any(|c| {
                let s = c.as_os_str().to_string_lossy();
                s.starts_with('.') || SKIP_DIRS.contains(&s.as_ref())
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

    /// Every capture under the roots, found exactly as `--check` finds them.
    pub fn scan(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for root in &self.roots {
            out.extend(crate::source::workspace::find_captures(root, &self.globs));
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
        assert!(!m.is_capture(Path::new("/ws/.cache/x.pkl")));
        assert!(!m.is_capture(Path::new("/elsewhere/a.pickle")));
        assert!(m.is_scanned_dir(Path::new("/ws/runs")));
        assert!(!m.is_scanned_dir(Path::new("/ws")));
        assert!(!m.is_scanned_dir(Path::new("/ws/.venv/lib")));
    }
}
