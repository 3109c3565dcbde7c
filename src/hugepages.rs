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

/// Give the heap's free memory back to the system (glibc keeps what a finished analysis freed
/// in its arenas, so the next snapshot's peak would sit on top of it). Called between the
/// snapshots of a directory, where peak RSS is bounded by `--jobs` × one snapshot's.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Large buffers (≥ 1 MiB) get their own mappings, given back when freed. glibc otherwise raises
/// its mmap threshold as big blocks are freed, and the next snapshot's buffers then come from
/// the heap, fragmenting it: a directory of snapshots analysed one after another would peak
/// above one snapshot's peak. For runs of many snapshots (a directory of ranks, the servers)
/// only: one snapshot alone is faster with glibc's own threshold (freed buffers are reused
/// instead of mapped and zeroed again; ~5 % of `report` on the 1 GB bench file).
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's parameters (under the allocator's own lock).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Is this process's address space capped (`ulimit -v`, as some clusters set)? Then reserving
/// generously up front, free elsewhere since untouched pages cost nothing, uses up the cap.
pub fn address_space_limited() -> bool {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the limit into `r`, a valid rlimit.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0;
        ok && r.rlim_cur != libc::RLIM_INFINITY
    }
    #[cfg(not(unix))]
    {
        false
    }
}
