//! Phase timings of an analysis, for the benchmarks: where the time of `memlsp report` goes.
//!
//! Off unless [`enable`]d (`memlsp` enables it when `MEMLSP_TIMINGS` is set in the environment
//! and then prints [`render`] on stderr at exit). When off, [`time`] costs one relaxed atomic
//! load. Phases may run on several threads at once: each records its thread, its start and its
//! end (seconds since [`enable`]), so overlapping phases can be told apart.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);
static LOG: Mutex<Vec<Phase>> = Mutex::new(Vec::new());
static START: Mutex<Option<Instant>> = Mutex::new(None);
static COUNTS: Mutex<Vec<(&'static str, u64)>> = Mutex::new(Vec::new());

/// One timed phase.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub name: &'static str,
    /// Seconds since [`enable`].
    pub start: f64,
    pub end: f64,
    /// Thread name (or "main").
    pub thread: String,
    /// Resident memory of the process when the phase ended (bytes; 0 where unknown).
    pub rss_after: u64,
}

impl Phase {
    pub fn secs(&self) -> f64 {
        self.end - self.start
    }
}

/// Start recording (and reset the clock and the log).
pub fn enable() {
    if let Ok(mut s) = START.lock() {
        *s = Some(Instant::now());
    }
    if let Ok(mut l) = LOG.lock() {
        l.clear();
    }
    if let Ok(mut c) = COUNTS.lock() {
        c.clear();
    }
    ON.store(true, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

fn since_start(t: Instant) -> f64 {
    START
        .lock()
        .ok()
        .and_then(|s| *s)
        .map_or(0.0, |s| t.saturating_duration_since(s).as_secs_f64())
}

/// Run `f` as phase `name`.
pub fn time<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    let t0 = Instant::now();
    let out = f();
    let t1 = Instant::now();
    let phase = Phase {
        name,
        start: since_start(t0),
        end: since_start(t1),
        thread: std::thread::current().name().unwrap_or("main").to_string(),
        rss_after: rss(),
    };
    if let Ok(mut l) = LOG.lock() {
        l.push(phase);
    }
    out
}

/// Record a count (`trace entries`), printed by [`render`] as `count NAME N`.
pub fn count(name: &'static str, n: u64) {
    if !enabled() {
        return;
    }
    if let Ok(mut c) = COUNTS.lock() {
        c.push((name, n));
    }
}

/// The phases recorded so far (in the order they ended), and the log emptied.
pub fn take() -> Vec<Phase> {
    LOG.lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default()
}

/// Resident memory of this process now (bytes; 0 where unknown).
pub fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Peak resident memory of this process (VmHWM), bytes; 0 where unknown.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// One line per phase, `phase NAME SECONDS START END THREAD RSS_AFTER`, one per count,
/// `count NAME N`, then `total SECONDS` (since [`enable`]) and `peak_rss BYTES`: what the benchmarks parse.
pub fn render(phases: &[Phase]) -> String {
    let mut out = String::new();
    for p in phases {
        out.push_str(&format!(
            "phase {} {:.6} {:.6} {:.6} {} {}\n",
            p.name,
            p.secs(),
            p.start,
            p.end,
            p.thread,
            p.rss_after
        ));
    }
    for (name, n) in COUNTS.lock().map(|c| c.clone()).unwrap_or_default() {
        out.push_str(&format!("count {name} {n}\n"));
    }
    out.push_str(&format!("total {:.6}\n", since_start(Instant::now())));
    out.push_str(&format!("peak_rss {}\n", peak_rss()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_recorded_only_when_enabled() {
        // One test owns the global switch (tests run in parallel).
        assert_eq!(time("off", || 1), 1);
        assert!(take().iter().all(|p| p.name != "off"));
        enable();
        assert_eq!(time("on", || 2), 2);
        count("things", 3);
        let log = take();
        let p = log.iter().find(|p| p.name == "on").expect("recorded");
        assert!(p.end >= p.start);
        let text = render(&log);
        assert!(text.contains("phase on "), "{text}");
        assert!(text.contains("peak_rss "), "{text}");
        assert!(text.contains("count things 3"), "{text}");
    }
}
