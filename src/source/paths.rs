//! Map paths recorded in a capture (another machine, a container) to files in the workspace.
//!
//! Order: explicit `pathMappings` (longest recorded prefix first), then the recorded path itself
//! when it lies in the workspace, then the longest path-suffix match against the workspace's
//! Python files, then the recorded path when it exists on this machine; else unresolved (the
//! recorded path is kept). Framework frames (torch, jax, site-packages, …) are never
//! suffix-matched: a `module.py` in the workspace is not `torch/nn/modules/module.py`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::frames::{FrameFilter, FrameKind};
use crate::source::workspace;

/// At most this many directory entries are walked per root, so a workspace opened at `/` or `~`
/// costs a bounded scan.
pub const MAX_SCAN_ENTRIES: usize = 200_000;

/// One Python file of the workspace.
#[derive(Clone, Debug)]
struct PyFile {
    abs: PathBuf,
    /// Components relative to its root, outermost first.
    rel: Vec<String>,
}

/// Resolves recorded paths against a workspace.
#[derive(Clone, Debug, Default)]
pub struct Resolver {
    /// Workspace roots.
    pub roots: Vec<PathBuf>,
    /// `(recorded prefix, local prefix)` pairs; the longest matching recorded prefix wins.
    pub mappings: Vec<(String, PathBuf)>,
    files: Vec<PyFile>,
    /// File name → indexes into `files`.
    by_name: HashMap<String, Vec<usize>>,
}

impl Resolver {
    /// Absolute paths of the workspace's Python files the resolver matches against.
    pub fn py_files(&self) -> impl Iterator<Item = &std::path::Path> + '_ {
        self.files.iter().map(|f| f.abs.as_path())
    }

    /// A resolver over `roots`; scans them for `*.py` files (respecting `.gitignore`, skipping
    /// `.venv` and `node_modules`, at most [`MAX_SCAN_ENTRIES`] entries per root).
    pub fn new(roots: Vec<PathBuf>, mappings: Vec<(String, PathBuf)>) -> Self {
        let mut files = Vec::new();
        for root in &roots {
            for entry in workspace::walk(root).take(MAX_SCAN_ENTRIES).flatten() {
                let path = entry.path();
                if !entry.file_type().is_some_and(|t| t.is_file())
                    || path.extension().is_none_or(|e| e != "py")
                {
                    continue;
                }
                if let Ok(rel) = path.strip_prefix(root) {
                    files.push((root.join(rel), rel.to_path_buf()));
                }
            }
        }
        Self::with_files(roots, mappings, files)
    }

    /// A resolver over an already known file list: `(absolute path, path relative to its root)`.
    pub fn with_files(
        roots: Vec<PathBuf>,
        mappings: Vec<(String, PathBuf)>,
        files: Vec<(PathBuf, PathBuf)>,
    ) -> Self {
        let mut r = Resolver {
            roots,
            mappings,
            files: Vec::with_capacity(files.len()),
            by_name: HashMap::new(),
        };
        for (abs, rel) in files {
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let Some(name) = rel.last().cloned() else {
                continue;
            };
            r.by_name.entry(name).or_default().push(r.files.len());
            r.files.push(PyFile { abs, rel });
        }
        r
    }

    /// Number of Python files indexed for suffix matching.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// The local file a recorded path refers to, if found.
    pub fn resolve(&self, recorded: &str) -> Option<PathBuf> {
        let norm = normalise(recorded);
        if norm.is_empty() {
            return None;
        }
        if let Some(p) = self.mapped(&norm) {
            return Some(p);
        }
        let as_given = Path::new(recorded);
        if as_given.is_absolute() {
            if self.in_workspace(as_given) && as_given.is_file() {
                return Some(as_given.to_path_buf());
            }
        } else if let Some(p) = self
            .roots
            .iter()
            .map(|r| r.join(&norm))
            .find(|p| p.is_file())
        {
            return Some(p);
        }
        if FrameFilter::default().classify(&norm) == FrameKind::User {
            if let Some(p) = self.suffix_match(&norm) {
                return Some(p);
            }
        }
        (as_given.is_absolute() && as_given.is_file()).then(|| as_given.to_path_buf())
    }

    /// `file` for presentation: workspace-relative when it resolves, else as recorded.
    pub fn display_path(&self, recorded: &str) -> String {
        match self.resolve(recorded) {
            Some(p) => self.relative(&p),
            None => recorded.to_string(),
        }
    }

    /// A local path for presentation: relative to the first root that holds it (with `/`
    /// separators), else the path as it is.
    pub fn relative(&self, local: &Path) -> String {
        self.roots
            .iter()
            .find_map(|r| local.strip_prefix(r).ok())
            .filter(|rel| !rel.as_os_str().is_empty())
            .map(|rel| {
                rel.components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_else(|| local.to_string_lossy().into_owned())
    }

    /// Whether `path` is inside one of the roots.
    pub fn in_workspace(&self, path: &Path) -> bool {
        self.roots.iter().any(|r| path.starts_with(r))
    }

    /// Explicit mappings: the longest recorded prefix that matches and yields an existing file.
    fn mapped(&self, norm: &str) -> Option<PathBuf> {
        let mut best: Option<(usize, PathBuf)> = None;
        for (from, to) in &self.mappings {
            let from = normalise(from);
            let from = from.trim_end_matches('/');
            let Some(rest) = strip_path_prefix(norm, from) else {
                continue;
            };
            let local = if rest.is_empty() {
                to.clone()
            } else {
                to.join(rest)
            };
            if local.is_file() && best.as_ref().is_none_or(|(len, _)| from.len() > *len) {
                best = Some((from.len(), local));
            }
        }
        best.map(|(_, p)| p)
    }

    /// Longest path-suffix match; ties go to the shortest local path, then the smallest. A
    /// match on the file name alone that two or more workspace files share is no match: which
    /// one ran cannot be told ([`Resolver::ambiguous`] names them).
    fn suffix_match(&self, norm: &str) -> Option<PathBuf> {
        let ranked = self.ranked(norm);
        let (best, f) = ranked.first()?;
        if *best <= 1 && ranked.get(1).is_some_and(|(m, _)| m == best) {
            return None;
        }
        Some(f.abs.clone())
    }

    /// Candidates for `norm` by file name, best first: (matching trailing components, file).
    fn ranked(&self, norm: &str) -> Vec<(usize, &PyFile)> {
        let comps: Vec<&str> = norm
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        let Some(name) = comps.last() else {
            return Vec::new();
        };
        let Some(candidates) = self.by_name.get(*name) else {
            return Vec::new();
        };
        let mut v: Vec<(usize, &PyFile)> = candidates
            .iter()
            .map(|&i| {
                let f = &self.files[i];
                let matched = f
                    .rel
                    .iter()
                    .rev()
                    .zip(comps.iter().rev())
                    .take_while(|(a, b)| a.as_str() == **b)
                    .count();
                (matched, f)
            })
            .collect();
        v.sort_by(|(ma, a), (mb, b)| {
            mb.cmp(ma)
                .then(a.abs.as_os_str().len().cmp(&b.abs.as_os_str().len()))
                .then(a.abs.cmp(&b.abs))
        });
        v
    }

    /// The workspace files a recorded path could be when [`Resolver::resolve`] leaves it
    /// unresolved because only its file name matches and several files share it (workspace-
    /// relative, smallest first); empty otherwise.
    pub fn ambiguous(&self, recorded: &str) -> Vec<String> {
        let norm = normalise(recorded);
        if norm.is_empty() || self.resolve(recorded).is_some() {
            return Vec::new();
        }
        if FrameFilter::default().classify(&norm) != FrameKind::User {
            return Vec::new();
        }
        let ranked = self.ranked(&norm);
        let Some((best, _)) = ranked.first() else {
            return Vec::new();
        };
        let mut names: Vec<String> = ranked
            .iter()
            .filter(|(m, _)| m == best)
            .map(|(_, f)| self.relative(&f.abs))
            .collect();
        names.sort();
        if names.len() < 2 { Vec::new() } else { names }
    }
}

/// `\` → `/` so Windows paths compare with POSIX ones.
fn normalise(path: &str) -> String {
    path.trim().replace('\\', "/")
}

/// `path` minus `prefix` at a component boundary (`/srv/jax` is not a prefix of `/srv/jaxdemo`).
/// Drive letters (`C:`) compare case-insensitively.
fn strip_path_prefix<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    if prefix.is_empty() {
        // The mapping was `/`: everything below the root.
        return path.starts_with('/').then(|| path.trim_start_matches('/'));
    }
    let head = path.get(..prefix.len())?;
    let windows = prefix.as_bytes().get(1) == Some(&b':');
    let same = if windows {
        head.eq_ignore_ascii_case(prefix)
    } else {
        head == prefix
    };
    if !same {
        return None;
    }
    let rest = &path[prefix.len()..];
    if rest.is_empty() {
        Some(rest)
    } else {
        rest.strip_prefix('/')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for rel in files {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x = 1\n").unwrap();
        }
        dir
    }

    #[test]
    fn jax_capture_path_resolves_by_file_name() {
        let ws = workspace(&["jax/b_mlp_nodonate.py", "jax/c_mlp_donate.py"]);
        let r = Resolver::new(vec![ws.path().to_path_buf()], vec![]);
        assert_eq!(
            r.resolve("/srv/jaxdemo/b_mlp_nodonate.py"),
            Some(ws.path().join("jax/b_mlp_nodonate.py"))
        );
        assert_eq!(
            r.display_path("/srv/jaxdemo/b_mlp_nodonate.py"),
            "jax/b_mlp_nodonate.py"
        );
    }

    #[test]
    fn more_matching_components_win_over_a_shorter_path() {
        let ws = workspace(&["other/net.py", "model/net.py", "net/x/net.py"]);
        let r = Resolver::new(vec![ws.path().to_path_buf()], vec![]);
        assert_eq!(
            r.resolve("/home/u/proj/model/net.py"),
            Some(ws.path().join("model/net.py"))
        );
    }

    #[test]
    fn ties_go_to_the_shortest_local_path() {
        let ws = workspace(&[
            "zz/deeper/job7/train.py",
            "b/job7/train.py",
            "a/job7/train.py",
        ]);
        let r = Resolver::new(vec![ws.path().to_path_buf()], vec![]);
        assert_eq!(
            r.resolve("/cluster/job7/train.py"),
            Some(ws.path().join("a/job7/train.py"))
        );
    }

    #[test]
    fn a_file_name_two_workspace_files_share_stays_unresolved_with_its_candidates() {
        let ws = workspace(&["zz/deeper/train.py", "b/train.py", "a/train.py"]);
        let r = Resolver::new(vec![ws.path().to_path_buf()], vec![]);
        assert_eq!(r.resolve("/cluster/job7/train.py"), None);
        assert_eq!(
            r.ambiguous("/cluster/job7/train.py"),
            vec!["a/train.py", "b/train.py", "zz/deeper/train.py"]
        );
        // One file of that name: the name is enough.
        let ws = workspace(&["src/train.py", "src/model.py"]);
        let r = Resolver::new(vec![ws.path().to_path_buf()], vec![]);
        assert_eq!(
            r.resolve("/cluster/job7/train.py"),
            Some(ws.path().join("src/train.py"))
        );
        assert!(r.ambiguous("/cluster/job7/train.py").is_empty());
    }

    #[test]
    fn explicit_mapping_comes_first_and_normalises_windows_paths() {
        let ws = workspace(&["src/train.py", "train.py"]);
        let root = ws.path().to_path_buf();
        let r = Resolver::new(
            vec![root.clone()],
            vec![
                (r"C:\Users\u\proj".to_string(), root.join("src")),
                ("/workspace".to_string(), root.clone()),
            ],
        );
        assert_eq!(
            r.resolve(r"c:\Users\u\proj\train.py"),
            Some(root.join("src/train.py"))
        );
        // Without the mapping the suffix match would pick the shorter `train.py`.
        assert_eq!(
            r.resolve("/workspace/train.py"),
            Some(root.join("train.py"))
        );
        // A mapping is only taken at a component boundary.
        assert_eq!(
            r.resolve("/workspacex/src/train.py"),
            Some(root.join("src/train.py"))
        );
    }

    #[test]
    fn longest_mapping_wins() {
        let ws = workspace(&["a/m.py", "b/m.py"]);
        let root = ws.path().to_path_buf();
        let r = Resolver::new(
            vec![root.clone()],
            vec![
                ("/w".to_string(), root.join("a")),
                ("/w/deep".to_string(), root.join("b")),
            ],
        );
        assert_eq!(r.resolve("/w/deep/m.py"), Some(root.join("b/m.py")));
        assert_eq!(r.resolve("/w/m.py"), Some(root.join("a/m.py")));
    }

    #[test]
    fn framework_frames_and_unknown_files_stay_unresolved() {
        let ws = workspace(&["module.py", ".venv/lib/torch/nn/modules/module.py"]);
        let r = Resolver::new(vec![ws.path().to_path_buf()], vec![]);
        let torch = "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py";
        assert_eq!(r.resolve(torch), None);
        assert_eq!(r.display_path(torch), torch);
        assert_eq!(r.resolve("/home/u/missing.py"), None);
        assert_eq!(r.resolve("??"), None);
        assert_eq!(r.resolve(""), None);
        // `.venv` is not scanned.
        assert_eq!(r.file_count(), 1);
    }

    #[test]
    fn gitignored_files_are_not_indexed() {
        let ws = workspace(&["build/lib/train.py", "train2.py"]);
        std::fs::write(ws.path().join(".gitignore"), "build/\n").unwrap();
        let r = Resolver::new(vec![ws.path().to_path_buf()], vec![]);
        assert_eq!(r.resolve("/x/build/lib/train.py"), None);
        assert_eq!(r.file_count(), 1);
    }

    #[test]
    fn relative_and_in_workspace_paths_resolve_to_themselves() {
        let ws = workspace(&["pkg/train.py", "other/pkg/train.py"]);
        let root = ws.path().to_path_buf();
        let r = Resolver::new(vec![root.clone()], vec![]);
        assert_eq!(r.resolve("pkg/train.py"), Some(root.join("pkg/train.py")));
        let abs = root.join("other/pkg/train.py");
        assert_eq!(r.resolve(&abs.to_string_lossy()), Some(abs));
        assert_eq!(r.relative(&root.join("pkg/train.py")), "pkg/train.py");
    }
}
