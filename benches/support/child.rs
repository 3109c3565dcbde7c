//! Waiting for a child process and reading its peak RSS, shared by the benches that run the
//! `memlsp` binary (`#[path]`-included: benches are separate crates).

/// Wait for `child`: whether it exited 0, and its peak RSS as the kernel counted it (ru_maxrss;
/// 0 where wait4 is not available).
#[cfg(target_os = "linux")]
pub fn wait_with_rss(child: &mut std::process::Child) -> (bool, u64) {
    let mut status = 0;
    // SAFETY: plain syscall on our own child's pid, with out-pointers to locals.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let ok = r == pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (ok, usage.ru_maxrss as u64 * 1024)
}

#[cfg(not(target_os = "linux"))]
pub fn wait_with_rss(child: &mut std::process::Child) -> (bool, u64) {
    (child.wait().is_ok_and(|s| s.success()), 0)
}
