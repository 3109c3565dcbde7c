//! Transparent huge pages for the few large buffers a big capture fills.
//!
//! Decoding a 200 MB snapshot writes ~100 MB of fresh memory (the trace entries, the pickle
//! memo); with 4 KiB pages that is ~25,000 page faults, a tenth of the load time. Where the
//! kernel offers transparent huge pages on request (`madvise` mode, the common default), asking
//! for them turns those into a few dozen 2 MiB faults. A hint only: nothing changes if the
//! kernel declines.

/// Ask for huge pages over the spare capacity of `v` (only worth it from a few MiB).
pub fn advise_spare<T>(v: &Vec<T>) {
    let bytes = v.capacity().saturating_sub(v.len()) * std::mem::size_of::<T>();
    if bytes < (8 << 20) {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_ptr() as usize + v.len() * std::mem::size_of::<T>();
        let (lo, hi) = (start.div_ceil(HUGE) * HUGE, (start + bytes) / HUGE * HUGE);
        if hi > lo {
            // SAFETY: the range lies inside the vector's own allocation; MADV_HUGEPAGE only
            // changes how the kernel backs it, never its contents.
            unsafe {
                libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
            }
        }
    }
}
