//! The compile-time plan of one module: xprof memory_viewer's arithmetic (XPLANE_FORMAT.md §4)
//! over the buffer assignment, plus what a diagnosis needs (donation, roles, lines).

use rustc_hash::{FxHashMap, FxHashSet};

use super::hlo::{self, Frame};
use super::pb::xla as hpb;
use crate::error::CaptureError;

/// The plan of every module of an opened capture, in memory colour `color`.
pub fn plans(cap: &super::capture::Capture, color: i64) -> Result<Vec<Plan>, CaptureError> {
    cap.modules
        .iter()
        .map(|m| {
            let proto = hlo::decode(&cap.file.path, m)?;
            Ok(compute(m, &proto, color))
        })
        .collect()
}

/// Buffers below this size are lumped into one `small` row, as xprof does.
pub const SMALL_BUFFER_BYTES: u64 = 16384;

/// xprof's allocation category (first match in this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    Parameter,
    Output,
    ThreadLocal,
    Constant,
    Temporary,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Parameter => "Parameter",
            Category::Output => "Output",
            Category::ThreadLocal => "Thread-local",
            Category::Constant => "Constant",
            Category::Temporary => "Temporary",
        }
    }
    /// The shared site role of an allocation outside the heap.
    pub fn site_role(self) -> crate::site::SiteRole {
        use crate::site::SiteRole;
        match self {
            Category::Parameter => SiteRole::Parameter,
            Category::Output => SiteRole::Output,
            Category::ThreadLocal => SiteRole::ThreadLocal,
            Category::Constant => SiteRole::Constant,
            Category::Temporary => SiteRole::Temporary,
        }
    }
    fn of(a: &hpb::BufferAllocationProto) -> Category {
        if a.is_entry_computation_parameter {
            Category::Parameter
        } else if a.maybe_live_out {
            Category::Output
        } else if a.is_thread_local {
            Category::ThreadLocal
        } else if a.is_constant {
            Category::Constant
        } else {
            Category::Temporary
        }
    }
}

/// Indefinite lifetime: parameters, outputs, constants. Thread-local allocations (per-thread
/// scratch on CPU/GPU) are left out of every total, as xprof 2.24 does (checked against the
/// oracles: counting them adds 4-byte allocations xprof does not show).
fn is_indefinite(a: &hpb::BufferAllocationProto) -> bool {
    a.is_entry_computation_parameter || a.is_constant || a.maybe_live_out
}

/// What a buffer is for, from the JAX name stack (inferred).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// `jvp(` outside `transpose(`: forward activations kept for the backward pass.
    Forward,
    /// `while/body` outside `transpose(`: per-iteration values stacked by a scan (forward).
    ScanStack,
    /// `checkpoint/rematted_computation`: a forward value recomputed by jax.checkpoint for the
    /// backward pass (inside `transpose(`, but forward work).
    Recomputed,
    /// `transpose(`: the backward pass (gradients and their temporaries).
    Backward,
    /// s8 custom-call outputs: library (GEMM/conv) workspace.
    Workspace,
    Other,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Forward => "forward, kept for the backward pass",
            Role::ScanStack => "forward, stacked by a scan (while/body)",
            Role::Recomputed => "forward, recomputed by jax.checkpoint",
            Role::Backward => "backward",
            Role::Workspace => "workspace",
            Role::Other => "other",
        }
    }
    /// The shared site role.
    pub fn site_role(self) -> crate::site::SiteRole {
        use crate::site::SiteRole;
        match self {
            Role::Forward => SiteRole::Forward,
            Role::ScanStack => SiteRole::ScanStack,
            Role::Recomputed => SiteRole::Recomputed,
            Role::Backward => SiteRole::Backward,
            Role::Workspace => SiteRole::Workspace,
            Role::Other => SiteRole::Other,
        }
    }
    /// Key in the JSON `roles` object (scan stacks count as forward).
    pub fn key(self) -> &'static str {
        match self {
            Role::Forward | Role::ScanStack | Role::Recomputed => "forward",
            Role::Backward => "backward",
            Role::Workspace => "workspace",
            Role::Other => "other",
        }
    }
}

/// Role of an instruction from its op_name (first name of a fused `a;b` list) and shape.
pub fn role_of(op_name: &str, opcode: &str, element_type: i32) -> Role {
    if opcode == "custom-call" && element_type == 2 {
        return Role::Workspace;
    }
    let first = op_name.split(';').next().unwrap_or("");
    if first.contains("rematted_computation") {
        Role::Recomputed
    } else if first.contains("transpose(") {
        Role::Backward
    } else if first.contains("while/body") {
        Role::ScanStack
    } else if first.contains("jvp(") {
        Role::Forward
    } else {
        Role::Other
    }
}

/// One row of "buffers at peak".
#[derive(Clone, Debug)]
pub struct PeakBuffer {
    pub logical_buffer_id: i64,
    pub size: u64,
    pub instruction: String,
    pub shape: String,
    pub op_name: String,
    pub opcode: String,
    pub category: Category,
    /// True for heap-simulator (temporary) buffers, false for indefinite allocations.
    pub heap: bool,
    pub source: Option<Frame>,
    /// Innermost first.
    pub stack: Vec<Frame>,
    pub role: Role,
    /// For a buffer XLA created without a name stack: the `while` loop it is carried by (a scan's
    /// stacked values), whose line stands in for the missing one (inferred).
    pub via: Option<String>,
    pub via_stack: Vec<Frame>,
    /// For a heap row: the heap-simulator events `[first, last)` during which its memory is
    /// in use (the indices of `Plan::heap_levels`); empty for indefinite allocations.
    pub live_events: std::ops::Range<usize>,
}

impl PeakBuffer {
    /// The stack to attribute the buffer to: its own, else the one of the loop carrying it.
    pub fn frames(&self) -> &[Frame] {
        if self.stack.is_empty() && self.source.is_none() {
            &self.via_stack
        } else {
            &self.stack
        }
    }
    /// The source line to show: xprof's, else the carrying loop's.
    pub fn line(&self) -> Option<&Frame> {
        self.source.as_ref().or(self.via_stack.first())
    }
}

/// The plan of one module in memory colour 0 (or another colour).
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub module: String,
    pub hlo_name: String,
    pub program_id: u64,
    pub entry_computation: String,
    pub parameter_bytes: u64,
    pub output_bytes: u64,
    /// Σ parameter allocations named by input_output_alias / buffer_donor.
    pub donated_bytes: u64,
    /// Outputs that are not parameter allocations: new memory on every execution.
    pub non_aliased_output_bytes: u64,
    pub indefinite_bytes: u64,
    /// Indefinite bytes xprof adds to the peak (allocations with a non-empty largest buffer).
    pub indefinite_in_peak: u64,
    pub total_allocation_bytes: u64,
    /// total − indefinite: the temporary block(s) the runtime allocates per execution.
    pub temp_bytes: u64,
    /// Sizes of the Temporary allocations (the runtime join key).
    pub temp_allocations: Vec<u64>,
    pub non_reusable_bytes: u64,
    pub heap_peak_bytes: u64,
    pub total_peak_bytes: u64,
    pub heap_points: usize,
    pub peak_position: usize,
    pub peak_instruction: String,
    /// Named rows (≥ 16 KiB) and all heap buffers at the peak, largest first.
    pub at_peak: Vec<PeakBuffer>,
    pub small_lumped_bytes: u64,
    /// Heap bytes at the peak by role.
    pub roles: FxHashMap<&'static str, u64>,
    /// Number of input_output_alias entries.
    pub alias_count: usize,
    /// Entry parameters: (number, op_name, allocation bytes).
    pub parameters: Vec<Param>,
    /// Instructions under `checkpoint/rematted_computation` (the user's jax.checkpoint).
    pub user_remat_instructions: usize,
    /// Instructions XLA's rematerialization pass cloned (`*.remat*` names).
    pub xla_remat_instructions: usize,
    /// Shapes (without layout) of the entry computation's outputs.
    pub output_shapes: Vec<String>,
    /// Caller frames of the entry computation's instructions: the call site of the jitted fn.
    pub call_site: Vec<Frame>,
    /// Heap bytes before each event of the heap-simulator trace (the program order), then after
    /// the last: `heap_curve[peak_position + 1]` is the peak.
    pub heap_curve: Vec<u64>,
    /// What donating the state parameters not yet donated would change (None when there is
    /// nothing to donate).
    pub donation: Option<super::donation::DonationEstimate>,
}

impl Plan {
    /// Heap bytes in use after each event of the heap-simulator trace (the replay's levels; the
    /// heap peak is their maximum): the curve without its first point.
    pub fn heap_levels(&self) -> &[u64] {
        self.heap_curve.get(1..).unwrap_or(&[])
    }

    /// The heap peak with the schedule unchanged if each heap row of `shrink` needed that many
    /// fewer bytes over its whole life (inferred: XLA may schedule and fuse the changed
    /// program differently).
    pub fn heap_peak_if_shrunk(&self, shrink: &[(&PeakBuffer, u64)]) -> u64 {
        let n = self.heap_levels().len();
        let mut delta = vec![0i128; n + 1];
        for (b, by) in shrink {
            let r = b.live_events.start.min(n)..b.live_events.end.min(n);
            if r.is_empty() {
                continue;
            }
            delta[r.start] += *by as i128;
            delta[r.end] -= *by as i128;
        }
        let mut cut = 0i128;
        let mut peak = 0i128;
        for (i, level) in self.heap_levels().iter().enumerate() {
            cut += delta[i];
            peak = peak.max(*level as i128 - cut);
        }
        peak.max(0) as u64
    }
}

/// One entry-computation parameter.
#[derive(Clone, Debug)]
pub struct Param {
    pub number: i64,
    /// Shape without layout, e.g. `f32[2048,2048]`.
    pub shape: String,
    pub op_name: String,
    pub bytes: u64,
    pub donated: bool,
}

struct Buf<'a> {
    proto: &'a hpb::LogicalBufferProto,
    alloc: usize,
    instr: &'a hpb::HloInstructionProto,
    canonical: Option<i64>,
    refs: i64,
}

/// Compute the plan as xprof's memory_viewer does, for `color`.
pub fn compute(m: &hlo::ModuleEntry, proto: &hpb::HloProto, color: i64) -> Plan {
    let mut plan = Plan {
        module: m.name.clone(),
        hlo_name: m.hlo_name.clone(),
        program_id: m.program_id,
        ..Plan::default()
    };
    let empty_module = hpb::HloModuleProto::default();
    let module = proto.hlo_module.as_ref().unwrap_or(&empty_module);
    plan.entry_computation = module.entry_computation_name.clone();
    let empty_ba = hpb::BufferAssignmentProto::default();
    let ba = proto.buffer_assignment.as_ref().unwrap_or(&empty_ba);
    let ix = Instructions::of(module, ba);
    let mut bufs = logical_buffers(ba, &ix);

    // Totals over allocations of this colour.
    let allocs: Vec<(usize, &hpb::BufferAllocationProto)> = ba
        .buffer_allocations
        .iter()
        .enumerate()
        .filter(|(_, a)| a.color == color)
        .collect();
    let donors = donated_params(module);
    add_totals(&mut plan, &allocs, &donors, module);

    let traces = &ba.heap_simulator_traces;
    let trace = heap_trace(traces, &bufs, &allocs, color);
    let heap = trace
        .and_then(|ti| traces.get(ti))
        .map(|t| replay_heap(&mut plan, t, &mut bufs))
        .unwrap_or_default();
    peak_rows(&mut plan, &allocs, &bufs, &heap, &ix);
    parameters_and_call_site(&mut plan, module, &allocs, &donors, ix.sfi);

    let events = trace
        .and_then(|ti| traces.get(ti))
        .map(|t| t.events.as_slice())
        .unwrap_or(&[]);
    let donation = super::donation::estimate(module, ba, color, events, plan.heap_levels());
    plan.donation = donation;
    count_remat(&mut plan, module);
    plan
}

/// The module's instructions by id, who uses each, and what a row needs to describe one.
struct Instructions<'a> {
    by_id: FxHashMap<i64, &'a hpb::HloInstructionProto>,
    users: FxHashMap<i64, Vec<&'a hpb::HloInstructionProto>>,
    sfi: Option<&'a hpb::StackFrameIndexProto>,
    ba: &'a hpb::BufferAssignmentProto,
}

impl<'a> Instructions<'a> {
    fn of(module: &'a hpb::HloModuleProto, ba: &'a hpb::BufferAssignmentProto) -> Self {
        let mut by_id: FxHashMap<i64, &hpb::HloInstructionProto> = FxHashMap::default();
        let mut users: FxHashMap<i64, Vec<&hpb::HloInstructionProto>> = FxHashMap::default();
        for c in &module.computations {
            for i in &c.instructions {
                by_id.insert(i.id, i);
                for o in &i.operand_ids {
                    users.entry(*o).or_default().push(i);
                }
            }
        }
        Instructions {
            by_id,
            users,
            sfi: module.stack_frame_index.as_ref(),
            ba,
        }
    }

    /// The `while` an unnamed instruction's value flows into (through tuples and copies).
    fn carrying_while(
        &self,
        start: &hpb::HloInstructionProto,
    ) -> Option<&'a hpb::HloInstructionProto> {
        let mut frontier = vec![start.id];
        for _ in 0..4 {
            let mut next = Vec::new();
            for id in frontier {
                for u in self.users.get(&id).map(|v| v.as_slice()).unwrap_or(&[]) {
                    if u.opcode == "while" {
                        return Some(u);
                    }
                    if matches!(
                        u.opcode.as_str(),
                        "tuple" | "copy" | "bitcast" | "get-tuple-element"
                    ) {
                        next.push(u.id);
                    }
                }
            }
            frontier = next;
        }
        None
    }

    /// One row of the buffers at the peak.
    fn row(&self, b: &Buf, heap: bool) -> PeakBuffer {
        let sfi = self.sfi;
        let idx = b
            .proto
            .defined_at
            .as_ref()
            .map(|d| d.shape_index.as_slice())
            .unwrap_or(&[]);
        let empty_shape = hpb::ShapeProto::default();
        let shape = hlo::resolve_shape(b.instr.shape.as_ref().unwrap_or(&empty_shape), idx);
        let op_name = b
            .instr
            .metadata
            .as_ref()
            .map(|m| m.op_name.clone())
            .unwrap_or_default();
        let (source, stack) = hlo::source_of(b.instr, sfi);
        let instruction = if idx.is_empty() {
            b.instr.name.clone()
        } else {
            let parts: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
            format!("{}{{{}}}", b.instr.name, parts.join(","))
        };
        let mut role = role_of(&op_name, &b.instr.opcode, shape.element_type);
        let (mut via, mut via_stack) = (None, Vec::new());
        if op_name.is_empty() {
            if let Some(w) = self.carrying_while(b.instr) {
                let wname = w
                    .metadata
                    .as_ref()
                    .map(|m| m.op_name.as_str())
                    .unwrap_or("");
                role = if wname.contains("transpose(") {
                    Role::Backward
                } else {
                    Role::ScanStack
                };
                via = Some(w.name.clone());
                via_stack = hlo::source_of(w, sfi).1;
            }
        }
        PeakBuffer {
            logical_buffer_id: b.proto.id,
            size: b.proto.size.max(0) as u64,
            instruction,
            shape: hlo::shape_string(shape),
            role,
            via,
            via_stack,
            live_events: 0..0,
            op_name,
            opcode: b.instr.opcode.clone(),
            category: Category::of(&self.ba.buffer_allocations[b.alloc]),
            heap,
            source,
            stack,
        }
    }
}

/// Every assigned logical buffer whose defining instruction is known, by id.
fn logical_buffers<'a>(
    ba: &'a hpb::BufferAssignmentProto,
    ix: &Instructions<'a>,
) -> FxHashMap<i64, Buf<'a>> {
    let lb_proto: FxHashMap<i64, &hpb::LogicalBufferProto> =
        ba.logical_buffers.iter().map(|b| (b.id, b)).collect();
    let mut bufs: FxHashMap<i64, Buf> = FxHashMap::default();
    for (ai, a) in ba.buffer_allocations.iter().enumerate() {
        for asg in &a.assigned {
            let Some(p) = lb_proto.get(&asg.logical_buffer_id) else {
                continue;
            };
            let iid = p.defined_at.as_ref().map(|d| d.instruction_id).unwrap_or(0);
            let Some(instr) = ix.by_id.get(&iid) else {
                continue;
            };
            bufs.insert(
                asg.logical_buffer_id,
                Buf {
                    proto: p,
                    alloc: ai,
                    instr,
                    canonical: None,
                    refs: 0,
                },
            );
        }
    }
    bufs
}

/// Totals over the allocations of this colour.
fn add_totals(
    plan: &mut Plan,
    allocs: &[(usize, &hpb::BufferAllocationProto)],
    donors: &FxHashSet<(i64, Vec<i64>)>,
    module: &hpb::HloModuleProto,
) {
    for (_, a) in allocs {
        let size = a.size.max(0) as u64;
        if a.is_thread_local || a.is_tuple {
            plan.non_reusable_bytes = plan.non_reusable_bytes.saturating_add(size);
        }
        if a.is_thread_local {
            continue;
        }
        plan.total_allocation_bytes = plan.total_allocation_bytes.saturating_add(size);
        if a.is_entry_computation_parameter {
            plan.parameter_bytes = plan.parameter_bytes.saturating_add(size);
            if donors.contains(&(a.parameter_number, a.parameter_shape_index.clone())) {
                plan.donated_bytes = plan.donated_bytes.saturating_add(size);
            }
        }
        if a.maybe_live_out {
            plan.output_bytes = plan.output_bytes.saturating_add(size);
            if !a.is_entry_computation_parameter {
                plan.non_aliased_output_bytes = plan.non_aliased_output_bytes.saturating_add(size);
            }
        }
        if is_indefinite(a) {
            plan.indefinite_bytes = plan.indefinite_bytes.saturating_add(size);
        } else {
            plan.temp_allocations.push(size);
        }
    }
    plan.temp_bytes = plan
        .total_allocation_bytes
        .saturating_sub(plan.indefinite_bytes);
    plan.alias_count = module
        .input_output_alias
        .as_ref()
        .map(|a| a.entries.len())
        .unwrap_or(0);
}

/// Heap-simulator trace: the trace whose first event's buffer lies in a temporary allocation
/// of this colour; else the trace with most events of this colour.
fn heap_trace(
    traces: &[hpb::HeapSimulatorTrace],
    bufs: &FxHashMap<i64, Buf>,
    allocs: &[(usize, &hpb::BufferAllocationProto)],
    color: i64,
) -> Option<usize> {
    let mut trace_of_alloc: FxHashMap<usize, usize> = FxHashMap::default();
    for (ti, t) in traces.iter().enumerate() {
        let Some(e) = t.events.first() else { continue };
        if let Some(b) = bufs.get(&e.buffer_id) {
            trace_of_alloc.insert(b.alloc, ti);
        }
    }
    let trace = allocs
        .iter()
        .filter(|(_, a)| !is_indefinite(a) && !a.is_thread_local)
        .find_map(|(ai, _)| trace_of_alloc.get(ai).copied());
    if trace.is_some() {
        return trace;
    }
    let mut best = (0usize, None);
    for (ti, t) in traces.iter().enumerate() {
        let n = t
            .events
            .iter()
            .filter(|e| {
                bufs.get(&e.buffer_id)
                    .is_some_and(|b| b.proto.color == color)
            })
            .count();
        if n > best.0 {
            best = (n, Some(ti));
        }
    }
    best.1
}

/// What the heap replay leaves for the rows: the buffers xprof shows at the peak, and each root
/// buffer's lives (event index ranges).
#[derive(Default)]
struct HeapReplay {
    peak_ids: Vec<i64>,
    live_ranges: FxHashMap<i64, Vec<std::ops::Range<usize>>>,
}

/// Replay (XPLANE_FORMAT.md §4). A live root canonical buffer shows as itself, or as the
/// buffer whose SHARE_WITH revived it (the value that occupies the memory now). Shares into a
/// buffer already live (in place) change nothing.
///
/// The buffers at the peak are read off the lives once the replay is done (the roots whose life
/// holds the peak's event, in the order they became live), not copied at each new peak nor kept
/// in a list searched at each free: either made a heap that rises or frees one buffer at a time
/// cost the square of its events.
fn replay_heap(
    plan: &mut Plan,
    t: &hpb::HeapSimulatorTrace,
    bufs: &mut FxHashMap<i64, Buf>,
) -> HeapReplay {
    let mut out = HeapReplay::default();
    // Root buffer -> (event index at which it became live, the buffer it shows); closed into
    // `lives` when freed.
    let mut opened: FxHashMap<i64, (usize, i64)> = FxHashMap::default();
    // Every life: (start, end, root, shown); `live_ranges` is made from it at the end.
    let mut lives: Vec<(usize, usize, i64, i64)> = Vec::new();
    let mut peak_at: Option<usize> = None;
    let mut heap: i64 = 0;
    let mut peak: i64 = 0;
    plan.heap_curve.reserve(t.events.len());
    for (pos, e) in t.events.iter().enumerate() {
        plan.heap_points += 1;
        plan.heap_curve.push(heap.max(0) as u64);
        if !bufs.contains_key(&e.buffer_id) {
            continue;
        }
        // (root that became live, the buffer it shows)
        let mut grew: Option<(i64, i64)> = None;
        match e.kind {
            0 => {
                let root = root_of(bufs, e.buffer_id);
                let Some(refs) = add_ref(bufs, root, 1) else {
                    continue;
                };
                if refs == 1 {
                    grew = Some((root, e.buffer_id));
                }
            }
            1 => {
                let root = root_of(bufs, e.buffer_id);
                let Some(refs) = add_ref(bufs, root, -1) else {
                    continue;
                };
                if refs == 0 {
                    if let Some((start, shown)) = opened.remove(&root) {
                        lives.push((start, pos, root, shown));
                    }
                    heap = heap.saturating_sub(bufs.get(&root).map(|b| b.proto.size).unwrap_or(0));
                }
            }
            2 => {
                let canon = e.share_with_canonical_id;
                if !bufs.contains_key(&canon) {
                    continue;
                }
                if let Some(b) = bufs.get_mut(&e.buffer_id) {
                    b.canonical = Some(canon);
                }
                let root = root_of(bufs, canon);
                let Some(refs) = add_ref(bufs, root, 1) else {
                    continue;
                };
                if refs == 1 {
                    grew = Some((root, e.buffer_id));
                }
            }
            _ => {}
        }
        if let Some((root, shown)) = grew {
            opened.insert(root, (pos, shown));
            heap = heap.saturating_add(bufs.get(&root).map(|b| b.proto.size).unwrap_or(0));
            if heap > peak {
                peak = heap;
                plan.peak_position = pos;
                plan.peak_instruction = e.instruction_name.clone();
                peak_at = Some(pos);
            }
        }
    }
    plan.heap_curve.push(heap.max(0) as u64);
    for (root, (start, shown)) in opened.drain() {
        lives.push((start, t.events.len(), root, shown));
    }
    for &(start, end, root, _) in &lives {
        out.live_ranges.entry(root).or_default().push(start..end);
    }
    if let Some(p) = peak_at {
        // One buffer becomes live an event: the start orders them as they became live.
        let mut at: Vec<(usize, i64)> = lives
            .iter()
            .filter(|l| l.0 <= p && p < l.1)
            .map(|l| (l.0, l.3))
            .collect();
        at.sort_unstable();
        out.peak_ids = at.into_iter().map(|(_, shown)| shown).collect();
    }
    plan.heap_points += 1;
    plan.heap_peak_bytes = peak.max(0) as u64;
    out
}

/// Rows: the largest logical buffer of each indefinite allocation, then heap buffers.
fn peak_rows(
    plan: &mut Plan,
    allocs: &[(usize, &hpb::BufferAllocationProto)],
    bufs: &FxHashMap<i64, Buf>,
    heap: &HeapReplay,
    ix: &Instructions,
) {
    let mut rows = Vec::new();
    for (_, a) in allocs.iter().filter(|(_, a)| is_indefinite(a)) {
        let mut best: Option<&Buf> = None;
        for asg in &a.assigned {
            if let Some(b) = bufs.get(&asg.logical_buffer_id) {
                if b.proto.size > best.map(|x| x.proto.size).unwrap_or(0) {
                    best = Some(b);
                }
            }
        }
        if let Some(b) = best {
            plan.indefinite_in_peak = plan.indefinite_in_peak.saturating_add(a.size.max(0) as u64);
            rows.push(ix.row(b, false));
        }
    }
    for id in &heap.peak_ids {
        if let Some(b) = bufs.get(id) {
            let mut r = ix.row(b, true);
            // The life (a buffer shared into after a free lives again) that holds the peak.
            r.live_events = heap
                .live_ranges
                .get(&root_of(bufs, *id))
                .and_then(|v| v.iter().find(|l| l.contains(&plan.peak_position)))
                .cloned()
                .unwrap_or(0..0);
            let role = plan.roles.entry(r.role.key()).or_default();
            *role = role.saturating_add(r.size);
            rows.push(r);
        }
    }
    plan.small_lumped_bytes = rows
        .iter()
        .filter(|r| r.size < SMALL_BUFFER_BYTES)
        .map(|r| r.size)
        .sum();
    rows.sort_by(|a, b| {
        b.size
            .cmp(&a.size)
            .then(a.logical_buffer_id.cmp(&b.logical_buffer_id))
    });
    plan.at_peak = rows;
    plan.total_peak_bytes = plan.heap_peak_bytes.saturating_add(plan.indefinite_in_peak);
}

/// Parameters and where the module was called from.
fn parameters_and_call_site(
    plan: &mut Plan,
    module: &hpb::HloModuleProto,
    allocs: &[(usize, &hpb::BufferAllocationProto)],
    donors: &FxHashSet<(i64, Vec<i64>)>,
    sfi: Option<&hpb::StackFrameIndexProto>,
) {
    let entry = module
        .computations
        .iter()
        .find(|c| c.id == module.entry_computation_id)
        .or_else(|| module.computations.last());
    let Some(entry) = entry else { return };
    let mut params: Vec<Param> = entry
        .instructions
        .iter()
        .filter(|i| i.opcode == "parameter")
        .map(|i| {
            let bytes = allocs
                .iter()
                .filter(|(_, a)| {
                    a.is_entry_computation_parameter && a.parameter_number == i.parameter_number
                })
                .map(|(_, a)| a.size.max(0) as u64)
                .sum();
            Param {
                number: i.parameter_number,
                shape: bare_shape(i.shape.as_ref()),
                op_name: i
                    .metadata
                    .as_ref()
                    .map(|m| m.op_name.clone())
                    .unwrap_or_default(),
                bytes,
                donated: donors.iter().any(|(p, _)| *p == i.parameter_number),
            }
        })
        .collect();
    params.sort_by_key(|p| p.number);
    plan.parameters = params;
    plan.call_site = common_callers(entry, sfi);
    if let Some(root) = entry.instructions.iter().find(|i| i.id == entry.root_id) {
        plan.output_shapes = match root.shape.as_ref() {
            Some(s) if s.element_type == 13 => {
                s.tuple_shapes.iter().map(|t| bare_shape(Some(t))).collect()
            }
            s => vec![bare_shape(s)],
        };
    }
}

/// Instructions XLA's rematerialization pass cloned, and those under the user's `jax.checkpoint`.
fn count_remat(plan: &mut Plan, module: &hpb::HloModuleProto) {
    for i in module.computations.iter().flat_map(|c| &c.instructions) {
        if i.name.contains(".remat") {
            plan.xla_remat_instructions += 1;
        }
        if i.metadata
            .as_ref()
            .is_some_and(|m| m.op_name.contains("rematted_computation"))
        {
            plan.user_remat_instructions += 1;
        }
    }
}

fn bare_shape(s: Option<&hpb::ShapeProto>) -> String {
    match s {
        Some(s) => {
            let full = hlo::shape_string(s);
            match full.find('{') {
                Some(i) if s.element_type != 13 => full[..i].to_string(),
                _ => full,
            }
        }
        None => String::new(),
    }
}

/// Add `d` to the references of buffer `root`: its new count (`None`: no such buffer).
fn add_ref(bufs: &mut FxHashMap<i64, Buf>, root: i64, d: i64) -> Option<i64> {
    let b = bufs.get_mut(&root)?;
    b.refs += d;
    Some(b.refs)
}

fn root_of(bufs: &FxHashMap<i64, Buf>, mut id: i64) -> i64 {
    for _ in 0..10_000 {
        match bufs.get(&id).and_then(|b| b.canonical) {
            Some(c) if c != id => id = c,
            _ => break,
        }
    }
    id
}

/// (parameter_number, parameter_shape_index) of every donated parameter.
fn donated_params(module: &hpb::HloModuleProto) -> FxHashSet<(i64, Vec<i64>)> {
    let mut out = FxHashSet::default();
    if let Some(a) = &module.input_output_alias {
        for e in &a.entries {
            out.insert((e.parameter_number, e.parameter_shape_index.clone()));
        }
    }
    if let Some(d) = &module.buffer_donor {
        for e in &d.entries {
            out.insert((e.parameter_number, e.parameter_shape_index.clone()));
        }
    }
    out
}

/// The longest caller chain shared (outermost frames) by the entry computation's instructions:
/// its innermost frame is the line that called the jitted function.
fn common_callers(
    entry: &hpb::HloComputationProto,
    sfi: Option<&hpb::StackFrameIndexProto>,
) -> Vec<Frame> {
    let mut common: Option<Vec<Frame>> = None;
    for i in &entry.instructions {
        let id = i.metadata.as_ref().map(|m| m.stack_frame_id).unwrap_or(0);
        if id == 0 {
            continue;
        }
        let mut frames = hlo::stack_frames(sfi, id);
        frames.reverse(); // outermost first
        common = Some(match common {
            None => frames,
            Some(c) => c
                .into_iter()
                .zip(frames)
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| a)
                .collect(),
        });
    }
    let mut c = common.unwrap_or_default();
    c.reverse(); // innermost first
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_the_jax_name_stack() {
        assert_eq!(role_of("jit(f)/jvp()/div", "fusion", 11), Role::Forward);
        assert_eq!(
            role_of("jit(f)/transpose(jvp())/mul", "fusion", 11),
            Role::Backward
        );
        assert_eq!(
            role_of(
                "jit(f)/transpose(jvp(jvp()))/checkpoint/rematted_computation/reduce_max",
                "fusion",
                11
            ),
            Role::Recomputed
        );
        assert_eq!(
            role_of("jit(f)/jvp()/while/body/closed_call/dot", "dot", 11),
            Role::ScanStack
        );
        assert_eq!(
            role_of("jit(f)/jvp()/dot", "custom-call", 2),
            Role::Workspace
        );
        // Fusions list several names; the first decides.
        assert_eq!(
            role_of("jit(f)/transpose(jvp())/mul;jit(f)/jvp()/add", "fusion", 11),
            Role::Backward
        );
        assert_eq!(role_of("", "copy", 11), Role::Other);
    }

    /// The buffers at the peak, read off the lives after the replay, are the ones a replay that
    /// keeps the live list at each event shows there (in the order they became live), on random
    /// traces of allocations, frees and shares that revive freed buffers.
    #[test]
    fn heap_replay_reads_the_peak_buffers_off_the_lives() {
        let proto = |id: i64, size: i64| hpb::LogicalBufferProto {
            id,
            size,
            ..Default::default()
        };
        let instr = hpb::HloInstructionProto::default();
        fn make<'a>(
            protos: &'a [hpb::LogicalBufferProto],
            instr: &'a hpb::HloInstructionProto,
        ) -> FxHashMap<i64, Buf<'a>> {
            protos
                .iter()
                .map(|p| {
                    let b = Buf {
                        proto: p,
                        alloc: 0,
                        instr,
                        canonical: None,
                        refs: 0,
                    };
                    (p.id, b)
                })
                .collect()
        }
        let mut rng = crate::test_rng::XorShift::new(0x2545_f491_4f6c_dd1d);
        let mut next = move || rng.next_u64();
        for _ in 0..200 {
            let n = 2 + next() % 12;
            let protos: Vec<hpb::LogicalBufferProto> = (0..n as i64)
                .map(|id| proto(id, 1 + (next() % 100) as i64))
                .collect();
            let mut events = Vec::new();
            for _ in 0..(next() % 60) {
                events.push(hpb::heap_simulator_trace::Event {
                    kind: (next() % 3) as i32,
                    buffer_id: (next() % n) as i64,
                    share_with_canonical_id: (next() % n) as i64,
                    ..Default::default()
                });
            }
            let t = hpb::HeapSimulatorTrace {
                events,
                ..Default::default()
            };
            let mut bufs = make(&protos, &instr);
            let got = replay_heap(&mut Plan::default(), &t, &mut bufs).peak_ids;
            // The list kept at each event, copied at each new peak.
            let mut bufs = make(&protos, &instr);
            let (mut live, mut shown): (Vec<i64>, FxHashMap<i64, i64>) = Default::default();
            let (mut heap, mut peak, mut want) = (0i64, 0i64, Vec::new());
            for e in &t.events {
                let grew = match e.kind {
                    0 | 2 => {
                        let target = if e.kind == 0 {
                            e.buffer_id
                        } else {
                            if let Some(b) = bufs.get_mut(&e.buffer_id) {
                                b.canonical = Some(e.share_with_canonical_id);
                            }
                            e.share_with_canonical_id
                        };
                        let root = root_of(&bufs, target);
                        (add_ref(&mut bufs, root, 1) == Some(1)).then_some((root, e.buffer_id))
                    }
                    _ => {
                        let root = root_of(&bufs, e.buffer_id);
                        if add_ref(&mut bufs, root, -1) == Some(0) {
                            live.retain(|&r| r != root);
                            heap -= bufs[&root].proto.size;
                        }
                        None
                    }
                };
                if let Some((root, id)) = grew {
                    live.push(root);
                    shown.insert(root, id);
                    heap += bufs[&root].proto.size;
                    if heap > peak {
                        peak = heap;
                        want = live.iter().map(|r| shown[r]).collect();
                    }
                }
            }
            assert_eq!(got, want, "{:?}", t.events);
        }
    }
}
