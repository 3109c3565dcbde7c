//! Where tests find the real captures: `$MEMLSP_SHARED`, else `../shared` beside the checkout.

use std::path::PathBuf;

/// The shared reference folder, or `None` (tests then skip with a message).
pub fn shared_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("MEMLSP_SHARED") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"),
    };
    dir.join("README.md").is_file().then_some(dir)
}

/// `shared_dir()/rel`, or print why the test is skipped and return `None`.
pub fn shared(rel: &str) -> Option<PathBuf> {
    match shared_dir() {
        Some(d) => Some(d.join(rel)),
        None => {
            eprintln!(
                "SKIP: ../shared is absent (set MEMLSP_SHARED to the shared folder to run this test)"
            );
            None
        }
    }
}
