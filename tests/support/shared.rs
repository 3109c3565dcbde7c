//! Where tests find the real captures, and what they do when something they need is missing.
//!
//! Local runs may skip a test that needs `../shared`, Neovim or CPython, with a message. CI sets
//! `MEMLSP_REQUIRE_SHARED=1` (`.ci/run` does), and then a missing prerequisite fails the test:
//! CI never passes by skipping.
#![allow(dead_code)]

use std::path::PathBuf;

/// Whether this run must not skip (CI).
pub fn required() -> bool {
    std::env::var_os("MEMLSP_REQUIRE_SHARED").is_some_and(|v| v != "0" && !v.is_empty())
}

/// A prerequisite is missing: fail under `MEMLSP_REQUIRE_SHARED=1`, else print why the test is
/// skipped. Call it and return from the test.
pub fn skip(why: &str) {
    if required() {
        panic!("MEMLSP_REQUIRE_SHARED=1 and {why}: this run must not skip tests");
    }
    eprintln!("SKIP: {why}");
}

/// The shared reference folder: `$MEMLSP_SHARED`, else `../shared` beside the checkout.
pub fn shared_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("MEMLSP_SHARED") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"),
    };
    dir.join("README.md").is_file().then_some(dir)
}

/// `shared_dir()/rel` when it exists; otherwise [`skip`] and `None`.
pub fn shared(rel: &str) -> Option<PathBuf> {
    match shared_dir() {
        Some(d) if d.join(rel).exists() => Some(d.join(rel)),
        Some(d) => {
            skip(&format!("{} is missing", d.join(rel).display()));
            None
        }
        None => {
            skip("../shared is absent (set MEMLSP_SHARED to the shared folder)");
            None
        }
    }
}
