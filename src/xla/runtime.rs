//! Runtime view: BFC allocator events (`MemoryAllocation` / `MemoryDeallocation`), executions and
//! the host events around them, from `/host:CPU` and the device planes (XPLANE_FORMAT.md §5, §6).

use rustc_hash::FxHashMap;

use super::capture::Capture;
use super::hlo::split_program_id;
use super::plan::Plan;
use super::space::{Plane, RawValue};
use crate::error::CaptureError;

mod host;

use host::{OpRuns, host_plane};

/// One allocator event (after the operation).
#[derive(Clone, Debug)]
pub struct MemEvent {
    pub t_ps: i64,
    pub alloc: bool,
    /// Index into the runtime's allocator names (one `String` per name, not per event).
    allocator: u32,
    pub bytes_allocated: u64,
    pub bytes_available: u64,
    pub bytes_reserved: u64,
    pub peak_bytes_in_use: u64,
    pub requested_bytes: u64,
    pub allocation_bytes: u64,
    pub addr: u64,
    line: u32,
}

/// One execution of a compiled module.
#[derive(Clone, Debug)]
pub struct Execution {
    /// `<hlo name>(<program id>)` when the program id is known, else the HLO name.
    pub module: String,
    pub start_ps: i64,
    pub end_ps: i64,
    /// Kernels (GPU/TPU) or ops (CPU) seen for this execution; `None` when it cannot be told
    /// (no device events after it, or later device work of the same program may be its own).
    pub kernels: Option<u64>,
    /// Bytes in use in the device allocator just before the execution started (measured).
    pub bytes_in_use_at_start: Option<u64>,
    /// 1-based ordinal among the executions of the same module.
    pub nth: usize,
    /// Index of the host line (thread) that ran it.
    line: u32,
}

/// Per-allocator summary, the numbers xprof's memory_profile shows.
#[derive(Clone, Debug, Default)]
pub struct AllocatorSummary {
    pub name: String,
    pub events: usize,
    /// max(bytes_reserved + bytes_allocated) within the capture.
    pub peak_bytes_in_use: u64,
    pub peak_time_ps: i64,
    pub heap_allocated_at_peak: u64,
    /// bytes_reserved + bytes_allocated + bytes_available at the peak.
    pub capacity_bytes: u64,
    /// The allocator's own lifetime peak (max of its `peak_bytes_in_use` stat).
    pub lifetime_peak_bytes: u64,
}

/// Live buffers at an instant, grouped by the host event that allocated them.
#[derive(Clone, Debug)]
pub struct LiveGroup {
    pub label: String,
    pub bytes: u64,
    pub count: u64,
}

/// A wait in `AllocatorRetry::AllocateRaw` (the allocator ran out and waited for frees).
#[derive(Clone, Debug)]
pub struct RetryWait {
    pub t_ps: i64,
    pub duration_ps: i64,
    /// Module of the execution the wait happened in, if any.
    pub module: Option<String>,
}

/// What the event planes say about the run.
#[derive(Default)]
pub struct Runtime {
    /// The host planes, kept to walk one line again for the report (no second read).
    host_planes: Vec<Plane>,
    pub allocators: Vec<AllocatorSummary>,
    /// Index into `allocators` of the device pool memlsp reasons about (`GPU_0_bfc`, …).
    pub main_allocator: Option<usize>,
    pub executions: Vec<Execution>,
    pub retries: Vec<RetryWait>,
    mem: Vec<MemEvent>,
    /// Names of the allocators seen in `mem` (`MemEvent::allocator` indexes it).
    allocator_names: Vec<String>,
    allocator_ids: FxHashMap<String, u32>,
    last_allocator: Option<u32>,
    line_names: Vec<String>,
    /// Host event spans per line that allocate device memory, for attribution.
    spans: Vec<Span>,
    /// Physical memory of the first GPU (`memory_size` plane stat), read.
    pub device_memory: Option<u64>,
    /// Indices into `spans` of executions and device_puts, sorted by (line, start).
    alloc_spans: Vec<usize>,
}

#[derive(Clone, Debug)]
struct Span {
    line: u32,
    start: i64,
    end: i64,
    kind: SpanKind,
}

#[derive(Clone, Debug, PartialEq)]
enum SpanKind {
    Exec(usize),
    DevicePut,
    Pjit(String),
    Module(String),
    Retry,
}

fn num(v: RawValue) -> u64 {
    v.num().map(|x| x.max(0.0) as u64).unwrap_or(0)
}

/// Walk the event planes once and build the runtime view.
pub fn read(cap: &Capture, plans: &[Plan]) -> Result<Runtime, CaptureError> {
    match read_planes(cap, plans) {
        // A line whose header follows its events (no profiler writes one): read again, each
        // line header first.
        Err(e)
            if e.message == crate::xla::space::LATE_HEADER && !cap.file.walks_lines_exactly() =>
        {
            cap.file.walk_lines_exactly();
            read_planes(cap, plans)
        }
        r => r,
    }
}

fn read_planes(cap: &Capture, plans: &[Plan]) -> Result<Runtime, CaptureError> {
    let mut rt = Runtime::default();
    // Ops per (program id, run id) on CPU threads, kernels per program id on devices.
    let mut op_runs = OpRuns::default();
    let mut kernels: FxHashMap<i64, Vec<i64>> = FxHashMap::default();
    let mut kernels_by_name: FxHashMap<String, Vec<i64>> = FxHashMap::default();

    for idx in cap
        .file
        .find(|n| n == "/host:CPU" || n.starts_with("/device:"))
    {
        let plane = cap.file.load(idx)?;
        if plane.name == "/host:CPU" {
            host_plane(cap, &plane, &mut rt, &mut op_runs)?;
            rt.host_planes.push(plane);
        } else {
            if plane.name.starts_with("/device:GPU:") && rt.device_memory.is_none() {
                rt.device_memory = plane
                    .plane_stat_num("memory_size")
                    .filter(|v| *v > 0.0)
                    .map(|v| v as u64);
            }
            device_plane(cap, &plane, &mut kernels, &mut kernels_by_name)?;
        }
    }
    for v in kernels.values_mut().chain(kernels_by_name.values_mut()) {
        v.sort_unstable();
    }
    let op_runs = op_runs.merged();
    attribute_executions(&mut rt, plans, &op_runs, &kernels, &kernels_by_name);
    let mut alloc_spans: Vec<usize> = (0..rt.spans.len())
        .filter(|&i| matches!(rt.spans[i].kind, SpanKind::Exec(_) | SpanKind::DevicePut))
        .collect();
    alloc_spans.sort_by_key(|&i| (rt.spans[i].line, rt.spans[i].start));
    rt.alloc_spans = alloc_spans;
    summarize_allocators(&mut rt);
    Ok(rt)
}

fn device_plane(
    cap: &Capture,
    plane: &Plane,
    kernels: &mut FxHashMap<i64, Vec<i64>>,
    by_name: &mut FxHashMap<String, Vec<i64>>,
) -> Result<(), CaptureError> {
    let s_pid = plane.stat_id("program_id").unwrap_or(i64::MIN);
    plane.for_each_event(&cap.file.path, |line, ev| {
        let t = ev.start_ps(line);
        if line.name == "XLA Modules" {
            // TPU: one event per execution, named `<module>(<program id>)`.
            let name = plane.event_name(ev.metadata_id);
            by_name.entry(name.to_string()).or_default().push(t);
            return;
        }
        let mut pid = None;
        ev.stats(|id, v| {
            if id == s_pid {
                pid = v.int();
            }
        });
        if let Some(p) = pid {
            kernels.entry(p).or_default().push(t);
        }
    })
}

fn count_in(v: Option<&Vec<i64>>, from: i64, to: i64) -> u64 {
    let Some(v) = v else { return 0 };
    if to <= from {
        return 0;
    }
    let a = v.partition_point(|&t| t < from);
    let b = v.partition_point(|&t| t < to);
    (b - a) as u64
}

fn attribute_executions(
    rt: &mut Runtime,
    plans: &[Plan],
    runs: &[(i64, i64, u64)],
    kernels: &FxHashMap<i64, Vec<i64>>,
    kernels_by_name: &FxHashMap<String, Vec<i64>>,
) {
    let by_pid: FxHashMap<u64, &Plan> = plans.iter().map(|p| (p.program_id, p)).collect();
    let mut used = vec![false; runs.len()];
    let n = rt.executions.len();
    // (line, start, end, name) of module-naming events and jit dispatches, sorted.
    type Named = (u32, i64, i64, String);
    let mut modules: Vec<Named> = Vec::new();
    let mut pjits: Vec<Named> = Vec::new();
    for s in &rt.spans {
        match &s.kind {
            SpanKind::Module(m) => modules.push((s.line, s.start, s.end, m.clone())),
            SpanKind::Pjit(m) => pjits.push((s.line, s.start, s.end, m.clone())),
            _ => {}
        }
    }
    modules.sort_by_key(|m| (m.0, m.1));
    pjits.sort_by_key(|m| (m.0, m.1));
    for i in 0..n {
        let (line, start, end) = {
            let e = &rt.executions[i];
            (e.line, e.start_ps, e.end_ps)
        };
        let next_start = rt.executions[i + 1..]
            .iter()
            .find(|e| e.line == line)
            .map(|e| e.start_ps)
            .unwrap_or(i64::MAX);
        // Named by an event inside it (GPU), else by the jit dispatch around it.
        let k = modules.partition_point(|m| (m.0, m.1) < (line, start));
        let hlo = modules
            .get(k)
            .filter(|m| m.0 == line && m.1 <= end)
            .map(|m| m.3.clone());
        let k = pjits.partition_point(|m| (m.0, m.1) <= (line, start));
        let pjit = pjits[..k]
            .iter()
            .rev()
            .take(4)
            .find(|m| m.0 == line && m.2 >= end)
            .map(|m| m.3.clone());
        // CPU: the first op run that starts after this execution and before the next one.
        let mut pid: Option<u64> = None;
        let mut count: Option<u64> = None;
        let from = runs.partition_point(|r| r.0 < start);
        for (k, r) in runs.iter().enumerate().skip(from) {
            if r.0 >= next_start {
                break;
            }
            if !used[k] {
                used[k] = true;
                pid = Some(r.1 as u64);
                count = Some(r.2);
                break;
            }
        }
        let name = hlo.or(pjit);
        if pid.is_none() {
            if let Some(name) = &name {
                let cands: Vec<&Plan> = plans.iter().filter(|p| &p.hlo_name == name).collect();
                // Several compilations of one function: the one whose kernels ran here.
                pid = cands
                    .iter()
                    .find(|p| count_in(kernels.get(&(p.program_id as i64)), start, next_start) > 0)
                    .or_else(|| cands.iter().max_by_key(|p| p.program_id))
                    .map(|p| p.program_id);
            }
        }
        let e = &mut rt.executions[i];
        e.kernels = count;
        e.module = match (pid.and_then(|p| by_pid.get(&p)), pid, name) {
            (Some(p), _, _) => p.module.clone(),
            (None, Some(p), Some(n)) => format!("{n}({p})"),
            (None, Some(p), None) => format!("program({p})"),
            (None, None, Some(n)) => n,
            (None, None, None) => "unknown program".to_string(),
        };
    }
    // Kernels of executions not counted from CPU op runs: device events of the same program
    // between this execution and the next one of the same module. Device work is asynchronous,
    // so a window reaching past the last device event says nothing ("unknown", not zero).
    let device_last = kernels
        .values()
        .chain(kernels_by_name.values())
        .filter_map(|v| v.last().copied())
        .max();
    let retry_in = |e: &Execution| {
        rt.spans.iter().any(|s| {
            s.kind == SpanKind::Retry
                && s.line == e.line
                && s.start >= e.start_ps
                && s.start <= e.end_ps
        })
    };
    for i in 0..n {
        if rt.executions[i].kernels.is_some() {
            continue;
        }
        let e = &rt.executions[i];
        let next = rt.executions[i + 1..]
            .iter()
            .find(|x| x.module == e.module)
            .map(|x| x.start_ps)
            .unwrap_or(i64::MAX);
        let pid = split_program_id(&e.module).1;
        let count = |to: i64| {
            pid.map(|p| count_in(kernels.get(&(p as i64)), e.start_ps, to))
                .unwrap_or(0)
                + count_in(kernels_by_name.get(&e.module), e.start_ps, to)
        };
        let c = count(next);
        // No kernel is only evidence when device events continue past this execution, or when
        // the allocator was retrying inside it (an OOM stops the launch); device work of this
        // program that starts later still may belong to it (asynchronous queues).
        let later = c == 0 && count(i64::MAX) > 0;
        let known =
            c > 0 || (!later && (device_last.is_some_and(|d| d > e.start_ps) || retry_in(e)));
        rt.executions[i].kernels = known.then_some(c);
    }
    // TPU-style captures: executions known only from device module events.
    if rt.executions.is_empty() {
        for (name, times) in kernels_by_name {
            if split_program_id(name).1.is_none() {
                continue;
            }
            for &t in times {
                rt.executions.push(Execution {
                    module: name.clone(),
                    start_ps: t,
                    end_ps: t,
                    kernels: Some(1),
                    bytes_in_use_at_start: None,
                    nth: 0,
                    line: u32::MAX,
                });
            }
        }
        rt.executions.sort_by_key(|e| e.start_ps);
    }
    let mut seen: FxHashMap<String, usize> = FxHashMap::default();
    for e in &mut rt.executions {
        let c = seen.entry(e.module.clone()).or_default();
        *c += 1;
        e.nth = *c;
    }
    // Allocator retries inside an execution belong to it.
    for r in &mut rt.retries {
        r.module = rt
            .executions
            .iter()
            .find(|e| e.start_ps <= r.t_ps && r.t_ps <= e.end_ps)
            .map(|e| e.module.clone());
    }
}

fn is_device_pool(name: &str) -> bool {
    name.starts_with("GPU_") && name.ends_with("_bfc") && !name.contains("collective")
}

fn summarize_allocators(rt: &mut Runtime) {
    rt.mem.sort_by_key(|m| m.t_ps);
    // One summary per interned name (each has an event), in the order the names were seen;
    // sorted by name below.
    let mut by: Vec<AllocatorSummary> = rt
        .allocator_names
        .iter()
        .map(|n| AllocatorSummary {
            name: n.clone(),
            ..Default::default()
        })
        .collect();
    for m in &rt.mem {
        let s = &mut by[m.allocator as usize];
        s.events += 1;
        let in_use = m.bytes_reserved.saturating_add(m.bytes_allocated);
        if in_use > s.peak_bytes_in_use || s.events == 1 {
            s.peak_bytes_in_use = in_use;
            s.peak_time_ps = m.t_ps;
            s.heap_allocated_at_peak = m.bytes_allocated;
            s.capacity_bytes = in_use.saturating_add(m.bytes_available);
        }
        s.lifetime_peak_bytes = s.lifetime_peak_bytes.max(m.peak_bytes_in_use);
    }
    by.sort_by(|a, b| a.name.cmp(&b.name));
    rt.main_allocator = by.iter().position(|a| is_device_pool(&a.name)).or_else(|| {
        by.iter()
            .enumerate()
            .max_by_key(|(_, a)| a.peak_bytes_in_use)
            .map(|(i, _)| i)
    });
    rt.allocators = by;
    if let Some(main) = rt.main_id() {
        let events: Vec<&MemEvent> = rt.mem.iter().filter(|m| m.allocator == main).collect();
        for e in &mut rt.executions {
            let k = events.partition_point(|m| m.t_ps < e.start_ps);
            if k > 0 {
                // Live buffers only: `bytes_reserved` is the program's own stack on TPU.
                e.bytes_in_use_at_start = Some(events[k - 1].bytes_allocated);
            } else if let Some(first) = events.first() {
                // Nothing allocated yet in the capture: what the first event saw before itself.
                let before = if first.alloc {
                    first.bytes_allocated.saturating_sub(first.allocation_bytes)
                } else {
                    first.bytes_allocated.saturating_add(first.allocation_bytes)
                };
                e.bytes_in_use_at_start = Some(before);
            }
        }
    }
}

impl Runtime {
    /// The device pool memlsp reasons about.
    pub fn main(&self) -> Option<&AllocatorSummary> {
        self.main_allocator.and_then(|i| self.allocators.get(i))
    }

    /// The interned name of the device pool, as [`MemEvent`]s carry it.
    fn main_id(&self) -> Option<u32> {
        self.allocator_ids.get(&self.main()?.name).copied()
    }

    /// The index of an allocator name (consecutive events mostly name the same one).
    fn intern_allocator(&mut self, name: &str) -> u32 {
        if let Some(last) = self.last_allocator
            && self.allocator_names[last as usize] == name
        {
            return last;
        }
        let id = match self.allocator_ids.get(name) {
            Some(&i) => i,
            None => {
                let i = self.allocator_names.len() as u32;
                self.allocator_names.push(name.to_string());
                self.allocator_ids.insert(name.to_string(), i);
                i
            }
        };
        self.last_allocator = Some(id);
        id
    }

    /// Executions of `module`, in time order.
    pub fn executions_of<'a>(
        &'a self,
        module: &'a str,
    ) -> impl Iterator<Item = &'a Execution> + 'a {
        self.executions.iter().filter(move |e| e.module == module)
    }

    /// Name of the host line an execution ran on.
    pub fn line_name(&self, e: &Execution) -> &str {
        self.line_names
            .get(e.line as usize)
            .map(|s| s.as_str())
            .unwrap_or("")
    }

    /// Device-pool buffers live at `t_ps`, grouped by the host event that allocated them.
    pub fn live_at(&self, t_ps: i64) -> Vec<LiveGroup> {
        let Some(main) = self.main_id() else {
            return Vec::new();
        };
        let mut live: FxHashMap<u64, &MemEvent> = FxHashMap::default();
        let mut last: Option<&MemEvent> = None;
        let mut freed_unknown: u64 = 0;
        for m in self
            .mem
            .iter()
            .filter(|m| m.allocator == main && m.t_ps < t_ps)
        {
            if m.alloc {
                live.insert(m.addr, m);
            } else if live.remove(&m.addr).is_none() {
                freed_unknown += m.allocation_bytes;
            }
            last = Some(m);
        }
        let _ = freed_unknown;
        let Some(last) = last else { return Vec::new() };
        let mut groups: Vec<LiveGroup> = Vec::new();
        let mut add = |label: String, bytes: u64| match groups.iter_mut().find(|g| g.label == label)
        {
            Some(g) => {
                g.bytes = g.bytes.saturating_add(bytes);
                g.count += 1;
            }
            None => groups.push(LiveGroup {
                label,
                bytes,
                count: 1,
            }),
        };
        let mut tracked = 0u64;
        let mut live: Vec<&&MemEvent> = live.values().collect();
        live.sort_by_key(|m| m.t_ps);
        for m in live {
            tracked = tracked.saturating_add(m.allocation_bytes);
            add(self.allocated_by(m), m.allocation_bytes);
        }
        let in_use = last.bytes_allocated;
        if in_use > tracked {
            groups.push(LiveGroup {
                label: "allocated before the capture started".into(),
                bytes: in_use - tracked,
                count: 0,
            });
        }
        groups.sort_by_key(|g| std::cmp::Reverse(g.bytes));
        groups
    }

    fn allocated_by(&self, m: &MemEvent) -> String {
        // Execution and device_put spans, sorted by (line, start), do not nest deeply: look at
        // the few that start last before the allocation.
        let k = self
            .alloc_spans
            .partition_point(|&i| (self.spans[i].line, self.spans[i].start) <= (m.line, m.t_ps));
        let best = self.alloc_spans[..k]
            .iter()
            .rev()
            .take(8)
            .map(|&i| &self.spans[i])
            .filter(|s| s.line == m.line && m.t_ps <= s.end)
            .min_by_key(|s| s.end.saturating_sub(s.start));
        match best.map(|s| &s.kind) {
            Some(SpanKind::Exec(i)) => {
                let e = &self.executions[*i];
                let nth = self.executions[..=*i]
                    .iter()
                    .filter(|x| x.module == e.module)
                    .count();
                format!("outputs of {} execution {nth}", e.module)
            }
            Some(SpanKind::DevicePut) => "BufferFromHostBuffer (device_put)".to_string(),
            _ => format!(
                "other host work on thread {}",
                self.line_names
                    .get(m.line as usize)
                    .map(|s| s.as_str())
                    .unwrap_or("?")
            ),
        }
    }

    /// Host events on the line named `line_name` that overlap `[from_ps, to_ps)`, in time order:
    /// `(name, start_ps, end_ps)`. Walks the host plane again; only the report needs it.
    pub fn host_events(
        &self,
        cap: &Capture,
        line_name: &str,
        from_ps: i64,
        to_ps: i64,
    ) -> Result<Vec<(String, i64, i64)>, CaptureError> {
        let mut out = Vec::new();
        for plane in &self.host_planes {
            plane.for_each_event_on(
                &cap.file.path,
                |l| l == line_name,
                |line, ev| {
                    let t = ev.start_ps(line);
                    let end = t.saturating_add(ev.duration_ps.max(0));
                    if t >= to_ps || end < from_ps {
                        return;
                    }
                    out.push((plane.event_name(ev.metadata_id).to_string(), t, end));
                },
            )?;
        }
        out.sort_by_key(|e| (e.1, -e.2));
        Ok(out)
    }

    /// The allocation of the plan's temporary block during `e`: the device-pool allocation whose
    /// `requested_bytes` equals a Temporary allocation size of the plan (the join key between
    /// compile-time plan and runtime, XPLANE_FORMAT.md §4).
    pub fn temp_allocation(&self, e: &Execution, temp_sizes: &[u64]) -> Option<&MemEvent> {
        let main = self.main_id()?;
        let k = self.mem.partition_point(|m| m.t_ps < e.start_ps);
        self.mem[k..]
            .iter()
            .take_while(|m| m.t_ps <= e.end_ps)
            .find(|m| {
                m.alloc
                    && m.allocator == main
                    && m.requested_bytes > 0
                    && temp_sizes.contains(&m.requested_bytes)
            })
    }
}
