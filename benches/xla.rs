//! Benchmark of the JAX engine on a large capture (not a test; run with `--release`).
//!
//! `cargo bench --bench xla -- [BASE.xplane.pb] [--events N] [--keep]` writes `<tmp>/bench.xplane.pb` = the base
//! capture (default: `shared/jax_cpu_captures/e_attention_big`) followed by one synthetic
//! `/host:CPU` plane of N events (default 3,500,000: executions of the base's largest module,
//! BFC allocator events, per-op events with program_id/run_id on 8 threads), then times the
//! metadata-only module listing and the full report. `--events 35000000` makes a 1 GB capture
//! (the "no slower per byte than 100 MB": compare the MB/s of CPU of the two).

#[path = "../tests/support/shared.rs"]
mod shared_data;

use std::path::PathBuf;
use std::time::Instant;

use memlsp::xla::pb::profiler::{
    XEvent, XEventMetadata, XLine, XPlane, XSpace, XStat, XStatMetadata, x_event, x_stat,
};
use prost::Message;

fn main() {
    let mut base: Option<PathBuf> = None;
    let mut events: usize = 3_500_000;
    let mut keep = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--events" => events = args.next().and_then(|v| v.parse().ok()).unwrap_or(events),
            "--keep" => keep = true,
            p => base = Some(PathBuf::from(p)),
        }
    }
    let base = base
        .or_else(|| {
            shared_data::shared_dir()
                .map(|d| d.join("jax_cpu_captures/e_attention_big/e_attention_big.xplane.pb"))
        })
        .filter(|p| p.is_file());
    let Some(base) = base else {
        eprintln!("bench_xla: pass a base .xplane.pb (or set MEMLSP_SHARED)");
        std::process::exit(2);
    };
    let modules = match memlsp::xla::list_modules(&base) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("bench_xla: {e}");
            std::process::exit(2);
        }
    };
    let Some((module, _)) = modules.iter().max_by_key(|m| m.1).cloned() else {
        eprintln!("bench_xla: the base capture has no HLO module");
        std::process::exit(2);
    };
    let (hlo_name, pid) = memlsp::xla::hlo::split_program_id(&module);
    let pid = pid.unwrap_or(1) as i64;

    let dir = std::env::temp_dir().join(format!("memlsp-bench-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("bench_xla: {e}");
        std::process::exit(2);
    }
    let out = dir.join("bench.xplane.pb");
    let t = Instant::now();
    let mut bytes = std::fs::read(&base).unwrap_or_default();
    bytes.extend(host_plane(events, hlo_name, pid).encode_to_vec());
    if let Err(e) = std::fs::write(&out, &bytes) {
        eprintln!("bench_xla: {e}");
        std::process::exit(2);
    }
    println!(
        "capture: {} ({:.1} MB, base {} + {} synthetic events), written in {:.2?}",
        out.display(),
        bytes.len() as f64 / 1e6,
        base.display(),
        events,
        t.elapsed()
    );
    let mb = bytes.len() as f64 / 1e6;
    drop(bytes);

    for round in 0..3 {
        let (t, c) = (Instant::now(), cpu_ms());
        let listed = memlsp::xla::list_modules(&out).map(|m| m.len());
        let (list_time, list_cpu) = (t.elapsed(), cpu_ms() - c);
        let (t, c) = (Instant::now(), cpu_ms());
        let report =
            memlsp::analyze::run(&out, &memlsp::options::Options::default()).and_then(|mut r| {
                r.pop().ok_or_else(|| {
                    memlsp::error::CaptureError::new(
                        &out,
                        memlsp::error::ErrorKind::Empty,
                        None,
                        "no report",
                        "",
                    )
                })
            });
        let (full_time, full_cpu) = (t.elapsed(), cpu_ms() - c);
        match (listed, report) {
            (Ok(n), Ok(r)) => println!(
                "round {round}: metadata-only listing ({n} modules, plans included): {list_time:.2?} wall / {list_cpu} ms CPU; full report: {full_time:.2?} wall / {full_cpu} ms CPU ({:.0} MB/s of CPU) — {}",
                mb / (full_cpu.max(1) as f64 / 1000.0),
                r.headline().chars().take(80).collect::<String>()
            ),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("bench_xla: {e}");
                std::process::exit(1);
            }
        }
    }
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// CPU time of this process so far (user + system, ms), from /proc: on a shared machine the
/// wall time includes waiting for a core.
fn cpu_ms() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // Fields after the command name: state is field 3; utime and stime are fields 14 and 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks * 10 // USER_HZ is 100 on Linux
}

/// A `/host:CPU` plane with `n` events shaped like a long GPU training capture.
fn host_plane(n: usize, hlo_name: &str, pid: i64) -> XSpace {
    let mut plane = XPlane {
        name: "/host:CPU".into(),
        ..Default::default()
    };
    let stat_names = [
        "allocator_name",
        "bytes_allocated",
        "bytes_available",
        "bytes_reserved",
        "peak_bytes_in_use",
        "requested_bytes",
        "allocation_bytes",
        "addr",
        "program_id",
        "run_id",
        "hlo_op",
        "module_name",
        "GPU_0_bfc",
    ];
    for (i, s) in stat_names.iter().enumerate() {
        plane.stat_metadata.insert(
            i as i64 + 1,
            XStatMetadata {
                id: i as i64 + 1,
                name: s.to_string(),
                description: String::new(),
            },
        );
    }
    let sid = |name: &str| stat_names.iter().position(|s| *s == name).unwrap_or(0) as i64 + 1;
    let mut metas = vec![
        "MemoryAllocation".to_string(),
        "MemoryDeallocation".to_string(),
        "PjRtStreamExecutorLoadedExecutable::ExecuteHelper".to_string(),
        "GpuExecutable::ExecuteThunks".to_string(),
        format!("PjitFunction({})", hlo_name.trim_start_matches("jit_")),
    ];
    metas.extend((0..200).map(|i| format!("fusion.{i}")));
    for (i, m) in metas.iter().enumerate() {
        plane.event_metadata.insert(
            i as i64 + 1,
            XEventMetadata {
                id: i as i64 + 1,
                name: m.clone(),
                ..Default::default()
            },
        );
    }
    let int = |k: &str, v: i64| XStat {
        metadata_id: sid(k),
        value: Some(x_stat::Value::Int64Value(v)),
    };
    let ev = |meta: i64, t: i64, d: i64, stats: Vec<XStat>| XEvent {
        metadata_id: meta,
        data: Some(x_event::Data::OffsetPs(t)),
        duration_ps: d,
        stats,
    };
    // One execution = 6 host events on `python` + 94 op events on 8 worker threads.
    let per_exec = 100;
    let execs = (n / per_exec).max(1);
    let mut python = XLine {
        id: 1,
        name: "python".into(),
        ..Default::default()
    };
    let mut workers: Vec<XLine> = (0..8)
        .map(|i| XLine {
            id: 10 + i,
            name: format!("tf_XLAEigen/{i}"),
            ..Default::default()
        })
        .collect();
    let capacity: i64 = 80 << 30;
    let mut in_use: i64 = 1 << 30;
    for k in 0..execs as i64 {
        let t0 = k * 10_000_000;
        python.events.push(ev(5, t0, 9_000_000, vec![]));
        python.events.push(ev(3, t0 + 1000, 8_000_000, vec![]));
        let mem = |alloc: bool, t: i64, bytes: i64, in_use: i64, addr: i64| {
            ev(
                if alloc { 1 } else { 2 },
                t,
                0,
                vec![
                    XStat {
                        metadata_id: sid("allocator_name"),
                        value: Some(x_stat::Value::RefValue(sid("GPU_0_bfc") as u64)),
                    },
                    int("bytes_allocated", in_use),
                    int("bytes_available", capacity - in_use),
                    int("bytes_reserved", 0),
                    int("peak_bytes_in_use", in_use),
                    int("requested_bytes", bytes),
                    int("allocation_bytes", bytes),
                    int("addr", addr),
                ],
            )
        };
        in_use += 64 << 20;
        python.events.push(mem(
            true,
            t0 + 2000,
            64 << 20,
            in_use,
            0x7000_0000_0000 + k * 0x1000_0000,
        ));
        python.events.push(ev(
            4,
            t0 + 3000,
            7_000_000,
            vec![XStat {
                metadata_id: sid("module_name"),
                value: Some(x_stat::Value::RefValue(0)),
            }],
        ));
        in_use -= 64 << 20;
        python.events.push(mem(
            false,
            t0 + 7_500_000,
            64 << 20,
            in_use,
            0x7000_0000_0000 + k * 0x1000_0000,
        ));
        for j in 0..(per_exec - 5) as i64 {
            let w = (j % 8) as usize;
            workers[w].events.push(ev(
                6 + (j % 200),
                t0 + 4000 + j * 50_000,
                40_000,
                vec![int("program_id", pid), int("run_id", 1_000_000 + k)],
            ));
        }
    }
    plane.lines.push(python);
    plane.lines.extend(workers);
    XSpace {
        planes: vec![plane],
        ..Default::default()
    }
}
