//! Snapshot loading benchmark: MB/s and peak RSS of memlsp against CPython's `pickle.load`.
//!
//! `cargo bench --bench load [-- FILE]`. Without FILE it generates a ≥ 200 MB snapshot with
//! PyTorch's sharing pattern (`benches/gen_snapshot.py`) under `target/bench/`. Each measurement
//! runs in its own process so peak RSS (VmHWM) belongs to that phase alone; the numbers are the
//! median of 5 rounds, each running every phase and CPython once.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("--phase") {
        let (phase, file) = (&args[1], Path::new(&args[2]));
        run_phase(phase, file);
        return;
    }
    let file = match args.first() {
        Some(f) => PathBuf::from(f),
        None => generate(),
    };
    let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    let mb = size as f64 / 1e6;
    println!("snapshot: {} ({:.1} MB)", file.display(), mb);
    let exe = std::env::current_exe().unwrap();
    // Rounds interleave every phase with CPython, so that a machine that slows down for a while
    // (a shared VM) slows both sides of the ratio; each number is the median over the rounds.
    const ROUNDS: usize = 5;
    let phases = ["decode", "vm", "load", "report"];
    let mut runs: Vec<Vec<(f64, u64)>> = vec![Vec::new(); phases.len() + 1];
    for _ in 0..ROUNDS {
        for (i, phase) in phases.iter().enumerate() {
            runs[i].push(phase_in_child(&exe, phase, &file));
        }
        runs[phases.len()].push(python_load(&file));
    }
    let mut rows: Vec<(String, f64, u64)> = phases
        .iter()
        .map(|p| format!("memlsp {p}"))
        .chain(["CPython pickle.load".to_string()])
        .zip(runs.iter_mut())
        .map(|(what, r)| {
            let (secs, rss) = median(r);
            (what, secs, rss)
        })
        .collect();
    let py_secs = rows[phases.len()].1;
    println!(
        "{:<24} {:>9} {:>10} {:>12} {:>10} {:>10}",
        "what", "seconds", "MB/s", "peak RSS MB", "RSS/file", "vs pickle"
    );
    for (what, secs, rss) in rows.drain(..) {
        println!(
            "{:<24} {:>9.3} {:>10.0} {:>12.0} {:>10.2} {:>9.1}x",
            what,
            secs,
            mb / secs,
            rss as f64 / 1e6,
            rss as f64 / size as f64,
            py_secs / secs
        );
    }
    println!(
        "(median of {ROUNDS} interleaved rounds; decode = the whole pickle as a generic object graph, \
         vm = the decoder streaming trace entries to a sink that drops them, load = the snapshot \
         model, report = load + every analysis)"
    );
}

/// The run with the median time (its own peak RSS with it).
fn median(runs: &mut [(f64, u64)]) -> (f64, u64) {
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs[runs.len() / 2]
}

fn phase_in_child(exe: &Path, phase: &str, file: &Path) -> (f64, u64) {
    let out = Command::new(exe)
        .args(["--phase", phase])
        .arg(file)
        .output()
        .expect("run bench phase");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    let secs: f64 = it.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        panic!(
            "phase {phase} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let rss: u64 = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    (secs, rss)
}

fn run_phase(phase: &str, file: &Path) {
    // As `memlsp report` and the server do: with the SIGBUS guard, snapshots are mapped.
    memlsp::sigbus::install();
    let t = Instant::now();
    match phase {
        "decode" => {
            let bytes = std::fs::File::open(file)
                .and_then(|f| unsafe { memmap2::Mmap::map(&f) })
                .expect("map");
            let tree = memlsp::pickle::decode(&bytes).expect("decode");
            std::hint::black_box(tree.node_count());
        }
        "vm" => {
            // The VM alone, streaming trace entries and frames lists to a sink that drops them.
            struct Drop;
            impl memlsp::pickle::Sink for Drop {
                fn key(&self) -> &str {
                    "device_traces"
                }
                fn entry(
                    &mut self,
                    _: &memlsp::pickle::Tree<'_>,
                    _: u32,
                    _: &[memlsp::pickle::Val],
                ) -> Result<(), String> {
                    Ok(())
                }
                fn takes_sequences(&self) -> bool {
                    true
                }
                fn new_sequence(&mut self) -> Result<u32, String> {
                    Ok(0)
                }
                fn sequence(
                    &mut self,
                    _: &memlsp::pickle::Tree<'_>,
                    _: u32,
                    _: &[memlsp::pickle::Val],
                ) -> Result<(), String> {
                    Ok(())
                }
            }
            let bytes = std::fs::File::open(file)
                .and_then(|f| unsafe { memmap2::Mmap::map(&f) })
                .expect("map");
            let limits = memlsp::pickle::Limits {
                refuse_globals: true,
                ..Default::default()
            };
            let tree =
                memlsp::pickle::decode_streaming(&bytes, &limits, Some(&mut Drop)).expect("decode");
            std::hint::black_box(tree.node_count());
        }
        "load" => {
            let s = memlsp::torch::load::load_snapshot(file, &Default::default()).expect("load");
            std::hint::black_box(s.segments.len());
        }
        "report" => {
            let r = memlsp::analyze::analyze_file(file, &Default::default());
            std::hint::black_box(r.is_ok());
        }
        _ => panic!("unknown phase"),
    }
    println!("{} {}", t.elapsed().as_secs_f64(), peak_rss());
}

fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

fn python_load(file: &Path) -> (f64, u64) {
    let script = "import pickle,sys,time,resource\nt=time.perf_counter()\nwith open(sys.argv[1],'rb') as f: pickle.load(f)\nprint(time.perf_counter()-t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024)";
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(file)
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    (
        it.next().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN),
        it.next().and_then(|s| s.parse().ok()).unwrap_or(0),
    )
}

fn generate() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).expect("mkdir target/bench");
    let file = dir.join("snapshot_1000k.pickle");
    if !file.exists() {
        eprintln!("generating {} (about 15 s)…", file.display());
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/gen_snapshot.py");
        let st = Command::new("python3")
            .arg(script)
            .arg(&file)
            .arg("1000000")
            .status()
            .expect("python3");
        assert!(st.success(), "generator failed");
    }
    file
}
