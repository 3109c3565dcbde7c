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
#[cfg(unix)]
const BEHIND: usize = 256 << 10;
#[cfg(unix)]
const PAGE: usize = 4096;

/// Where the pages to give back end when the decoder is at `offset`: [`BEHIND`] short of it,
/// on a page boundary.
#[cfg(unix)]
fn behind(offset: usize) -> usize {
    offset.saturating_sub(BEHIND) / PAGE * PAGE
}

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
        let upto = behind(at);
        if upto > released {
            advise(base, released, upto - released, libc::MADV_DONTNEED);
            released = upto;
        }
        let want = at.saturating_add(AHEAD).min(len);
        let from = populated.max(at) / PAGE * PAGE;
        // Half a window at a time: the decoder is then always a few MiB short of the edge.
        if want > from && (want - from >= AHEAD / 2 || want == len) {
            if !advise(base, from, want - from, libc::MADV_POPULATE_READ) {
                // Refused (a kernel before 5.14, or the file cut short under the map): the
                // decoder faults its pages in itself from here on.
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
        let upto = behind(offset);
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Resident kB of the mapping that starts at `base` (`/proc/self/smaps`).
    fn rss_kb(base: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{base:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head)).skip(1);
        lines
            .find_map(|l| l.strip_prefix("Rss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("the mapping's Rss line")
    }

    /// Polls `rss_kb` until `ok` holds (the pager works on its own thread), for at most 10 s.
    fn settles(base: usize, ok: impl Fn(u64) -> bool) -> u64 {
        let t = std::time::Instant::now();
        loop {
            let r = rss_kb(base);
            if ok(r) || t.elapsed().as_secs() >= 10 {
                return r;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The pager maps the window ahead of the decoder in and gives back what lies behind it,
    /// and the map reads the file's bytes throughout.
    #[test]
    fn the_pager_maps_in_ahead_and_gives_back_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("capture.bin");
        let bytes: Vec<u8> = (0..(24usize << 20))
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the file is this test's own and is not changed while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let base = map.as_ptr() as usize;
        // Measured before the pager starts: its thread maps the first window in at once.
        assert_eq!(rss_kb(base), 0, "nothing read yet");
        let pager = Pager::start(&map).expect("a pager thread");
        // At the start: the window ahead is mapped in without the decoder touching it.
        pager.advance(0);
        let ahead = settles(base, |r| r >= (AHEAD >> 10) as u64);
        assert!(
            ahead >= (AHEAD >> 10) as u64,
            "the first {AHEAD} bytes mapped in: {ahead} kB"
        );
        for (i, chunk) in map.chunks(1 << 20).enumerate() {
            assert_eq!(chunk, &bytes[i << 20..(i << 20) + chunk.len()], "chunk {i}");
            pager.advance((i + 1) << 20);
        }
        // At the end: all but the last BEHIND bytes given back (those too, where the kernel
        // maps the file with 2 MiB entries: dropping part of one drops all of it).
        let kept = settles(base, |r| r <= (BEHIND >> 10) as u64);
        assert!(
            kept <= (BEHIND >> 10) as u64,
            "only the last {BEHIND} bytes stay: {kept} kB"
        );
        drop(pager);
        // Given back, the pages read the file again.
        assert_eq!(&map[..], &bytes[..]);
    }

    /// Without a pager the decoder gives back the same pages itself.
    #[test]
    fn without_a_pager_the_pages_behind_are_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("capture.bin");
        std::fs::write(&path, vec![7u8; 4 << 20]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the file is this test's own and is not changed while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let base = map.as_ptr() as usize;
        assert!(map.iter().all(|&b| b == 7));
        assert_eq!(rss_kb(base), 4 << 10);
        let mut released = 0;
        give_back(&map, map.len(), &mut released);
        assert_eq!(released, (4 << 20) - BEHIND);
        let kept = rss_kb(base);
        assert!(kept <= (BEHIND >> 10) as u64, "{kept} kB still mapped");
    }
}
