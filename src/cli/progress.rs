//! Progress of one large snapshot on stderr, while `memlsp report FILE` reads and analyses it.
//!
//! On a terminal, once the run has taken [`QUIET_FOR`], one line redrawn in place (`memlsp:
//! big.pickle: reading 43% of 1.0 GiB`, then `analysing`) and cleared at the end, so a 2 GB
//! snapshot never looks frozen and a small one prints nothing. With `MEMLSP_PROGRESS=1` (logs of
//! batch jobs, where stderr is a file) a line when reading starts, one at each quarter of the
//! input seen passing, and one when the analysis starts. The decoder publishes how far it got
//! ([`crate::options::Progress`]).

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::findings::fmt_bytes;
use crate::options::{Progress, percent_read};

/// A terminal stays quiet this long: most reports are done before.
const QUIET_FOR: Duration = Duration::from_millis(500);
/// How often the terminal line is redrawn.
const REDRAW: Duration = Duration::from_millis(200);

/// Shows progress until dropped.
pub(super) struct Watch {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Terminal,
    Log,
}

impl Watch {
    /// Watch `progress` while `path` (of `total` bytes) is read, if stderr is a terminal or
    /// `MEMLSP_PROGRESS=1` asks for it; else nothing.
    pub(super) fn start(path: &Path, total: u64, progress: &Progress) -> Watch {
        let mode = if std::env::var_os("MEMLSP_PROGRESS").is_some_and(|v| v == "1") {
            Some(Mode::Log)
        } else if std::io::stderr().is_terminal() {
            Some(Mode::Terminal)
        } else {
            None
        };
        let Some(mode) = mode else {
            return Watch {
                stop: None,
                thread: None,
            };
        };
        let name = path
            .file_name()
            .unwrap_or(path.as_os_str())
            .to_string_lossy()
            .into_owned();
        let progress = progress.clone();
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("memlsp-progress".into())
            .spawn(move || watch(mode, &name, total, &progress, &stopped))
            .ok();
        Watch {
            stop: Some(stop),
            thread,
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What to say: the share of the input read, or the analysis once it is all read.
fn line(name: &str, read: u64, total: u64) -> String {
    match percent_read(read, total) {
        Some(p) => reading(name, p, total),
        None => format!("memlsp: {name}: analysing"),
    }
}

fn reading(name: &str, percent: u64, total: u64) -> String {
    format!("memlsp: {name}: reading {percent}% of {}", fmt_bytes(total))
}

fn watch(mode: Mode, name: &str, total: u64, progress: &Progress, stopped: &mpsc::Receiver<()>) {
    let started = Instant::now();
    let mut err = std::io::stderr();
    // Log: the furthest quarter written (1–3: 25–75 % read, 4: analysing).
    // Terminal: whether a line is shown, and which.
    let mut quarter = 0u64;
    let mut shown = false;
    let mut last = String::new();
    if mode == Mode::Log {
        let _ = writeln!(err, "{}", reading(name, 0, total));
    }
    loop {
        let tick = match mode {
            Mode::Log => Duration::from_millis(50),
            Mode::Terminal => REDRAW,
        };
        // Dropped (or gone): the run is over.
        if stopped.recv_timeout(tick) != Err(mpsc::RecvTimeoutError::Timeout) {
            break;
        }
        let read = progress.read().min(total);
        match mode {
            Mode::Log => {
                let q = percent_read(read, total).map_or(4, |p| p / 25);
                // The furthest quarter reached since the last look, once.
                if q > quarter {
                    quarter = q;
                    let said = match q {
                        4 => line(name, total, total),
                        q => reading(name, q * 25, total),
                    };
                    let _ = writeln!(err, "{said}");
                }
            }
            Mode::Terminal => {
                let now = line(name, read, total);
                if started.elapsed() >= QUIET_FOR && now != last {
                    let _ = write!(err, "\r\x1b[2K{now}");
                    let _ = err.flush();
                    shown = true;
                    last = now;
                }
            }
        }
    }
    // A log always says when the analysis began (the run may end between two looks).
    if mode == Mode::Log && quarter < 4 && progress.read() >= total {
        let _ = writeln!(err, "{}", line(name, total, total));
    }
    if shown {
        let _ = write!(err, "\r\x1b[2K");
        let _ = err.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_the_share_read_then_the_analysis() {
        assert_eq!(
            line("big.pickle", 0, 2 << 30),
            "memlsp: big.pickle: reading 0% of 2.00 GiB"
        );
        assert_eq!(
            line("big.pickle", 3 << 29, 2 << 30),
            "memlsp: big.pickle: reading 75% of 2.00 GiB"
        );
        assert_eq!(
            line("big.pickle", 2 << 30, 2 << 30),
            "memlsp: big.pickle: analysing"
        );
    }
}
