//! Spawning the real `memlsp` binary, as a user would.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};

#[path = "../support/shared.rs"]
mod shared_data;
#[allow(unused_imports)]
pub use shared_data::{required, shared, shared_dir, skip};

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Run `memlsp args…` in `cwd` with stdin closed (and no progress asked for by the caller's
/// environment: stderr is what the test expects).
pub fn memlsp(args: &[&str], cwd: &Path) -> Run {
    memlsp_env(args, cwd, &[])
}

/// [`memlsp`] with `env` set.
pub fn memlsp_env(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_memlsp"))
        .args(args)
        .current_dir(cwd)
        .env_remove("MEMLSP_PROGRESS")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("spawn memlsp");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl Run {
    /// Exit 2 with exactly one `memlsp: …` line on stderr that mentions `needle`.
    pub fn assert_one_line_error(&self, needle: &str) {
        assert_eq!(self.code, 2, "exit code; stderr: {}", self.stderr);
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr, got: {:?}", self.stderr);
        assert!(lines[0].starts_with("memlsp: "), "{}", lines[0]);
        assert!(
            lines[0].contains(needle),
            "stderr {:?} lacks {needle:?}",
            lines[0]
        );
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
    }

    /// Stdout parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

/// The real snapshots of `../shared/torch_snapshots/real`, sorted; `None` (after [`skip`]) when
/// the folder is missing.
pub fn real_snapshots() -> Option<Vec<std::path::PathBuf>> {
    let dir = shared("torch_snapshots/real")?;
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Some(files)
}

/// `python3 -c SCRIPT ARGS…`'s standard output. The test fails when CPython is missing (CI
/// installs it) or the script fails (its standard error in the message).
pub fn python(script: &str, args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("python3 is not available ({e}); this test needs CPython"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A path as a `&str` for argument lists.
pub fn arg(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// What a user sees of a report, for tests that call the library directly.
pub trait ReportExt {
    /// The `report` text, as the CLI prints it.
    fn text(&self) -> String;
    /// The engine's JSON value (`torch` or `xla` key of the contract).
    fn engine(&self) -> serde_json::Value;
}

impl ReportExt for memlsp::report::CaptureReport {
    fn text(&self) -> String {
        memlsp::cli::render_text(std::slice::from_ref(self), 10)
    }
    fn engine(&self) -> serde_json::Value {
        let v = serde_json::to_value(self).expect("a report serialises");
        v.get("torch")
            .or_else(|| v.get("xla"))
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    }
}

/// Whether a snapshot's frames include code a compiler wrote (Inductor's cache folders).
pub fn has_generated_frames(path: &Path) -> bool {
    let snap = memlsp::torch::load::load_snapshot(path, &Default::default()).unwrap();
    let filter = memlsp::frames::FrameFilter::default();
    snap.frames
        .iter()
        .any(|f| filter.classify(&f.filename) == memlsp::frames::FrameKind::Generated)
}
