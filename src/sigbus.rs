//! Survive a capture being truncated while it is being read (Linux).
//!
//! The engines map capture files into memory. `torch.cuda.memory._dump_snapshot(path)` rewrites
//! an existing file in place (`open(path, "wb")` truncates it first), so when a training job
//! dumps the same path again while the server analyses the previous version, the next read of
//! the mapping past the new end of file raises SIGBUS, and the default action kills the server.
//!
//! This handler maps a page of zeros over the faulting page of a *file mapping that lost its
//! backing* (`BUS_ADRERR`) and returns: the read sees zeros, the decoder reports the bytes as
//! invalid, the server notices that the file changed during the analysis and reads the new
//! content when the write settles. Any other SIGBUS (misalignment, hardware errors) restores the
//! default action, so it still terminates the process as before.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

static PAGE: AtomicUsize = AtomicUsize::new(4096);
static RESCUED: AtomicU64 = AtomicU64::new(0);
static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether [`install`] has run in this process (readers may then map files safely).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// How many truncated-mapping faults have been absorbed so far.
pub fn rescued() -> u64 {
    RESCUED.load(Ordering::Relaxed)
}

/// Without the guard, files (or planes) up to this size are read into memory; larger ones, and
/// every one when the guard is installed, are memory-mapped.
pub const READ_INTO_MEMORY_UP_TO: u64 = 256 << 20;

/// Map `len` bytes of a capture rather than read them ([`READ_INTO_MEMORY_UP_TO`]).
pub fn should_map(len: u64) -> bool {
    len > READ_INTO_MEMORY_UP_TO || installed()
}

/// A mapped file's length and modification time when it was opened, and the faults absorbed by
/// then: tells whether a fault absorbed during the read can be this file's (the count is
/// process-wide; the server reads several captures at once).
#[derive(Clone, Debug)]
pub struct Watch {
    faults: u64,
    len: Option<u64>,
    modified: Option<std::time::SystemTime>,
}

impl Watch {
    pub fn new(file: &std::fs::File) -> Watch {
        let meta = file.metadata().ok();
        Watch {
            faults: rescued(),
            len: meta.as_ref().map(|m| m.len()),
            modified: meta.and_then(|m| m.modified().ok()),
        }
    }

    /// Did the file at `path` lose pages under its mapping since [`Watch::new`]? A fault was
    /// absorbed and the file changed (length, modification time, or gone).
    pub fn lost(&self, path: &std::path::Path) -> bool {
        if rescued() == self.faults {
            return false;
        }
        match std::fs::metadata(path) {
            Ok(m) => Some(m.len()) != self.len || m.modified().ok() != self.modified,
            Err(_) => true,
        }
    }
}

/// Install the handler (once, before any analysis runs).
#[cfg(target_os = "linux")]
pub fn install() {
    // SAFETY: plain libc calls with valid, zero-initialised structures; the handler only uses
    // async-signal-safe operations (atomics, mmap, sigaction).
    unsafe {
        let page = libc::sysconf(libc::_SC_PAGESIZE);
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) == 0 {
            INSTALLED.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub fn install() {}

#[cfg(target_os = "linux")]
extern "C" fn handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: `info` is provided by the kernel for SA_SIGINFO handlers.
    unsafe {
        let rescued = !info.is_null() && (*info).si_code == libc::BUS_ADRERR && {
            let page = PAGE.load(Ordering::Relaxed);
            let base = ((*info).si_addr() as usize) & !(page - 1);
            let p = libc::mmap(
                base as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            p != libc::MAP_FAILED
        };
        if rescued {
            RESCUED.fetch_add(1, Ordering::Relaxed);
        } else {
            // Not ours: fall back to the default action; the fault repeats and terminates.
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reading_a_mapping_of_a_truncated_file_sees_zeros_instead_of_dying() {
        install();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cap.pickle");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        drop(f);
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the test owns the file; truncating it under the map is the point.
        let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
        assert_eq!(map[4096 * 10], 7);
        std::fs::File::create(&path).unwrap(); // truncate to 0, as `open(path, "wb")` does
        let before = rescued();
        let tail = map[map.len() - 1];
        assert_eq!(tail, 0);
        assert!(rescued() > before);
    }
}
