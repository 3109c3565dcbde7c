//! What donating the step's state would save, bounded from the compiled plan (inferred).
//!
//! Without donation XLA writes every new parameter / optimizer-state leaf into an output
//! allocation of its own, and XLA:CPU's buffer assignment lends those allocations to
//! temporaries (activations, gradients, copies) computed before the outputs are written: the
//! heap stays small because the outputs hold them. With donation the outputs live in the donated
//! parameters' buffers; the temporaries that were lent output memory need the heap, and a
//! parameter that is still read by an instruction its update does not wait for needs a copy
//! (XLA's copy insertion). The saving is the outputs' bytes less that growth of the heap:
//!
//! * at least: outputs − (heap + lent temporaries + copies, the most at one position of the
//!   compiled schedule − heap peak). XLA schedules the donated program to a peak no higher than
//!   the present order gives it (it keeps the best of its schedulers);
//! * at most: outputs − (the lent temporaries' own concurrent peak − heap peak): they are still
//!   computed, from the same operands, and need the heap together.
//!
//! Liveness comes from the module's schedule (`HloModuleProto.schedule`): a buffer lives from
//! the position of the instruction that defines it to its last use.

use rustc_hash::{FxHashMap, FxHashSet};

use super::hlo;
use super::pb::xla as hpb;

/// The bounds' ingredients, all bytes (read where the plan names them, inferred where the
/// schedule gives liveness).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DonationEstimate {
    /// State parameters (pytree leaves, not donated yet) with a same-shaped output: how many.
    pub params: usize,
    /// The arguments (pytree roots) they belong to, with their bytes, in parameter order.
    pub args: Vec<(String, u64)>,
    /// Arguments with a parameter donated already, in parameter order.
    pub donated_args: Vec<String>,
    /// Output allocations those outputs are written to (read): what donation gives back.
    pub output_bytes: u64,
    /// Logical buffers the buffer assignment placed in those allocations before the outputs
    /// (read): how many, and their bytes.
    pub lent_buffers: usize,
    pub lent_bytes: u64,
    /// The most of them live at once under the schedule (inferred).
    pub lent_peak: u64,
    /// Parameters read by an instruction their update does not depend on: copied when donated
    /// (inferred): how many, and their bytes.
    pub copies: usize,
    pub copy_bytes: u64,
    /// Heap + lent temporaries + copies, the most at one position of the schedule (inferred).
    pub moved_peak: u64,
    /// Liveness from the module's schedule (else from the entry computation's order).
    pub scheduled: bool,
}

impl DonationEstimate {
    /// `[low, high]` bytes the donation saves from the total peak (inferred; see the module doc).
    pub fn range(&self, heap_peak: u64) -> (u64, u64) {
        let most = self.moved_peak.max(heap_peak) - heap_peak;
        let least = self.lent_peak.max(heap_peak) - heap_peak;
        (
            self.output_bytes.saturating_sub(most),
            self.output_bytes.saturating_sub(least),
        )
    }
}

/// `f32[2,3]` of a shape, without its layout.
fn bare(s: Option<&hpb::ShapeProto>) -> String {
    s.map(|s| hlo::without_layout(&hlo::shape_string(s)).to_string())
        .unwrap_or_default()
}

/// Top-level argument of a parameter's op_name: `opt_state['m'][2]['w']` → `opt_state`.
pub fn arg_root(op_name: &str) -> &str {
    let end = op_name.find(['[', '.', '/']).unwrap_or(op_name.len());
    &op_name[..end]
}

/// Whether a parameter is a leaf of a pytree argument (`opt_state['m'][2]['w']`, not `x`).
fn is_leaf_of_tree(op_name: &str) -> bool {
    let root = arg_root(op_name);
    !root.is_empty() && root.len() < op_name.len()
}

/// The estimate for donating every pytree parameter that is not donated yet and has an output of
/// its shape and dtype (matched in order, as JAX does), in memory colour `color`. `events` and
/// `levels` are the chosen heap-simulator trace and the heap in use after each of its events.
pub fn estimate(
    module: &hpb::HloModuleProto,
    ba: &hpb::BufferAssignmentProto,
    color: i64,
    events: &[hpb::heap_simulator_trace::Event],
    levels: &[u64],
) -> Option<DonationEstimate> {
    let g = Schedule::of(module)?;
    let (pairs, donated_args) = state_pairs(module, &g)?;
    let allocs = output_allocations(ba, color, &pairs);
    let defined = defined_bytes(ba);
    let param_bytes = |id: i64| defined.get(&id).copied().unwrap_or(0);
    let mut args: Vec<(String, u64)> = Vec::new();
    for (prm, _) in &pairs {
        let op_name = prm
            .metadata
            .as_ref()
            .map(|m| m.op_name.as_str())
            .unwrap_or("");
        let root = arg_root(op_name);
        match args.iter_mut().find(|a| a.0 == root) {
            Some(a) => a.1 = a.1.saturating_add(param_bytes(prm.id)),
            None => args.push((root.to_string(), param_bytes(prm.id))),
        }
    }
    let mut est = DonationEstimate {
        params: pairs.len(),
        args,
        donated_args,
        scheduled: g.scheduled,
        ..DonationEstimate::default()
    };
    let lent_delta = lent_temporaries(&mut est, &g, ba, &allocs);
    let copy_delta = copies(&mut est, &g, &pairs, &param_bytes);
    let heap_at = heap_at_positions(&g, events, levels);
    let (mut lent, mut copies) = (0i128, 0i128);
    for (t, heap) in heap_at.iter().enumerate().take(g.n + 1) {
        lent += lent_delta[t];
        copies += copy_delta[t];
        est.lent_peak = est.lent_peak.max(lent.max(0) as u64);
        est.moved_peak = est
            .moved_peak
            .max((*heap as i128 + lent + copies).max(0) as u64);
    }
    (est.output_bytes > 0).then_some(est)
}

/// A state parameter and the output value (instruction, shape index) it would alias.
type Pair<'a> = (&'a hpb::HloInstructionProto, (i64, Vec<i64>));

/// The module's instructions, who uses each, and their positions in the entry computation's
/// schedule.
struct Schedule<'a> {
    entry: &'a hpb::HloComputationProto,
    in_entry: FxHashSet<i64>,
    by_id: FxHashMap<i64, &'a hpb::HloInstructionProto>,
    by_name: FxHashMap<&'a str, i64>,
    users: FxHashMap<i64, Vec<i64>>,
    /// The entry computation's instructions in schedule order.
    order: Vec<i64>,
    pos: FxHashMap<i64, usize>,
    /// `order.len()`: the position of "returned".
    n: usize,
    root: i64,
    /// The order is the module's schedule (else the entry computation's order).
    scheduled: bool,
}

impl<'a> Schedule<'a> {
    fn of(module: &'a hpb::HloModuleProto) -> Option<Self> {
        let entry = module
            .computations
            .iter()
            .find(|c| c.id == module.entry_computation_id)?;
        let in_entry: FxHashSet<i64> = entry.instructions.iter().map(|i| i.id).collect();
        let mut by_id: FxHashMap<i64, &hpb::HloInstructionProto> = FxHashMap::default();
        let mut by_name: FxHashMap<&str, i64> = FxHashMap::default();
        let mut users: FxHashMap<i64, Vec<i64>> = FxHashMap::default();
        let comps: FxHashMap<i64, &hpb::HloComputationProto> =
            module.computations.iter().map(|c| (c.id, c)).collect();
        for c in &module.computations {
            for i in &c.instructions {
                by_id.insert(i.id, i);
                by_name.insert(i.name.as_str(), i.id);
                for o in &i.operand_ids {
                    users.entry(*o).or_default().push(i.id);
                }
            }
        }

        // Positions: the entry computation's schedule; an instruction of a called computation
        // (fusion, loop body) takes the position of the entry instruction that calls it.
        let sequence = module
            .schedule
            .as_ref()
            .and_then(|s| s.sequences.get(&entry.id))
            .map(|s| s.instruction_ids.clone())
            .filter(|s| !s.is_empty());
        let scheduled = sequence.is_some();
        let order = sequence.unwrap_or_else(|| entry.instructions.iter().map(|i| i.id).collect());
        let n = order.len();
        let mut pos: FxHashMap<i64, usize> = FxHashMap::default();
        for (p, id) in order.iter().enumerate() {
            pos.insert(*id, p);
            let mut stack: Vec<i64> = by_id
                .get(id)
                .map(|i| i.called_computation_ids.clone())
                .unwrap_or_default();
            let mut seen: FxHashSet<i64> = FxHashSet::default();
            while let Some(cid) = stack.pop() {
                if !seen.insert(cid) {
                    continue;
                }
                for i in comps
                    .get(&cid)
                    .map(|c| c.instructions.as_slice())
                    .unwrap_or(&[])
                {
                    pos.entry(i.id).or_insert(p);
                    stack.extend(i.called_computation_ids.iter().copied());
                }
            }
        }
        Some(Schedule {
            entry,
            in_entry,
            by_id,
            by_name,
            users,
            order,
            pos,
            n,
            root: entry.root_id,
            scheduled,
        })
    }

    fn at(&self, id: i64) -> usize {
        self.pos.get(&id).copied().unwrap_or(0)
    }

    /// Last position a value (instruction, shape index) is used at; `n` when it is returned.
    fn last_use(&self, id: i64, index: &[i64]) -> usize {
        let mut end = self.at(id);
        let mut stack: Vec<(i64, Vec<i64>)> = vec![(id, index.to_vec())];
        let mut seen: FxHashSet<(i64, Vec<i64>)> = FxHashSet::default();
        while let Some((v, idx)) = stack.pop() {
            if v == self.root {
                return self.n;
            }
            if !seen.insert((v, idx.clone())) {
                continue;
            }
            for u in self.users.get(&v).map(|x| x.as_slice()).unwrap_or(&[]) {
                let Some(ui) = self.by_id.get(u) else {
                    continue;
                };
                end = end.max(self.at(*u));
                match ui.opcode.as_str() {
                    "get-tuple-element" if idx.first() == Some(&ui.tuple_index) => {
                        stack.push((*u, idx[1..].to_vec()));
                    }
                    "tuple" => {
                        for (k, o) in ui.operand_ids.iter().enumerate() {
                            if *o == v {
                                let mut next = vec![k as i64];
                                next.extend_from_slice(&idx);
                                stack.push((*u, next));
                            }
                        }
                    }
                    "bitcast" | "while" => stack.push((*u, idx.clone())),
                    _ => {}
                }
            }
        }
        end
    }

    /// The instruction and index that define the value an instruction's result (at `index`)
    /// holds: through bitcasts, tuples and get-tuple-element.
    fn source(&self, mut id: i64, mut index: Vec<i64>) -> (i64, Vec<i64>) {
        for _ in 0..64 {
            let Some(i) = self.by_id.get(&id) else { break };
            match i.opcode.as_str() {
                "bitcast" if !i.operand_ids.is_empty() => id = i.operand_ids[0],
                "get-tuple-element" if !i.operand_ids.is_empty() => {
                    index.insert(0, i.tuple_index);
                    id = i.operand_ids[0];
                }
                "tuple" if !index.is_empty() => {
                    let k = index.remove(0) as usize;
                    match i.operand_ids.get(k) {
                        Some(o) => id = *o,
                        None => break,
                    }
                }
                _ => break,
            }
        }
        (id, index)
    }
}

/// The state parameters not donated yet, each with the output it would alias, and the
/// arguments with a parameter donated already. Outputs: the root tuple's elements (or the root
/// itself); those already aliased are taken. None when there is nothing to donate.
fn state_pairs<'a>(
    module: &hpb::HloModuleProto,
    g: &Schedule<'a>,
) -> Option<(Vec<Pair<'a>>, Vec<String>)> {
    let root_i = g.by_id.get(&g.root)?;
    let outputs: Vec<(String, i64)> = match root_i.shape.as_ref() {
        Some(s) if s.element_type == 13 => s
            .tuple_shapes
            .iter()
            .enumerate()
            .map(|(k, t)| (bare(Some(t)), k as i64))
            .collect(),
        s => vec![(bare(s), -1)],
    };
    let mut taken = vec![false; outputs.len()];
    let mut donated: FxHashSet<i64> = FxHashSet::default();
    if let Some(a) = &module.input_output_alias {
        for e in &a.entries {
            donated.insert(e.parameter_number);
            if let Some(k) = e.output_shape_index.first() {
                if let Some(t) = taken.get_mut(*k as usize) {
                    *t = true;
                }
            }
        }
    }
    if let Some(d) = &module.buffer_donor {
        donated.extend(d.entries.iter().map(|e| e.parameter_number));
    }
    let mut params: Vec<&hpb::HloInstructionProto> = g
        .entry
        .instructions
        .iter()
        .filter(|i| i.opcode == "parameter")
        .collect();
    params.sort_by_key(|i| i.parameter_number);
    let mut pairs: Vec<Pair> = Vec::new();
    let mut donated_args: Vec<String> = Vec::new();
    for prm in params {
        let op_name = prm
            .metadata
            .as_ref()
            .map(|m| m.op_name.as_str())
            .unwrap_or("");
        if donated.contains(&prm.parameter_number) {
            let root = arg_root(op_name).to_string();
            if !root.is_empty() && !donated_args.contains(&root) {
                donated_args.push(root);
            }
            continue;
        }
        if !is_leaf_of_tree(op_name) {
            continue;
        }
        let shape = bare(prm.shape.as_ref());
        let Some(k) = (0..outputs.len()).find(|&k| !taken[k] && outputs[k].0 == shape) else {
            continue;
        };
        taken[k] = true;
        let value = if outputs[k].1 < 0 {
            g.source(g.root, Vec::new())
        } else {
            g.source(g.root, vec![outputs[k].1])
        };
        pairs.push((prm, value));
    }
    (!pairs.is_empty()).then_some((pairs, donated_args))
}

/// The allocations of those outputs (of this colour, live out, not parameters).
fn output_allocations(ba: &hpb::BufferAssignmentProto, color: i64, pairs: &[Pair]) -> Vec<usize> {
    let lb: FxHashMap<(i64, Vec<i64>), &hpb::LogicalBufferProto> = ba
        .logical_buffers
        .iter()
        .filter_map(|b| {
            let d = b.defined_at.as_ref()?;
            Some(((d.instruction_id, d.shape_index.clone()), b))
        })
        .collect();
    let mut alloc_of: FxHashMap<i64, usize> = FxHashMap::default();
    for (ai, a) in ba.buffer_allocations.iter().enumerate() {
        for asg in &a.assigned {
            alloc_of.insert(asg.logical_buffer_id, ai);
        }
    }
    let mut allocs: Vec<usize> = Vec::new();
    for (_, value) in pairs {
        let Some(b) = lb.get(value) else { continue };
        let Some(&ai) = alloc_of.get(&b.id) else {
            continue;
        };
        let a = &ba.buffer_allocations[ai];
        if a.color == color
            && a.maybe_live_out
            && !a.is_entry_computation_parameter
            && !allocs.contains(&ai)
        {
            allocs.push(ai);
        }
    }
    allocs
}

/// The largest logical buffer each instruction defines, by instruction id.
fn defined_bytes(ba: &hpb::BufferAssignmentProto) -> FxHashMap<i64, u64> {
    let mut defined_bytes: FxHashMap<i64, u64> = FxHashMap::default();
    for b in &ba.logical_buffers {
        if let Some(d) = b.defined_at.as_ref() {
            let e = defined_bytes.entry(d.instruction_id).or_default();
            *e = (*e).max(b.size.max(0) as u64);
        }
    }
    defined_bytes
}

/// Who else lives in the output allocations: the temporaries lent their memory, counted into
/// `est`, as a change of bytes in use at each position.
fn lent_temporaries(
    est: &mut DonationEstimate,
    g: &Schedule,
    ba: &hpb::BufferAssignmentProto,
    allocs: &[usize],
) -> Vec<i128> {
    let n = g.n;
    let by_lb: FxHashMap<i64, &hpb::LogicalBufferProto> =
        ba.logical_buffers.iter().map(|b| (b.id, b)).collect();
    let mut lent_delta = vec![0i128; n + 2];
    for &ai in allocs {
        let a = &ba.buffer_allocations[ai];
        est.output_bytes = est.output_bytes.saturating_add(a.size.max(0) as u64);
        for asg in &a.assigned {
            let Some(b) = by_lb.get(&asg.logical_buffer_id) else {
                continue;
            };
            let Some(d) = b.defined_at.as_ref() else {
                continue;
            };
            // A value defined inside a called computation stands for its caller's result.
            let end = if g.in_entry.contains(&d.instruction_id) {
                g.last_use(d.instruction_id, &d.shape_index)
            } else {
                let caller = g
                    .order
                    .get(g.at(d.instruction_id))
                    .copied()
                    .unwrap_or(d.instruction_id);
                g.last_use(caller, &[])
            };
            if end >= n {
                continue; // the output itself (or a value colocated with it)
            }
            let size = b.size.max(0) as u64;
            est.lent_buffers += 1;
            est.lent_bytes = est.lent_bytes.saturating_add(size);
            let start = g.at(d.instruction_id);
            lent_delta[start] += size as i128;
            lent_delta[end.max(start) + 1] -= size as i128;
        }
    }
    lent_delta
}

/// Copies: a parameter one of whose readers the update does not depend on; counted into `est`,
/// as a change of bytes in use at each position.
fn copies(
    est: &mut DonationEstimate,
    g: &Schedule,
    pairs: &[Pair],
    param_bytes: &dyn Fn(i64) -> u64,
) -> Vec<i128> {
    let n = g.n;
    let mut copy_delta = vec![0i128; n + 2];
    for (prm, (out, _)) in pairs {
        let mut ancestors: FxHashSet<i64> = FxHashSet::default();
        let mut stack = vec![*out];
        while let Some(x) = stack.pop() {
            for o in g
                .by_id
                .get(&x)
                .map(|i| i.operand_ids.as_slice())
                .unwrap_or(&[])
            {
                if ancestors.insert(*o) {
                    stack.push(*o);
                }
            }
        }
        let mut readers: Vec<i64> = Vec::new();
        let mut frontier = vec![prm.id];
        while let Some(x) = frontier.pop() {
            for u in g.users.get(&x).map(|v| v.as_slice()).unwrap_or(&[]) {
                match g.by_id.get(u).map(|i| i.opcode.as_str()) {
                    Some("bitcast") => frontier.push(*u),
                    _ => readers.push(*u),
                }
            }
        }
        if readers.iter().any(|r| r != out && !ancestors.contains(r)) {
            let size = param_bytes(prm.id);
            est.copies += 1;
            est.copy_bytes = est.copy_bytes.saturating_add(size);
            copy_delta[0] += size as i128;
            copy_delta[g.at(*out).min(n) + 1] -= size as i128;
        }
    }
    copy_delta
}

/// The heap at each position: the most in use during the events of its instructions.
fn heap_at_positions(
    g: &Schedule,
    events: &[hpb::heap_simulator_trace::Event],
    levels: &[u64],
) -> Vec<u64> {
    let mut heap_at = vec![0u64; g.n + 1];
    let mut p = 0usize;
    let mut level = 0u64;
    for (e, after) in events.iter().zip(levels) {
        if let Some(&q) = g
            .by_name
            .get(e.instruction_name.as_str())
            .and_then(|id| g.pos.get(id))
        {
            if q > p {
                for h in heap_at.iter_mut().take(q).skip(p + 1) {
                    *h = level;
                }
                p = q;
                heap_at[p] = heap_at[p].max(level);
            }
        }
        level = *after;
        heap_at[p] = heap_at[p].max(level);
    }
    for h in heap_at.iter_mut().skip(p + 1) {
        *h = level;
    }
    heap_at
}
