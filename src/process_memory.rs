//! The process's memory: glibc's heap given back between snapshots and its mmap threshold, and
//! whether the address space is capped. (Named `hugepages` until the huge-page request went.)
//!
//! No transparent huge pages. The big buffers (the trace entries, the pickle memo) once asked
//! for them with `MADV_HUGEPAGE`. On the project's VM, 6 interleaved runs per file showed it
//! slower. The fresh 2 MiB pages the kernel hands out cost more to fault in than 4 KiB pages
//! (sys time 2.6 s against 1.0 s on `1G-shared`, 0.75 s against 0.55 s on `1G`). Report time
//! was 11 % slower on `1G-shared` and 4 % on `1G`, and no faster on `250M` or
//! `3M-inconsistent` (`benches/records/2026-12-06-ninth-session.md`).

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
