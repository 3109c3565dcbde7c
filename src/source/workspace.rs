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
    scan_captures(root, globs).found
}

/// What a scan found, and what it passed over without reading.
#[derive(Debug, Default)]
pub struct Scan {
    pub found: Vec<PathBuf>,
    /// Entries named like captures that are not regular files (a FIFO, a socket, a device, a
    /// dangling link, a link out of the scanned folder) and directories that could not be read:
    /// the path and why, one clause.
    pub skipped: Vec<(PathBuf, String)>,
    /// The walk stopped at its entry limit before the end of the tree.
    pub stopped: bool,
}

/// [`find_captures`], also naming what it skipped ([`Scan::skipped`]). Links are not followed
/// out of `root`; a link inside it to a capture is read at its target (once).
pub fn scan_captures(root: &Path, globs: &GlobSet) -> Scan {
    scan_captures_within(root, globs, usize::MAX)
}

/// [`scan_captures`] that stops after `max_entries` entries of the walk ([`Scan::stopped`]).
pub fn scan_captures_within(root: &Path, globs: &GlobSet, max_entries: usize) -> Scan {
    let mut scan = Scan::default();
    let real_root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let mut seen = std::collections::HashSet::new();
    for (n, entry) in walk(root).enumerate() {
        if n >= max_entries {
            scan.stopped = true;
            break;
        }
        let e = match entry {
            Ok(e) => e,
            Err(err) => {
                // A broken `.gitignore` line is not a skipped place (the walk goes on).
                if let Some(skipped) = walk_error(root, &err) {
                    scan.skipped.push(skipped);
                }
                continue;
            }
        };
        let Some(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            continue;
        }
        let rel = e.path().strip_prefix(root).unwrap_or(e.path());
        if !globs.is_match(rel) {
            continue;
        }
        let path = e.into_path();
        if ft.is_file() {
            if seen.insert(std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone())) {
                scan.found.push(path);
            }
            continue;
        }
        match link_or_special(&path, ft, &real_root) {
            Ok(target) => {
                if seen.insert(target) {
                    scan.found.push(path);
                }
            }
            Err(why) => scan.skipped.push((path, why)),
        }
    }
    scan
}

/// A link inside `real_root` to a regular file: its target; anything else: why it is skipped.
fn link_or_special(
    path: &Path,
    ft: std::fs::FileType,
    real_root: &Path,
) -> Result<PathBuf, String> {
    if ft.is_symlink() {
        let Ok(target) = std::fs::canonicalize(path) else {
            return Err("a dangling link".into());
        };
        if !target.starts_with(real_root) {
            return Err(format!(
                "a link out of the folder (to {}), not followed",
                target.display()
            ));
        }
        return match std::fs::metadata(&target) {
            Ok(m) if m.is_file() => Ok(target),
            Ok(m) => Err(format!("a link to {}", kind_of(m.file_type()))),
            Err(e) => Err(format!("a link that cannot be read ({e})")),
        };
    }
    Err(kind_of(ft).to_string())
}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "a FIFO, not a regular file"
    } else if ft.is_socket() {
        "a socket, not a regular file"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device, not a regular file"
    } else if ft.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// The path of a walk error and what happened (a directory that cannot be read, a link loop);
/// `None` for what is no skipped place (an ignore file's bad glob).
fn walk_error(root: &Path, err: &ignore::Error) -> Option<(PathBuf, String)> {
    match err {
        ignore::Error::WithPath { path, err } => Some((path.clone(), walk_error(root, err)?.1)),
        ignore::Error::WithDepth { err, .. } | ignore::Error::WithLineNumber { err, .. } => {
            walk_error(root, err)
        }
        ignore::Error::Loop { child, .. } => Some((child.clone(), "a link loop".into())),
        ignore::Error::Io(e) => Some((root.to_path_buf(), format!("cannot be read ({e})"))),
        ignore::Error::Partial(errs) => errs.iter().find_map(|e| walk_error(root, e)),
        _ => None,
    }
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
