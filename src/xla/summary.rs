//! What the JAX engine hands on: one typed summary of a capture (the JSON contract's `xla`
//! value, with serde). Fields marked `serde(skip)` are for the text and HTML presenters only.

use serde::Serialize;

use super::plan::{PeakBuffer, Plan};
use super::runtime::{Execution, LiveGroup, Runtime};

/// The engine's result for one capture (`captures[].xla`).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// The analysed module as xprof writes it (`jit_train_step(36)`); `None` without a plan.
    pub module: Option<String>,
    pub plan: Option<PlanSummary>,
    pub runtime: RuntimeSummary,
    pub modules: Modules,
    /// Plane stats of `/host:metadata` worth showing (`jax_version`, …).
    #[serde(skip)]
    pub versions: Vec<(String, String)>,
    /// Why this module was chosen.
    #[serde(skip)]
    pub why: String,
    /// Host events between the last two executions of the module, by name, with counts.
    #[serde(skip)]
    pub between_last_two: Vec<(String, u64)>,
    /// Live buffers at the last execution start, by the host event that allocated them.
    #[serde(skip)]
    pub live_at_last: Vec<LiveGroup>,
    /// Every allocator seen (name, peak in use, capacity, events).
    #[serde(skip)]
    pub allocators: Vec<AllocatorRow>,
    /// The heap over the program order, per pixel column `(first event, last event, min, max)`,
    /// for pictures (computed on request).
    #[serde(skip)]
    pub heap_columns: Vec<(u64, u64, u64, u64)>,
    /// Position of the heap peak in the program order.
    #[serde(skip)]
    pub peak_position: u64,
    /// Where the module was called from (innermost first): the `jax.jit` line is found from
    /// its first frame (baseline findings about the whole plan go there).
    #[serde(skip)]
    pub call_site: Vec<crate::findings::Location>,
}

/// `curve` as at most `columns` pixel columns of `(first, last, min, max)`.
pub fn downsample(curve: &[u64], columns: usize) -> Vec<(u64, u64, u64, u64)> {
    let n = curve.len();
    let cols = n.clamp(1, columns.max(1));
    if n == 0 {
        return Vec::new();
    }
    (0..cols)
        .map(|c| {
            let (lo, hi) = (
                c * n / cols,
                ((c + 1) * n / cols).max(c * n / cols + 1).min(n),
            );
            let part = &curve[lo..hi];
            (
                lo as u64,
                (hi - 1) as u64,
                part.iter().copied().min().unwrap_or(0),
                part.iter().copied().max().unwrap_or(0),
            )
        })
        .collect()
}

/// The module list (a count when no module has a plan).
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Modules {
    List(Vec<ModuleRow>),
    Count(usize),
}

impl Modules {
    pub fn len(&self) -> usize {
        match self {
            Modules::List(l) => l.len(),
            Modules::Count(n) => *n,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ModuleRow {
    pub module: String,
    pub total_peak_bytes: u64,
    pub heap_peak_bytes: u64,
    pub executions: usize,
}

/// The compiled plan of the chosen module (xprof's memory viewer numbers, read).
#[derive(Clone, Debug, Serialize)]
pub struct PlanSummary {
    pub parameter_bytes: u64,
    pub donated_bytes: u64,
    pub output_bytes: u64,
    pub non_aliased_output_bytes: u64,
    pub temp_bytes: u64,
    pub heap_peak_bytes: u64,
    pub total_peak_bytes: u64,
    pub indefinite_bytes: u64,
    pub total_allocation_bytes: u64,
    pub peak_instruction: String,
    pub roles: Roles,
    /// Every row at the peak, largest first (the JSON's `buffers_at_peak`: the first 25).
    #[serde(rename = "buffers_at_peak", serialize_with = "first_25")]
    pub rows: Vec<BufferRow>,
    /// Indefinite bytes xprof adds to the peak.
    #[serde(skip)]
    pub indefinite_in_peak: u64,
}

fn first_25<S: serde::Serializer>(rows: &[BufferRow], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(rows.iter().take(25))
}

/// Heap bytes at the peak by role (inferred from the name stack).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Roles {
    pub forward: u64,
    pub backward: u64,
    pub workspace: u64,
    pub other: u64,
}

/// One row of "buffers at peak": the value xprof shows in that memory.
#[derive(Clone, Debug, Serialize)]
pub struct BufferRow {
    pub bytes: u64,
    pub shape: String,
    pub instruction: String,
    pub op_name: String,
    pub category: &'static str,
    /// `forward`, `backward`, `workspace` or `other`.
    pub role: &'static str,
    /// xprof's source line.
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Heap-simulator (temporary) buffer, as opposed to parameters, outputs and constants.
    #[serde(skip)]
    pub heap: bool,
    /// The role in words (`forward, kept for the backward pass`).
    #[serde(skip)]
    pub role_text: &'static str,
    /// For a buffer without a line: the `while` loop that carries it and that loop's line.
    #[serde(skip)]
    pub via: Option<(String, String, u32)>,
}

/// The runtime view (allocator events, executions).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RuntimeSummary {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_bytes_in_use: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifetime_peak_bytes: Option<u64>,
    pub executions: Vec<ExecutionRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_retries: Option<Vec<RetryRow>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ExecutionRow {
    pub module: String,
    pub start_ps: i64,
    pub kernels: Option<u64>,
    pub bytes_in_use_at_start: Option<u64>,
    /// The temporary block allocated in this execution (chosen module only).
    pub temp_bytes_allocated: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RetryRow {
    pub start_ps: i64,
    pub duration_ps: i64,
    pub module: Option<String>,
}

#[derive(Clone, Debug)]
pub struct AllocatorRow {
    pub name: String,
    pub peak_bytes_in_use: u64,
    pub capacity_bytes: u64,
    pub events: usize,
}

fn row(b: &PeakBuffer) -> BufferRow {
    BufferRow {
        bytes: b.size,
        shape: b.shape.clone(),
        instruction: b.instruction.clone(),
        op_name: b.op_name.clone(),
        category: b.category.as_str(),
        role: b.role.key(),
        file: b.source.as_ref().map(|s| s.file.clone()),
        line: b.source.as_ref().map(|s| s.line.max(0) as u32),
        heap: b.heap,
        role_text: b.role.as_str(),
        via: match (&b.source, b.line(), &b.via) {
            (None, Some(f), Some(w)) => Some((w.clone(), f.file.clone(), f.line.max(0) as u32)),
            _ => None,
        },
    }
}

/// The plan's numbers and its rows at the peak.
pub fn plan(p: &Plan) -> PlanSummary {
    let role = |k: &str| p.roles.get(k).copied().unwrap_or(0);
    PlanSummary {
        parameter_bytes: p.parameter_bytes,
        donated_bytes: p.donated_bytes,
        output_bytes: p.output_bytes,
        non_aliased_output_bytes: p.non_aliased_output_bytes,
        temp_bytes: p.temp_bytes,
        heap_peak_bytes: p.heap_peak_bytes,
        total_peak_bytes: p.total_peak_bytes,
        indefinite_bytes: p.indefinite_bytes,
        total_allocation_bytes: p.total_allocation_bytes,
        peak_instruction: p.peak_instruction.clone(),
        roles: Roles {
            forward: role("forward"),
            backward: role("backward"),
            workspace: role("workspace"),
            other: role("other"),
        },
        rows: p.at_peak.iter().map(row).collect(),
        indefinite_in_peak: p.indefinite_in_peak,
    }
}

fn allocators(rt: &Runtime) -> Vec<AllocatorRow> {
    rt.allocators
        .iter()
        .map(|a| AllocatorRow {
            name: a.name.clone(),
            peak_bytes_in_use: a.peak_bytes_in_use,
            capacity_bytes: a.capacity_bytes,
            events: a.events,
        })
        .collect()
}

/// The runtime view with the chosen plan's temporary block joined to each of its executions.
pub fn runtime(rt: &Runtime, plan: &Plan) -> RuntimeSummary {
    let temp_of = |e: &Execution| {
        (e.module == plan.module)
            .then(|| rt.temp_allocation(e, &plan.temp_allocations))
            .flatten()
            .map(|m| m.requested_bytes)
    };
    let main = rt.main();
    RuntimeSummary {
        allocator: main.map(|a| a.name.clone()),
        capacity_bytes: main.map(|a| a.capacity_bytes),
        peak_bytes_in_use: main.map(|a| a.peak_bytes_in_use),
        lifetime_peak_bytes: main.map(|a| a.lifetime_peak_bytes),
        executions: rt
            .executions
            .iter()
            .map(|e| ExecutionRow {
                module: e.module.clone(),
                start_ps: e.start_ps,
                kernels: e.kernels,
                bytes_in_use_at_start: e.bytes_in_use_at_start,
                temp_bytes_allocated: temp_of(e),
            })
            .collect(),
        allocator_retries: Some(
            rt.retries
                .iter()
                .map(|r| RetryRow {
                    start_ps: r.t_ps,
                    duration_ps: r.duration_ps,
                    module: r.module.clone(),
                })
                .collect(),
        ),
    }
}

/// Every module with a plan, with its executions in the capture.
pub fn modules(plans: &[Plan], rt: &Runtime) -> Modules {
    Modules::List(
        plans
            .iter()
            .map(|p| ModuleRow {
                module: p.module.clone(),
                total_peak_bytes: p.total_peak_bytes,
                heap_peak_bytes: p.heap_peak_bytes,
                executions: rt.executions_of(&p.module).count(),
            })
            .collect(),
    )
}

/// A capture without HLO modules (TensorFlow, or JAX with `enable_hlo_proto=False`): no plan,
/// no module to report on.
pub fn runtime_only(rt: &Runtime, versions: Vec<(String, String)>) -> Summary {
    let main = rt.main();
    Summary {
        module: None,
        plan: None,
        runtime: RuntimeSummary {
            allocator: main.map(|a| a.name.clone()),
            capacity_bytes: main.map(|a| a.capacity_bytes),
            peak_bytes_in_use: main.map(|a| a.peak_bytes_in_use),
            ..RuntimeSummary::default()
        },
        modules: Modules::Count(0),
        versions,
        why: String::new(),
        between_last_two: Vec::new(),
        live_at_last: Vec::new(),
        allocators: allocators(rt),
        heap_columns: Vec::new(),
        peak_position: 0,
        call_site: Vec::new(),
    }
}

/// The summary of an analysed module.
pub struct Parts<'a> {
    pub plan: &'a Plan,
    pub plans: &'a [Plan],
    pub rt: &'a Runtime,
    pub versions: Vec<(String, String)>,
    pub why: String,
    pub between_last_two: Vec<(String, u64)>,
    pub live_at_last: Vec<LiveGroup>,
    pub pictures: bool,
}

pub fn summarize(p: Parts) -> Summary {
    Summary {
        module: Some(p.plan.module.clone()),
        plan: Some(plan(p.plan)),
        runtime: runtime(p.rt, p.plan),
        modules: modules(p.plans, p.rt),
        versions: p.versions,
        why: p.why,
        between_last_two: p.between_last_two,
        live_at_last: p.live_at_last,
        allocators: allocators(p.rt),
        heap_columns: if p.pictures {
            downsample(&p.plan.heap_curve, 800)
        } else {
            Vec::new()
        },
        peak_position: p.plan.peak_position as u64,
        call_site: p.plan.call_site.iter().map(|f| f.location()).collect(),
    }
}
