//! The `/host:CPU` plane: allocator events, executions, device puts, jit calls, module spans and
//! the ops that tie an execution to its program, in one walk.

use rustc_hash::FxHashMap;

use super::{Execution, MemEvent, RetryWait, Runtime, Span, SpanKind, num};
use crate::error::CaptureError;
use crate::xla::capture::Capture;
use crate::xla::space::{LineInfo, Plane, RawEvent, RawValue};

/// Host events that mark one execution of a compiled program (outermost one counts).
const EXEC_EVENTS: [&str; 4] = [
    "PjRtStreamExecutorLoadedExecutable::ExecuteHelper",
    "CommonPjRtLoadedExecutable::ExecuteHelperOnSingleDevice",
    "TfrtTpuLoadedExecutable::Execute",
    "PjRtStreamExecutorRawLoadedExecutable::Execute",
];

/// Host events that copy a host array to the device (`jax.device_put`, `jnp.asarray`).
fn is_device_put(name: &str) -> bool {
    name.contains("BufferFromHostBuffer")
        || name == "DevicePut"
        || name.contains("LinearizeHostBufferInto")
}

/// What a host event is, decided once per event metadata.
#[derive(Clone, Copy, PartialEq, Eq)]
enum EvKind {
    Mem,
    Retry,
    Thunks,
    Exec,
    DevicePut,
    Pjit,
    GpuModule,
    /// Python-tracer and bookkeeping events: never an op.
    Skip,
    /// Anything else: an XLA op when it carries program_id and run_id.
    Op,
}

impl EvKind {
    fn of(name: &str) -> EvKind {
        match name {
            "MemoryAllocation" | "MemoryDeallocation" => EvKind::Mem,
            "AllocatorRetry::AllocateRaw" => EvKind::Retry,
            "GpuExecutable::ExecuteThunks" => EvKind::Thunks,
            n if EXEC_EVENTS.contains(&n) => EvKind::Exec,
            n if is_device_put(n) => EvKind::DevicePut,
            n if n.starts_with("PjitFunction(") => EvKind::Pjit,
            n if n.ends_with(":XLA GPU module") => EvKind::GpuModule,
            n if n.starts_with("end: ") || n.starts_with('$') => EvKind::Skip,
            _ => EvKind::Op,
        }
    }
}

/// Runs of consecutive ops of one execution, `((program id, run id), first start, ops)`, as the
/// walk finds them: one execution's ops are spread over several threads (lines), so a key comes
/// back once per line. Kept in a list and merged once at the end instead of hashed per run: a
/// 1 GB capture has hundreds of thousands of executions, and a map of them falls out of the
/// caches (it was a tenth of the report's time there).
#[derive(Default)]
pub(super) struct OpRuns(Vec<((i64, i64), i64, u64)>);

impl OpRuns {
    /// One `(first start, program id, ops)` per (program id, run id), sorted.
    pub(super) fn merged(mut self) -> Vec<(i64, i64, u64)> {
        // Stable sort: it finds the stretches already in order (a line's runs of one program
        // come in run-id order) and merges them.
        self.0.sort_by_key(|r| r.0);
        let mut out: Vec<(i64, i64, u64)> = Vec::new();
        let mut last: Option<(i64, i64)> = None;
        for (key, first, n) in self.0 {
            match out.last_mut() {
                Some(o) if last == Some(key) => {
                    o.0 = o.0.min(first);
                    o.2 += n;
                }
                _ => {
                    out.push((first, key.0, n));
                    last = Some(key);
                }
            }
        }
        out.sort_unstable();
        out
    }
}

/// The stat ids the host plane's events carry (`i64::MIN` for a stat the plane never names).
struct HostStats {
    alloc_name: i64,
    index: i64,
    ordinal: i64,
    bytes_allocated: i64,
    bytes_available: i64,
    bytes_reserved: i64,
    peak: i64,
    requested: i64,
    allocation_bytes: i64,
    addr: i64,
    program_id: i64,
    run_id: i64,
    module_name: i64,
}

impl HostStats {
    fn of(plane: &Plane) -> Self {
        let sid = |n: &str| plane.stat_id(n).unwrap_or(i64::MIN);
        HostStats {
            alloc_name: sid("allocator_name"),
            index: sid("index_on_host"),
            ordinal: sid("device_ordinal"),
            bytes_allocated: sid("bytes_allocated"),
            bytes_available: sid("bytes_available"),
            bytes_reserved: sid("bytes_reserved"),
            peak: sid("peak_bytes_in_use"),
            requested: sid("requested_bytes"),
            allocation_bytes: sid("allocation_bytes"),
            addr: sid("addr"),
            program_id: sid("program_id"),
            run_id: sid("run_id"),
            module_name: sid("module_name"),
        }
    }
}

/// Each event metadata classified once; the walk then does one lookup per event.
/// Metadata ids are small and dense in practice: index a table, hash only the rest.
struct EvKinds {
    dense: Vec<EvKind>,
    sparse: FxHashMap<i64, EvKind>,
}

impl EvKinds {
    fn of(plane: &Plane) -> Self {
        let mut dense: Vec<EvKind> = Vec::new();
        let mut sparse: FxHashMap<i64, EvKind> = FxHashMap::default();
        for (k, m) in &plane.event_meta {
            let kind = EvKind::of(&m.name);
            match usize::try_from(*k).ok().filter(|&i| i < 1 << 20) {
                Some(i) => {
                    if dense.len() <= i {
                        dense.resize(i + 1, EvKind::Op);
                    }
                    dense[i] = kind;
                }
                None => {
                    sparse.insert(*k, kind);
                }
            }
        }
        EvKinds { dense, sparse }
    }

    #[inline]
    fn kind(&self, id: i64) -> EvKind {
        match usize::try_from(id).ok().and_then(|i| self.dense.get(i)) {
            Some(k) => *k,
            None => self.sparse.get(&id).copied().unwrap_or(EvKind::Op),
        }
    }
}

pub(super) fn host_plane(
    cap: &Capture,
    plane: &Plane,
    rt: &mut Runtime,
    op_runs: &mut OpRuns,
) -> Result<(), CaptureError> {
    let s = HostStats::of(plane);
    let kinds = EvKinds::of(plane);
    let mut line_of: FxHashMap<String, u32> = FxHashMap::default();
    let mut exec_raw: Vec<(u32, i64, i64)> = Vec::new();
    // Consecutive ops of one execution share (program id, run id): count them before hashing.
    let mut run_acc: Option<((i64, i64), i64, u64)> = None;
    let mut current: (usize, u32) = (0, 0);
    plane.for_each_event(&cap.file.path, |line: &LineInfo, ev: &RawEvent| {
        let kind = kinds.kind(ev.metadata_id);
        if kind == EvKind::Skip {
            return;
        }
        let name = plane.event_name(ev.metadata_id);
        let li = if current.0 == line.name.as_ptr() as usize && current.0 != 0 {
            current.1
        } else {
            let i = match line_of.get(line.name) {
                Some(&i) => i,
                None => {
                    let i = rt.line_names.len() as u32;
                    rt.line_names.push(line.name.to_string());
                    line_of.insert(line.name.to_string(), i);
                    i
                }
            };
            current = (line.name.as_ptr() as usize, i);
            i
        };
        let t = ev.start_ps(line);
        let end = t.saturating_add(ev.duration_ps.max(0));
        let span = |kind| Span {
            line: li,
            start: t,
            end,
            kind,
        };
        match kind {
            EvKind::Mem => {
                let m = mem_event(plane, &s, ev, name == "MemoryAllocation", t, li, rt);
                rt.mem.push(m);
            }
            EvKind::Retry => {
                rt.retries.push(RetryWait {
                    t_ps: t,
                    duration_ps: ev.duration_ps,
                    module: None,
                });
                rt.spans.push(span(SpanKind::Retry));
            }
            EvKind::Thunks => {
                let mut module = String::new();
                ev.stats(|id, v| {
                    if id == s.module_name {
                        module = plane.str_of(&v).unwrap_or("").to_string();
                    }
                });
                if !module.is_empty() {
                    rt.spans.push(span(SpanKind::Module(module)));
                }
            }
            EvKind::Exec => exec_raw.push((li, t, end)),
            EvKind::DevicePut => rt.spans.push(span(SpanKind::DevicePut)),
            EvKind::Pjit => {
                let f = name
                    .trim_start_matches("PjitFunction(")
                    .trim_end_matches(')');
                rt.spans.push(span(SpanKind::Pjit(format!("jit_{f}"))));
            }
            EvKind::GpuModule => {
                let m = name.trim_end_matches(":XLA GPU module").to_string();
                rt.spans.push(span(SpanKind::Module(m)));
            }
            EvKind::Skip => {}
            EvKind::Op => count_op(&s, ev, t, &mut run_acc, op_runs),
        }
    })?;
    if let Some(run) = run_acc {
        op_runs.0.push(run);
    }
    push_executions(rt, exec_raw);
    Ok(())
}

/// A BFC allocator event (`MemoryAllocation` / `MemoryDeallocation`) with its stats.
fn mem_event(
    plane: &Plane,
    s: &HostStats,
    ev: &RawEvent,
    alloc: bool,
    t: i64,
    li: u32,
    rt: &mut Runtime,
) -> MemEvent {
    let mut m = MemEvent {
        t_ps: t,
        alloc,
        allocator: 0,
        bytes_allocated: 0,
        bytes_available: 0,
        bytes_reserved: 0,
        peak_bytes_in_use: 0,
        requested_bytes: 0,
        allocation_bytes: 0,
        addr: 0,
        line: li,
    };
    let mut index = None;
    let mut allocator = "";
    ev.stats(|id, v| {
        if id == s.alloc_name {
            allocator = plane.str_of(&v).unwrap_or("");
        } else if id == s.index || id == s.ordinal {
            index = v.int();
        } else if id == s.bytes_allocated {
            m.bytes_allocated = num(v);
        } else if id == s.bytes_available {
            m.bytes_available = num(v);
        } else if id == s.bytes_reserved {
            m.bytes_reserved = num(v);
        } else if id == s.peak {
            m.peak_bytes_in_use = num(v);
        } else if id == s.requested {
            m.requested_bytes = num(v);
        } else if id == s.allocation_bytes {
            m.allocation_bytes = num(v);
        } else if id == s.addr {
            m.addr = match v {
                RawValue::I64(x) => x as u64,
                RawValue::U64(x) => x,
                _ => 0,
            };
        }
    });
    m.allocator = if allocator.is_empty() {
        rt.intern_allocator(&index.map(|i| i.to_string()).unwrap_or_default())
    } else {
        rt.intern_allocator(allocator)
    };
    m
}

/// An op of an execution: counted into the run of consecutive ops with its (program id, run id).
#[inline]
fn count_op(
    s: &HostStats,
    ev: &RawEvent,
    t: i64,
    run_acc: &mut Option<((i64, i64), i64, u64)>,
    op_runs: &mut OpRuns,
) {
    if ev.duration_ps == 0 {
        return;
    }
    let (mut pid, mut run) = (None, None);
    ev.stats(|id, v| {
        if id == s.program_id {
            pid = v.int();
        } else if id == s.run_id {
            run = v.int();
        }
    });
    if let (Some(p), Some(r)) = (pid, run) {
        match run_acc {
            Some((key, first, n)) if *key == (p, r) => {
                *first = (*first).min(t);
                *n += 1;
            }
            acc => {
                if let Some(run) = acc.take() {
                    op_runs.0.push(run);
                }
                *acc = Some(((p, r), t, 1));
            }
        }
    }
}

/// The executions (`(line, start, end)` of each execution event): outermost execution events
/// only (some nest the same name), in start order.
fn push_executions(rt: &mut Runtime, mut exec_raw: Vec<(u32, i64, i64)>) {
    exec_raw.sort_by_key(|&(l, s, e)| (l, s, -e));
    let mut last_end: FxHashMap<u32, i64> = FxHashMap::default();
    exec_raw.retain(|&(l, s, e)| {
        if last_end.get(&l).is_some_and(|&le| s < le) {
            return false;
        }
        last_end.insert(l, e);
        true
    });
    exec_raw.sort_by_key(|&(l, s, _)| (s, l));
    for (l, s, e) in exec_raw {
        rt.spans.push(Span {
            line: l,
            start: s,
            end: e,
            kind: SpanKind::Exec(rt.executions.len()),
        });
        rt.executions.push(Execution {
            module: String::new(),
            start_ps: s,
            end_ps: e,
            kernels: None,
            bytes_in_use_at_start: None,
            nth: 0,
            line: l,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::OpRuns;

    #[test]
    fn op_runs_merge_one_execution_across_threads() {
        // Program 7 runs 1 and 2 on two threads, program 3 run 1 in between; thread 2 saw run 1
        // of program 7 start earlier than thread 1 did.
        let runs = OpRuns(vec![
            ((7, 1), 100, 4),
            ((3, 1), 150, 2),
            ((7, 2), 200, 5),
            ((7, 1), 90, 3),
            ((7, 2), 210, 1),
        ]);
        assert_eq!(
            runs.merged(),
            vec![(90, 7, 7), (150, 3, 2), (200, 7, 6)],
            "one row per (program, run): earliest start, ops summed, sorted by start"
        );
    }
}
