//! Which files a workspace holds, seen the same way by `--check`, the path resolver and the server:
//! `.gitignore` respected (even outside a git checkout), hidden entries and environment folders
//! skipped, names sorted so every run walks in the same order.

use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// The default `captureGlobs`.
pub const DEFAULT_CAPTURE_GLOBS: [&str; 4] = [
    "**/*.pickle",
    "**/*.pkl",
    "**/*snapshot*.json",
    "**/*.xplane.pb",
];

/// Folders never entered: virtual environments, installed packages, caches.
const SKIP_DIRS: [&str; 6] = [
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    "site-packages",
    "dist-packages",
];

/// A sorted, `.gitignore`-aware walk of `root` that skips [`SKIP_DIRS`].
pub fn walk(root: &Path) -> ignore::Walk {
    let mut builder = ignore::WalkBuilder::new(root);
    builder
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(|e| {
            let is_dir = e.file_type().is_some_and(|t| t.is_dir());
            // The root itself is never skipped: the user asked for it.
            !(is_dir
                && e.depth() > 0
                && e.file_name()
                    .to_str()
                    .is_some_and(|n| SKIP_DIRS.contains(&n)))
        });
    builder.build()
}

/// Compile capture globs (`**/*.pickle`, …); `*` does not cross `/`.
pub fn capture_globset<S: AsRef<str>>(globs: &[S]) -> Result<GlobSet, globset::Error> {
    let mut set = GlobSetBuilder::new();
    for g in globs {
        set.add(
            GlobBuilder::new(g.as_ref())
                .literal_separator(true)
                .build()?,
        );
    }
    set.build()
}

/// Capture files under `root` matching `globs` (matched against the path relative to `root`),
/// in walk order.
pub fn find_captures(root: &Path, globs: &GlobSet) -> Vec<PathBuf> {
    walk(root)
        .flatten()
        .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
        .filter(|e| {
            let rel = e.path().strip_prefix(root).unwrap_or(e.path());
            globs.is_match(rel)
        })
        .map(|e| e.into_path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(root: &Path, rel: &str) {
        let p = root.join(rel);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(p, b"x").unwrap();
    }

    #[test]
    fn finds_captures_like_the_server_and_skips_ignored_places() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for rel in [
            "top.pickle",
            "runs/rank0.pkl",
            "runs/memory_snapshot_3.json",
            "runs/config.json",
            "jax/plugins/profile/2026/vm.xplane.pb",
            ".venv/lib/x.pickle",
            "node_modules/y.pickle",
            "ignored/z.pickle",
            "train.py",
        ] {
            touch(root, rel);
        }
        std::fs::write(root.join(".gitignore"), "ignored/\n").unwrap();
        let globs = capture_globset(&DEFAULT_CAPTURE_GLOBS).unwrap();
        let found: Vec<String> = find_captures(root, &globs)
            .iter()
            .map(|p| {
                p.strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/")
            })
            .collect();
        assert_eq!(
            found,
            [
                "jax/plugins/profile/2026/vm.xplane.pb",
                "runs/memory_snapshot_3.json",
                "runs/rank0.pkl",
                "top.pickle",
            ]
        );
    }
}
