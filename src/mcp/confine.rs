//! Where the tools may read, and what one tool call may spend.
//!
//! An agent-facing server reads only under its roots (`memlsp mcp --root DIR`, repeatable; the
//! server's directory by default): every path a tool is given, and every capture a directory scan
//! finds, is resolved (`..` and symlinks, by the file system) and refused when it lands outside
//! every root, with one line naming the roots. `--allow-outside` lifts this.
//!
//! Each call has a [`Budget`]: bytes of captures read, captures analysed, seconds. A call that
//! names more than its budget before starting is refused, saying which budget and how to raise
//! it; a scan (`explain_line`, `check_baseline`) analyses what fits and says what it left out;
//! a call that runs out of time is stopped at the next progress point of the analysis.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::findings::fmt_bytes;

/// What one tool call may spend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Bytes of captures read (the sum of the sizes of the captures analysed).
    pub bytes: u64,
    /// Captures analysed.
    pub captures: usize,
    /// Wall-clock seconds.
    pub seconds: u64,
}

impl Default for Budget {
    /// 8 GiB, 64 captures, 300 s: a few of the largest real snapshots, a workspace of runs, and
    /// minutes rather than hours of two busy cores.
    fn default() -> Self {
        Budget {
            bytes: 8 << 30,
            captures: 64,
            seconds: 300,
        }
    }
}

impl Budget {
    /// This budget with the given values in place of its own.
    pub fn with(self, bytes: Option<u64>, captures: Option<usize>, seconds: Option<u64>) -> Self {
        Budget {
            bytes: bytes.unwrap_or(self.bytes),
            captures: captures.unwrap_or(self.captures),
            seconds: seconds.unwrap_or(self.seconds),
        }
    }

    pub fn json(&self) -> Value {
        json!({"bytes": self.bytes, "captures": self.captures, "seconds": self.seconds})
    }
}

/// The server's settings (from `memlsp mcp`'s command line).
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Directories the tools may read under; empty: the server's directory.
    pub roots: Vec<PathBuf>,
    /// No roots: any path the user can read.
    pub allow_outside: bool,
    pub budget: Budget,
}

/// The roots, resolved once at start.
#[derive(Clone, Debug)]
pub struct Roots {
    roots: Vec<PathBuf>,
    allow_outside: bool,
}

impl Roots {
    /// `config`'s roots (relative ones taken from `cwd`), each resolved; one that is not a
    /// directory is an error naming it.
    pub fn new(config: &Config, cwd: &Path) -> Result<Roots, String> {
        let given: Vec<PathBuf> = if config.roots.is_empty() {
            vec![cwd.to_path_buf()]
        } else {
            config.roots.clone()
        };
        let mut roots = Vec::new();
        for r in given {
            match cwd.join(&r).canonicalize() {
                Ok(c) if c.is_dir() => roots.push(c),
                Ok(_) => return Err(format!("--root {}: not a directory", r.display())),
                Err(e) => {
                    return Err(format!(
                        "--root {}: cannot be a root ({e}); name an existing directory",
                        r.display()
                    ));
                }
            }
        }
        Ok(Roots {
            roots,
            allow_outside: config.allow_outside,
        })
    }

    /// The roots, for messages.
    pub fn shown(&self) -> String {
        self.roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `path` resolved (symlinks and `..`, by the file system); `Err` with one line when it is
    /// outside every root.
    pub fn check(&self, path: &Path) -> Result<PathBuf, String> {
        let resolved = match path.canonicalize() {
            Ok(p) => p,
            // Not there (or a dangling link): its directory resolved, else its name; the
            // analysis then says what is missing, as for any path.
            Err(_) => match (path.parent().map(Path::canonicalize), path.file_name()) {
                (Some(Ok(dir)), Some(name)) => dir.join(name),
                _ => lexical(path),
            },
        };
        if self.allow_outside || self.inside(&resolved) {
            Ok(resolved)
        } else {
            Err(self.outside(path))
        }
    }

    fn inside(&self, p: &Path) -> bool {
        self.roots.iter().any(|r| p.starts_with(r))
    }

    fn outside(&self, path: &Path) -> String {
        format!(
            "{}: outside the workspace roots ({}); this server reads only under them (start it \
             with --root DIR for another root, or --allow-outside)",
            path.display(),
            self.shown()
        )
    }
}

/// `p` with `.` and `..` taken away by name (for a path that does not exist).
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// One call's spending, against its budget.
#[derive(Clone)]
pub struct Meter {
    pub budget: Budget,
    /// Raised when the time is up (the call's cancel flag is raised with it).
    expired: Arc<AtomicBool>,
}

impl Meter {
    pub fn new(budget: Budget) -> Meter {
        Meter {
            budget,
            expired: Arc::default(),
        }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.budget.seconds)
    }

    pub fn expire(&self) {
        self.expired.store(true, Ordering::Relaxed);
    }

    pub fn expired(&self) -> bool {
        self.expired.load(Ordering::Relaxed)
    }

    /// The message of a call stopped by its time budget.
    pub fn time_message(&self) -> String {
        format!(
            "stopped: the call ran past its time budget of {} s (start the server with \
             --budget-seconds N for more)",
            self.budget.seconds
        )
    }

    /// Refuse `files` when they exceed the budget (a call about one capture or one run).
    pub fn admit_all(&self, files: &[PathBuf]) -> Result<(), String> {
        let bytes: u64 = files.iter().map(|f| size(f)).sum();
        if files.len() > self.budget.captures {
            return Err(format!(
                "refused: {} captures, over the budget of {} per call (start the server with \
                 --budget-captures N for more)",
                files.len(),
                self.budget.captures
            ));
        }
        if bytes > self.budget.bytes {
            return Err(format!(
                "refused: {} of captures, over the budget of {} per call (start the server with \
                 --budget-bytes SIZE for more)",
                fmt_bytes(bytes),
                fmt_bytes(self.budget.bytes)
            ));
        }
        Ok(())
    }

    /// The files of a scan that fit the budget, in order, and a sentence on what was left out.
    pub fn admit_some(&self, files: Vec<PathBuf>) -> (Vec<PathBuf>, Option<String>) {
        let total = files.len();
        let mut bytes = 0u64;
        let mut kept = Vec::new();
        let mut over_bytes = 0usize;
        for f in files {
            let s = size(&f);
            if kept.len() >= self.budget.captures {
                break;
            }
            if bytes + s > self.budget.bytes {
                over_bytes += 1;
                continue;
            }
            bytes += s;
            kept.push(f);
        }
        let left = total - kept.len();
        if left == 0 {
            return (kept, None);
        }
        let why = if over_bytes > 0 && kept.len() < self.budget.captures {
            format!(
                "the budget of {} of captures per call (--budget-bytes)",
                fmt_bytes(self.budget.bytes)
            )
        } else {
            format!(
                "the budget of {} captures per call (--budget-captures)",
                self.budget.captures
            )
        };
        (
            kept,
            Some(format!(
                "cut short: {left} of {total} captures not analysed, over {why}"
            )),
        )
    }
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_inside_the_roots_or_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        let out = tmp.path().join("elsewhere");
        std::fs::create_dir_all(root.join("runs")).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("secret.pickle"), b"x").unwrap();
        std::fs::write(root.join("runs/a.pickle"), b"x").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(out.join("secret.pickle"), root.join("link.pickle")).unwrap();
        let roots = Roots::new(
            &Config {
                roots: vec![root.clone()],
                ..Config::default()
            },
            tmp.path(),
        )
        .unwrap();
        assert!(roots.check(&root.join("runs/../runs/a.pickle")).is_ok());
        for bad in [
            root.join("../elsewhere/secret.pickle"),
            out.join("secret.pickle"),
            root.join("link.pickle"),
            root.join("../elsewhere/missing.pickle"),
        ] {
            let e = roots.check(&bad).unwrap_err();
            assert!(e.contains("outside the workspace roots ("), "{e}");
            assert!(
                e.contains(&root.canonicalize().unwrap().display().to_string()),
                "{e}"
            );
        }
        // Missing inside: left to the analysis to say it is missing.
        assert!(roots.check(&root.join("runs/../nope.pickle")).is_ok());
        let open = Roots::new(
            &Config {
                roots: vec![root.clone()],
                allow_outside: true,
                ..Config::default()
            },
            tmp.path(),
        )
        .unwrap();
        assert!(open.check(&root.join("link.pickle")).is_ok());
    }

    #[test]
    fn a_scan_keeps_what_fits_and_says_what_it_left() {
        let tmp = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = (0..5)
            .map(|i| {
                let f = tmp.path().join(format!("{i}.pickle"));
                std::fs::write(&f, vec![0u8; 100]).unwrap();
                f
            })
            .collect();
        let m = Meter::new(Budget::default().with(Some(250), None, None));
        let (kept, note) = m.admit_some(files.clone());
        assert_eq!(kept.len(), 2);
        assert!(note.unwrap().contains("3 of 5 captures not analysed"));
        let m = Meter::new(Budget::default().with(None, Some(3), None));
        assert_eq!(m.admit_some(files.clone()).0.len(), 3);
        assert!(
            m.admit_all(&files)
                .unwrap_err()
                .contains("5 captures, over the budget of 3")
        );
    }
}
