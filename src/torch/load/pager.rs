//! The pages of a mapped capture, handled beside the decoder: mapped in ahead of it and given
//! back behind it, on a thread of their own.
//!
//! The decoder reads the map once, front to back. Each first touch of a page is a fault (the
//! kernel maps the page-cache page, and its neighbours), and the pages already read are given
//! back (`MADV_DONTNEED`) so that peak memory stays near the model's size. On the 1 GB bench file
//! both took ~0.1 s of the decoding thread, which is the report's critical path while the
//! other core has time to spare. Here the decoder only publishes how far it got; the pager maps
//! the next window in (`MADV_POPULATE_READ`, Linux 5.14; elsewhere it does nothing ahead and the
//! decoder faults as before) and gives back what lies behind.
//!
//! Only hints: what the pager does or fails to do never changes a byte the decoder reads.

#[cfg(target_os = "linux")]
use std::sync::Arc;
#[cfg(target_os = "linux")]
use std::sync::atomic::{AtomicUsize, Ordering};

/// Pages mapped in ahead of the decoder.
#[cfg(target_os = "linux")]
const AHEAD: usize = 8 << 20;
/// Pages kept behind the decoder (strings near the current position are read again).
pub(super) const BEHIND: usize = 256 << 10;
const PAGE: usize = 4096;

/// The pager of one mapped capture: joined when dropped, so it never touches the map after
/// the decoder (and the map) are done with it.
pub(super) struct Pager {
    #[cfg(target_os = "linux")]
    shared: Arc<Shared>,
    #[cfg(target_os = "linux")]
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(target_os = "linux")]
struct Shared {
    /// How far the decoder got; `usize::MAX`: stop.
    at: AtomicUsize,
}

impl Pager {
    /// A pager for `map` (`None` where no thread could be started: the decoder then gives back
    /// the pages itself, see [`give_back`]).
    pub(super) fn start(map: &memmap2::Mmap) -> Option<Pager> {
        #[cfg(target_os = "linux")]
        {
            let shared = Arc::new(Shared {
                at: AtomicUsize::new(0),
            });
            let (base, len) = (map.as_ptr() as usize, map.len());
            let s = Arc::clone(&shared);
            let thread = std::thread::Builder::new()
                .name("memlsp-pager".into())
                .spawn(move || run(&s, base, len))
                .ok()?;
            Some(Pager {
                shared,
                thread: Some(thread),
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = map;
            None
        }
    }

    /// The decoder has read up to `offset`.
    pub(super) fn advance(&self, offset: usize) {
        #[cfg(target_os = "linux")]
        if let Some(t) = &self.thread {
            self.shared.at.fetch_max(offset, Ordering::Release);
            t.thread().unpark();
        }
        #[cfg(not(target_os = "linux"))]
        let _ = offset;
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(t) = self.thread.take() {
            self.shared.at.store(usize::MAX, Ordering::Release);
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// The pager's loop: after each wake-up, give back what lies more than [`BEHIND`] behind the
/// decoder and map in up to [`AHEAD`] past it.
#[cfg(target_os = "linux")]
fn run(s: &Shared, base: usize, len: usize) {
    let (mut released, mut populated) = (0usize, 0usize);
    loop {
        let at = s.at.load(Ordering::Acquire);
        if at == usize::MAX {
            return;
        }
        let upto = at.saturating_sub(BEHIND) / PAGE * PAGE;
        if upto > released {
            advise(base, released, upto - released, libc::MADV_DONTNEED);
            released = upto;
        }
        let want = at.saturating_add(AHEAD).min(len);
        let from = populated.max(at) / PAGE * PAGE;
        // Half a window at a time: the decoder is then always a few MiB short of the edge.
        if want > from && (want - from >= AHEAD / 2 || want == len) {
            if !advise(base, from, want - from, libc::MADV_POPULATE_READ) {
                // An older kernel: nothing more to do ahead.
                populated = len;
            } else {
                populated = want;
            }
        }
        std::thread::park();
    }
}

/// `madvise` over `len` bytes at `offset` of the map at `base`; `false` when refused.
#[cfg(target_os = "linux")]
fn advise(base: usize, offset: usize, len: usize, advice: libc::c_int) -> bool {
    // SAFETY: the range lies inside the map (offsets are clamped to its length, and the start
    // is page-aligned as the map is), which outlives the pager (`Pager` joins its thread when
    // dropped, before the decoder lets go of the map). The mapping is private and read-only:
    // DONTNEED drops clean page-cache pages, re-read on the next touch; POPULATE_READ only
    // maps pages in. Neither changes what the map reads.
    unsafe { libc::madvise((base + offset) as *mut libc::c_void, len, advice) == 0 }
}

/// Without a pager: give back the pages more than [`BEHIND`] behind `offset` (from
/// `*released` on), on the decoder's thread.
pub(super) fn give_back(map: &memmap2::Mmap, offset: usize, released: &mut usize) {
    #[cfg(unix)]
    {
        let upto = offset.saturating_sub(BEHIND) / PAGE * PAGE;
        if upto > *released {
            // SAFETY: the mapping is private and read-only; DONTNEED only drops clean pages.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    *released,
                    upto - *released,
                )
            };
            *released = upto;
        }
    }
    #[cfg(not(unix))]
    let _ = (map, offset, released);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pager maps in and gives back pages of a real file while it is read: every byte reads
    /// the same as the file's, before, during and after.
    #[test]
    fn the_map_reads_the_file_while_the_pager_works_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("capture.bin");
        let bytes: Vec<u8> = (0..(24usize << 20))
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the file is this test's own and is not changed while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let mut sum = 0u64;
        {
            let pager = Pager::start(&map);
            let mut released = 0;
            for (i, chunk) in map.chunks(1 << 20).enumerate() {
                assert_eq!(chunk, &bytes[i << 20..(i << 20) + chunk.len()], "chunk {i}");
                sum += chunk.iter().map(|&b| u64::from(b)).sum::<u64>();
                match &pager {
                    Some(p) => p.advance((i + 1) << 20),
                    None => give_back(&map, (i + 1) << 20, &mut released),
                }
            }
        }
        // Given back behind the reader, the pages read the file again.
        assert_eq!(&map[..], &bytes[..]);
        assert_eq!(sum, bytes.iter().map(|&b| u64::from(b)).sum::<u64>());
    }
}
