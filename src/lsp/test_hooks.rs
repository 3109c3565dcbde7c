//! Fault injection for the language server's tests, compiled only with the `test-hooks` feature
//! (which `cargo test` turns on through the crate's dev-dependency on itself; `cargo build` and
//! `cargo install` leave it off, so a shipped server neither reads these variables nor has this
//! code). `main_loop` calls each hook on the blocking worker that analyses a capture.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::options::Cancel;

/// `MEMLSP_TEST_PANIC_ON=<substring>` makes the analysis of any capture whose path contains it
/// panic, so tests can check a panic stays inside one analysis (`tests/lsp_resilience.rs`).
pub fn panic_on(path: &Path) {
    if let Some(needle) = std::env::var_os("MEMLSP_TEST_PANIC_ON") {
        let needle = needle.to_string_lossy();
        if !needle.is_empty() && path.to_string_lossy().contains(needle.as_ref()) {
            panic!("MEMLSP_TEST_PANIC_ON matched {}", path.display());
        }
    }
}

/// `MEMLSP_TEST_HOLD_ON=<substring>` makes the first analysis of a capture whose path contains
/// it wait (up to 30 s) until it is cancelled, so tests can check that a rewrite stops a running
/// analysis instead of waiting for it (`tests/lsp_editing.rs`).
pub fn hold_on(path: &Path, cancel: &Cancel) {
    static HELD: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let Some(needle) = std::env::var_os("MEMLSP_TEST_HOLD_ON") else {
        return;
    };
    let needle = needle.to_string_lossy();
    if needle.is_empty() || !path.to_string_lossy().contains(needle.as_ref()) {
        return;
    }
    if let Ok(mut held) = HELD.lock() {
        if held.iter().any(|p| p == path) {
            return;
        }
        held.push(path.to_path_buf());
    }
    let t0 = std::time::Instant::now();
    while !cancel.is_cancelled() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `MEMLSP_TEST_PROGRESS_REDRAW_MS=<ms>` sets how often a progress bar is redrawn, so a test can
/// make an analysis end between two redraws (`tests/lsp_robustness.rs`).
pub fn progress_redraw() -> Option<Duration> {
    let ms = std::env::var("MEMLSP_TEST_PROGRESS_REDRAW_MS").ok()?;
    ms.trim().parse().ok().map(Duration::from_millis)
}
