//! Why memory was released, read from each release's own stack.
//!
//! PyTorch records a stack on `free_requested` (and `free_completed`, `segment_free`,
//! `segment_unmap`) when history is on. Those frames say what dropped the last reference: the
//! garbage collector, autograd releasing a graph (`SavedVariable::reset_data`,
//! `*Backward0::release_variables`, `deleteNode`) inside backward or because a user line dropped
//! the output, `zero_grad`, the optimizer's step, the autocast weight cache, the allocator's own
//! OOM-retry path (`DeviceCachingAllocator::malloc` releasing cached segments), `empty_cache`, or
//! a plain Python line. Only captures recorded with C++ frames (`stacks="all"`) show the native
//! part; without it the graph cannot be seen, and [`Releases::native_frames`] says so: claims
//! that rest on it stay inferences.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::torch::model::{Action, Snapshot, StackId};
use crate::torch::stacks::{Role, StackIndex};

/// What released one block (or one segment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// Python's cycle collector (`gc_collect`, gcmodule).
    Collector,
    /// Autograd freed saved tensors inside backward (engine thread + graph release frames).
    GraphInBackward,
    /// A graph released without backward: a user line dropped the output that held it.
    GraphDropped,
    /// Freed inside backward, not a saved tensor (gradient temporaries).
    Backward,
    /// `zero_grad` (gradients set to `None`).
    ZeroGrad,
    /// Inside the optimizer's step (`torch/optim`).
    OptimizerStep,
    /// The autocast weight cache cleared (`clear_autocast_cache`, autocast's `__exit__`).
    AutocastCache,
    /// A cached segment released by the allocator's OOM-retry path inside `malloc`.
    OomRetry,
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// A Python line dropped the last reference (`del`, reassignment, end of scope).
    UserLine,
    /// Only native frames, none of the above.
    Native,
    /// No stack recorded.
    NoStack,
}

impl Cause {
    pub const ALL: [Cause; 12] = [
        Cause::Collector,
        Cause::GraphInBackward,
        Cause::GraphDropped,
        Cause::Backward,
        Cause::ZeroGrad,
        Cause::OptimizerStep,
        Cause::AutocastCache,
        Cause::OomRetry,
        Cause::EmptyCache,
        Cause::UserLine,
        Cause::Native,
        Cause::NoStack,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Collector => "garbage collector",
            Cause::GraphInBackward => "autograd graph released in backward",
            Cause::GraphDropped => "autograd graph released by dropping its output",
            Cause::Backward => "backward temporaries",
            Cause::ZeroGrad => "zero_grad",
            Cause::OptimizerStep => "optimizer step",
            Cause::AutocastCache => "autocast weight cache cleared",
            Cause::OomRetry => "allocator OOM retry",
            Cause::EmptyCache => "empty_cache",
            Cause::UserLine => "a Python line",
            Cause::Native => "native code",
            Cause::NoStack => "no stack",
        }
    }

    /// Released by autograd tearing down a graph.
    pub fn is_graph(self) -> bool {
        matches!(self, Cause::GraphInBackward | Cause::GraphDropped)
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// What one stack's frames say about a release.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Flags {
    gc: bool,
    graph: bool,
    engine: bool,
    zero_grad: bool,
    optim: bool,
    autocast: bool,
    malloc: bool,
    empty_cache: bool,
    python: bool,
    native: bool,
    decorated: bool,
    set_data: bool,
    /// The tensor's C++ destructor chain is on the stack: a real free recorded with native
    /// frames, where a graph release would show.
    dealloc: bool,
}

impl Flags {
    fn of_frame(name: &str, file: &str) -> Flags {
        let file_n = file.replace('\\', "/");
        let py = file_n.ends_with(".py");
        Flags {
            gc: name.contains("gc_collect")
                || name.contains("_PyGC_")
                || name.contains("collect_generations")
                || file_n.ends_with("gcmodule.c")
                || file_n.ends_with("gc.c") && name.contains("collect"),
            graph: name.contains("SavedVariable::reset_data")
                || name.contains("::release_variables")
                || name.contains("autograd::deleteNode"),
            engine: name.contains("torch::autograd::Engine::")
                || name.contains("PythonEngine::")
                || py && name == "_engine_run_backward",
            zero_grad: py && name == "zero_grad",
            optim: py && file_n.contains("torch/optim/"),
            autocast: name.contains("clear_autocast_cache")
                || name.contains("autocast::clear_cache")
                || py && name == "__exit__" && file_n.contains("autocast_mode"),
            malloc: name.contains("DeviceCachingAllocator::malloc"),
            empty_cache: name.contains("emptyCache") || py && name == "empty_cache",
            python: py,
            native: name.contains("::"),
            decorated: py
                && name == "decorate_context"
                && file_n.contains("torch/utils/_contextlib"),
            set_data: name.contains("VariableHooks::set_data")
                || name.contains("THPVariable_set_data"),
            dealloc: name.contains("DeviceCachingAllocator::free")
                || name.contains("~TensorImpl")
                || name.contains("~StorageImpl")
                || name.contains("local_raw_delete"),
        }
    }

    fn merge(&mut self, o: Flags) {
        self.gc |= o.gc;
        self.graph |= o.graph;
        self.engine |= o.engine;
        self.zero_grad |= o.zero_grad;
        self.optim |= o.optim;
        self.autocast |= o.autocast;
        self.malloc |= o.malloc;
        self.empty_cache |= o.empty_cache;
        self.python |= o.python;
        self.native |= o.native;
        self.decorated |= o.decorated;
        self.set_data |= o.set_data;
        self.dealloc |= o.dealloc;
    }

    /// The cause of a release with these frames (most specific first).
    fn cause(self, segment: bool) -> Cause {
        if self.gc {
            Cause::Collector
        } else if segment && self.malloc {
            Cause::OomRetry
        } else if segment && self.empty_cache {
            Cause::EmptyCache
        } else if self.autocast {
            Cause::AutocastCache
        } else if self.zero_grad {
            Cause::ZeroGrad
        } else if self.optim {
            Cause::OptimizerStep
        } else if self.engine && self.graph {
            Cause::GraphInBackward
        } else if self.engine {
            Cause::Backward
        } else if self.graph {
            Cause::GraphDropped
        } else if self.python {
            Cause::UserLine
        } else if self.native {
            Cause::Native
        } else {
            Cause::NoStack
        }
    }
}

/// Count and bytes of releases of one cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub count: u64,
    pub bytes: u64,
}

impl Tally {
    fn add(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes = self.bytes.saturating_add(bytes);
    }
}

/// Tallies per cause.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ByCause([Tally; 12]);

impl ByCause {
    pub fn get(&self, c: Cause) -> Tally {
        self.0[c.slot()]
    }
    fn add(&mut self, c: Cause, bytes: u64) {
        self.0[c.slot()].add(bytes);
    }
    /// Add `other`'s tallies (saturating, like [`ByCause::add`], so the order of adding does
    /// not matter).
    fn merge(&mut self, other: &ByCause) {
        for (t, o) in self.0.iter_mut().zip(other.0.iter()) {
            t.count += o.count;
            t.bytes = t.bytes.saturating_add(o.bytes);
        }
    }
    /// Causes with at least one release, bytes descending.
    pub fn nonzero(&self) -> Vec<(Cause, Tally)> {
        let mut v: Vec<_> = Cause::ALL
            .iter()
            .map(|&c| (c, self.get(c)))
            .filter(|(_, t)| t.count > 0)
            .collect();
        v.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
        v
    }
    pub fn total(&self) -> Tally {
        self.0.iter().fold(Tally::default(), |mut t, x| {
            t.count += x.count;
            t.bytes = t.bytes.saturating_add(x.bytes);
            t
        })
    }
}

/// Cached segments the allocator released inside `malloc` to retry a failed cudaMalloc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomRetry {
    /// Trace index of the first segment release of the episode.
    pub index: u64,
    pub segments: u64,
    pub bytes: u64,
    /// The allocation that followed (the request that triggered the retry), when recorded.
    /// `(trace index, size, stack)`.
    pub request: Option<(u64, u64, Option<StackId>)>,
}

/// Releases of one device trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceReleases {
    pub device: i64,
    /// Block releases (`free_requested`; `free_completed` where a trace has no requests).
    pub blocks: ByCause,
    /// Segment releases (`segment_free`, `segment_unmap`).
    pub segments: ByCause,
    /// OOM-retry episodes (consecutive segment releases from `malloc`), oldest first.
    pub oom_retries: Vec<OomRetry>,
}

/// Whether the capture shows an autograd graph, and what happened to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphSeen {
    /// Backward ran in the trace (engine frames on frees).
    Backward,
    /// Graphs were released only by dropping outputs: a grad-enabled forward with no backward.
    DroppedWithoutBackward,
    /// Native frames are recorded on the frees and none releases a graph: no graph was built
    /// (or none was released in the window).
    None,
    /// The frees carry no native frames: a graph cannot be seen either way.
    Unknown,
}

/// Every release of a snapshot, classified.
#[derive(Clone, Debug, PartialEq)]
pub struct Releases {
    pub devices: Vec<DeviceReleases>,
    /// Some block release stack has the tensor's C++ destructor chain (`~TensorImpl`,
    /// `DeviceCachingAllocator::free`): graph releases would show.
    pub native_frames: bool,
    /// Allocation bytes in the trace whose stack passes `decorate_context` (a `no_grad` /
    /// `inference_mode` / `enable_grad` decorator), and all allocation bytes.
    pub decorated_alloc_bytes: u64,
    pub alloc_bytes: u64,
    /// Per stack id: the flags (computed once; stacks are interned).
    flags: Vec<Flags>,
    /// The walks of [`Releases::held_at_roles`] and [`graph_drops_held_at`], per device and
    /// index: several detectors and the summary ask about the same peak.
    held: crate::torch::memo::Memo<(i64, u64), HeldWalk>,
}

/// What one walk of a device's trace says about one index, for every role at once.
#[derive(Debug)]
struct HeldWalk {
    /// Released after the index, by the role the block was made with ([`Role::slot`]), and
    /// blocks made before the trace (the last slot).
    released: [ByCause; ROLES + 1],
    /// Live at the index and at the end, by role.
    kept: [Tally; ROLES],
    /// [`graph_drops_held_at`].
    graph_drops: Vec<u64>,
}

const ROLES: usize = Role::ALL.len();

/// Bytes live at one trace index, split by what later released them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldAt {
    pub released: ByCause,
    /// Live at the index and still live at the end of the trace.
    pub kept: Tally,
}

impl Releases {
    /// Classify every release of every device trace.
    pub fn compute(snap: &Snapshot) -> Releases {
        let frame_flags: Vec<Flags> = snap
            .frames
            .iter()
            .map(|f| Flags::of_frame(&f.name, &f.filename))
            .collect();
        let flags: Vec<Flags> = snap
            .stacks
            .iter()
            .map(|s| {
                let mut fl = Flags::default();
                for &f in s {
                    if let Some(x) = frame_flags.get(f as usize) {
                        fl.merge(*x);
                    }
                }
                fl
            })
            .collect();
        let mut out = Releases {
            devices: Vec::new(),
            native_frames: false,
            decorated_alloc_bytes: 0,
            alloc_bytes: 0,
            flags,
            held: Default::default(),
        };
        let Some(traces) = &snap.device_traces else {
            return out;
        };
        for (d, list) in traces.iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            let requests = list.iter().any(|e| e.action == Action::FreeRequested);
            let mut dr = DeviceReleases {
                device: d as i64,
                ..DeviceReleases::default()
            };
            let mut open: Option<OomRetry> = None;
            for (i, e) in list.iter().enumerate() {
                match e.action {
                    Action::Alloc => {
                        out.alloc_bytes = out.alloc_bytes.saturating_add(e.size);
                        if out.flags_of(e.stack()).decorated {
                            out.decorated_alloc_bytes =
                                out.decorated_alloc_bytes.saturating_add(e.size);
                        }
                        if let Some(mut r) = open.take() {
                            r.request = Some((i as u64, e.size, e.stack()));
                            dr.oom_retries.push(r);
                        }
                    }
                    Action::FreeRequested | Action::FreeCompleted
                        if (e.action == Action::FreeRequested) == requests =>
                    {
                        let fl = out.flags_of(e.stack());
                        out.native_frames |= fl.dealloc;
                        dr.blocks.add(fl.cause(false), e.size);
                    }
                    Action::SegmentFree | Action::SegmentUnmap => {
                        let fl = out.flags_of(e.stack());
                        let c = fl.cause(true);
                        dr.segments.add(c, e.size);
                        if c == Cause::OomRetry {
                            let r = open.get_or_insert(OomRetry {
                                index: i as u64,
                                segments: 0,
                                bytes: 0,
                                request: None,
                            });
                            r.segments += 1;
                            r.bytes = r.bytes.saturating_add(e.size);
                        }
                    }
                    Action::Oom => {
                        if let Some(r) = open.take() {
                            dr.oom_retries.push(r);
                        }
                    }
                    _ => {}
                }
            }
            dr.oom_retries.extend(open);
            out.devices.push(dr);
        }
        out
    }

    fn flags_of(&self, stack: Option<StackId>) -> Flags {
        stack
            .and_then(|s| self.flags.get(s as usize).copied())
            .unwrap_or_default()
    }

    /// The release ran inside `tensor.data = …` (the old storage replaced).
    pub fn sets_data(&self, stack: Option<StackId>) -> bool {
        self.flags_of(stack).set_data
    }

    /// What released a block whose release stack is `stack`.
    pub fn cause(&self, stack: Option<StackId>) -> Cause {
        self.flags_of(stack).cause(false)
    }

    pub fn device(&self, d: i64) -> Option<&DeviceReleases> {
        self.devices.iter().find(|r| r.device == d)
    }

    /// Block releases of every device.
    pub fn blocks(&self) -> ByCause {
        let mut all = ByCause::default();
        for d in &self.devices {
            for (i, t) in d.blocks.0.iter().enumerate() {
                all.0[i].count += t.count;
                all.0[i].bytes = all.0[i].bytes.saturating_add(t.bytes);
            }
        }
        all
    }

    /// What the capture says about autograd graphs.
    pub fn graph(&self) -> GraphSeen {
        let b = self.blocks();
        if b.get(Cause::GraphInBackward).count + b.get(Cause::Backward).count > 0 {
            GraphSeen::Backward
        } else if b.get(Cause::GraphDropped).count > 0 {
            GraphSeen::DroppedWithoutBackward
        } else if self.native_frames {
            GraphSeen::None
        } else {
            GraphSeen::Unknown
        }
    }

    /// Blocks live just before entry `index` of `device`'s trace, by what released them later;
    /// `role` keeps only blocks whose allocation stack has that role (blocks allocated before
    /// the trace have no stack and count only when `role` is `None`).
    pub fn held_at(
        &self,
        snap: &Snapshot,
        stacks: &StackIndex,
        device: i64,
        index: u64,
        role: Option<Role>,
    ) -> HeldAt {
        self.held_at_roles(snap, stacks, device, index, &[role])
            .pop()
            .unwrap_or_default()
    }

    /// [`Releases::held_at`] for several roles, in the order given (one walk of the trace per
    /// device and index, shared by every caller).
    pub fn held_at_roles(
        &self,
        snap: &Snapshot,
        stacks: &StackIndex,
        device: i64,
        index: u64,
        roles: &[Option<Role>],
    ) -> Vec<HeldAt> {
        let w = self.held_walk(snap, stacks, device, index);
        roles
            .iter()
            .map(|role| match role {
                // Every block: each role's and those made before the trace.
                None => HeldAt {
                    released: w.released.iter().fold(ByCause::default(), |mut t, x| {
                        t.merge(x);
                        t
                    }),
                    kept: w.kept.iter().fold(Tally::default(), |t, x| Tally {
                        count: t.count + x.count,
                        bytes: t.bytes.wrapping_add(x.bytes),
                    }),
                },
                Some(r) => HeldAt {
                    released: w.released[r.slot()].clone(),
                    kept: w.kept[r.slot()],
                },
            })
            .collect()
    }

    /// What released the blocks allocated at the entries `allocs` of `device`'s trace: each
    /// block's first release from entry `index` on (the event [`Releases::held_at`] reads),
    /// classified by its stack. Blocks not released after `index` are not counted.
    pub fn released_after(
        &self,
        snap: &Snapshot,
        device: i64,
        index: u64,
        allocs: &[usize],
    ) -> ByCause {
        let list = snap.trace(device);
        let free = release_action(list);
        let mut want: FxHashSet<u64> = allocs
            .iter()
            .filter_map(|&i| list.get(i))
            .map(|e| e.addr)
            .collect();
        let mut out = ByCause::default();
        for e in list
            .iter()
            .skip(usize::try_from(index).unwrap_or(usize::MAX))
        {
            if want.is_empty() {
                break;
            }
            if e.action == free && want.remove(&e.addr) {
                out.add(self.cause(e.stack()), e.size);
            }
        }
        out
    }

    /// The walk of `device` at `index`, from the memo. Roles come from the snapshot's frames
    /// alone (not the frame filter), so any `StackIndex` of this snapshot gives the same walk.
    fn held_walk(
        &self,
        snap: &Snapshot,
        stacks: &StackIndex,
        device: i64,
        index: u64,
    ) -> std::sync::Arc<HeldWalk> {
        self.held.get_or((device, index), || {
            self.walk_held(snap, stacks, device, index)
        })
    }

    /// The one walk: blocks live just before `index` and what released them, by the role they
    /// were made with, and the graph drops after it.
    fn walk_held(&self, snap: &Snapshot, stacks: &StackIndex, device: i64, index: u64) -> HeldWalk {
        let list = snap.trace(device);
        let free = release_action(list);
        // address → alloc index (its role and size are read from the trace when needed: the
        // map stays small per entry, and on a trace that frees little it holds every block)
        let mut live: FxHashMap<u64, u64> = FxHashMap::default();
        let role_of = |at: u64| stacks.role(list[at as usize].stack());
        let mut out = HeldWalk {
            released: Default::default(),
            kept: [Tally::default(); ROLES],
            graph_drops: Vec::new(),
        };
        let mut in_drop = false;
        for (i, e) in list.iter().enumerate() {
            let i = i as u64;
            if e.action == Action::Alloc {
                live.insert(e.addr, i);
                in_drop = false;
            } else if e.action == free {
                let made = live.remove(&e.addr);
                let cause = self.cause(e.stack());
                // Made before the index (or before the trace) and released after it.
                if i >= index && made.is_none_or(|m| m < index) {
                    let slot = made.map_or(ROLES, |m| role_of(m).slot());
                    out.released[slot].add(cause, e.size);
                }
                // Consecutive graph-release frees with no allocation between them: one drop.
                if cause != Cause::GraphDropped {
                    continue;
                }
                if !in_drop {
                    in_drop = true;
                    if i >= index {
                        out.graph_drops.push(0);
                    }
                }
                if i >= index
                    && made.is_none_or(|m| m < index)
                    && let Some(last) = out.graph_drops.last_mut()
                {
                    *last = last.saturating_add(e.size);
                }
            }
        }
        out.graph_drops.retain(|b| *b > 0);
        // Live at the index and never freed in the trace: marked, then read in trace order.
        let mut kept = vec![0u64; (index as usize).min(list.len()).div_ceil(64)];
        for at in live.into_values() {
            if at < index {
                kept[at as usize / 64] |= 1 << (at % 64);
            }
        }
        for (w, &bits) in kept.iter().enumerate() {
            let mut b = bits;
            while b != 0 {
                let at = w * 64 + b.trailing_zeros() as usize;
                b &= b - 1;
                let e = &list[at];
                let k = &mut out.kept[stacks.role(e.stack()).slot()];
                k.count += 1;
                k.bytes = k.bytes.wrapping_add(e.size);
            }
        }
        out
    }
}

/// The event whose stack says why a block was released: `free_requested` (the program's line
/// that dropped it) where the trace records it, else `free_completed`.
fn release_action(list: &[crate::torch::model::TraceEntry]) -> Action {
    if list.iter().any(|e| e.action == Action::FreeRequested) {
        Action::FreeRequested
    } else {
        Action::FreeCompleted
    }
}

/// Bytes live just before entry `index` of `device`'s trace that later drops of a graph release
/// (a graph freed because its output was dropped), one number per drop: consecutive
/// graph-release frees with no allocation between them are one drop. Two drops holding bytes
/// at one index mean two graphs were alive at once (the previous iteration's output still
/// referenced while the next forward built its own).
pub fn graph_drops_held_at(
    snap: &Snapshot,
    r: &Releases,
    stacks: &StackIndex,
    device: i64,
    index: u64,
) -> Vec<u64> {
    r.held_walk(snap, stacks, device, index).graph_drops.clone()
}

/// Where the step that peaks at entry `index` of `device`'s trace began: the first allocation
/// after the last release by `zero_grad` or the optimizer's step before `index` (the previous
/// step's end), with the µs from it to `index` when the trace has times. `None` when no such
/// release precedes `index`.
pub fn step_start_before(
    snap: &Snapshot,
    r: &Releases,
    device: i64,
    index: u64,
) -> Option<(u64, Option<i64>)> {
    let list = snap.trace(device);
    let end = (index as usize).min(list.len());
    let last = list[..end].iter().rposition(|e| {
        matches!(e.action, Action::FreeRequested | Action::FreeCompleted)
            && matches!(r.cause(e.stack()), Cause::ZeroGrad | Cause::OptimizerStep)
    })?;
    let start = (last + 1..end).find(|&i| list[i].action == Action::Alloc)?;
    let us = match (
        list[start].time_us(),
        list.get(end).and_then(|e| e.time_us()),
    ) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    Some((start as u64, us))
}

/// Block releases in entries `start..=end` of `device`'s trace whose stack goes through the
/// garbage collector.
pub fn collector_frees(snap: &Snapshot, r: &Releases, device: i64, start: u64, end: u64) -> u64 {
    let list = snap.trace(device);
    let (s, e) = (
        start as usize,
        (end as usize).min(list.len().saturating_sub(1)),
    );
    // A run counts `free_completed`; the stack may sit on those or on their requests.
    let count = |a: Action| {
        list.get(s..=e).map_or(0, |run| {
            run.iter()
                .filter(|x| x.action == a && r.cause(x.stack()) == Cause::Collector)
                .count() as u64
        })
    };
    count(Action::FreeCompleted).max(count(Action::FreeRequested))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_classified_by_its_most_specific_frame() {
        let c = |frames: &[(&str, &str)], seg: bool| {
            let mut f = Flags::default();
            for (n, file) in frames {
                f.merge(Flags::of_frame(n, file));
            }
            f.cause(seg)
        };
        let dealloc = ("THPVariable_dealloc(_object*)", "python_variable.cpp");
        let user = ("forward", "/home/u/model.py");
        assert_eq!(c(&[dealloc, user], false), Cause::UserLine);
        assert_eq!(
            c(
                &[
                    ("torch::autograd::SavedVariable::reset_data()", "??"),
                    ("torch::autograd::deleteNode(torch::autograd::Node*)", "??"),
                    dealloc,
                    user
                ],
                false
            ),
            Cause::GraphDropped
        );
        assert_eq!(
            c(
                &[
                    (
                        "torch::autograd::generated::MulBackward0::release_variables()",
                        ""
                    ),
                    (
                        "torch::autograd::Engine::evaluate_function(...)",
                        "engine.cpp"
                    ),
                ],
                false
            ),
            Cause::GraphInBackward
        );
        assert_eq!(
            c(
                &[("torch::autograd::Engine::thread_main(...)", "engine.cpp")],
                false
            ),
            Cause::Backward
        );
        let retry = (
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, CUstream_st*)",
            "CUDACachingAllocator.cpp",
        );
        assert_eq!(c(&[retry, user], true), Cause::OomRetry);
        assert_eq!(
            c(&[retry, user], false),
            Cause::UserLine,
            "a block free is never the retry"
        );
        assert_eq!(
            c(&[("empty_cache", "/x/torch/cuda/memory.py"), user], true),
            Cause::EmptyCache
        );
        assert_eq!(
            c(&[("gc_collect_main", "gcmodule.c"), user], false),
            Cause::Collector
        );
        assert_eq!(
            c(&[("zero_grad", "/x/torch/optim/optimizer.py"), user], false),
            Cause::ZeroGrad
        );
        assert_eq!(
            c(&[("step", "/x/torch/optim/adamw.py"), user], false),
            Cause::OptimizerStep
        );
        assert_eq!(
            c(&[("at::autocast::clear_cache()", "")], false),
            Cause::AutocastCache
        );
        assert_eq!(
            c(&[("c10::TensorImpl::~TensorImpl()", "")], false),
            Cause::Native
        );
        assert_eq!(c(&[], false), Cause::NoStack);
    }

    /// Four batches of ten frees, each releasing blocks made over the whole trace, with the given
    /// frames on every free stack: what PT007 is asked about.
    fn batched(free_frames: &[(&str, u64, &str)]) -> Vec<crate::findings::Code> {
        use crate::torch::model::TraceEntry;
        use crate::torch::stacks::tests::intern;
        let mut snap = Snapshot::default();
        let act = intern(
            &mut snap,
            &[
                (
                    "/v/site-packages/torch/nn/modules/linear.py",
                    125,
                    "forward",
                ),
                ("/u/model.py", 30, "forward"),
            ],
        );
        let free = intern(&mut snap, free_frames);
        let mut list = Vec::new();
        for k in 0..40u64 {
            list.push(
                TraceEntry::new(Action::Alloc, 0x1000 * (k + 1), 1 << 20, 0).with_stack(Some(act)),
            );
        }
        for burst in 0..4u64 {
            for j in 0..10u64 {
                let addr = 0x1000 * (burst + 4 * j + 1);
                for a in [Action::FreeRequested, Action::FreeCompleted] {
                    list.push(TraceEntry::new(a, addr, 1 << 20, 0).with_stack(Some(free)));
                }
            }
            list.push(
                TraceEntry::new(Action::Alloc, 0x100_0000 + burst, 512, 0).with_stack(Some(act)),
            );
        }
        snap.device_traces = Some(vec![list]);
        let a = crate::torch::analyse(&snap, &crate::options::AnalysisOptions::default());
        a.findings.iter().map(|f| f.code).collect()
    }

    #[test]
    fn batched_frees_are_a_reference_cycle_only_with_the_collector_on_their_stacks() {
        use crate::findings::Code;
        // The autocast cache cleared at __exit__: batched, repeated, and not a cycle.
        let autocast = batched(&[
            (
                "/v/site-packages/torch/amp/autocast_mode.py",
                400,
                "__exit__",
            ),
            ("/u/run.py", 12, "main"),
        ]);
        assert!(!autocast.contains(&Code::PT007), "{autocast:?}");
        // A dropped graph's release: not a cycle either.
        let graph = batched(&[
            (
                "torch::autograd::SavedVariable::reset_data()",
                0,
                "torch::autograd::SavedVariable::reset_data()",
            ),
            ("/u/run.py", 12, "main"),
        ]);
        assert!(!graph.contains(&Code::PT007), "{graph:?}");
        // The same batches freed by the cyclic collector are.
        let gc = batched(&[
            ("gcmodule.c", 0, "gc_collect_main"),
            ("/u/run.py", 12, "main"),
        ]);
        assert!(gc.contains(&Code::PT007), "{gc:?}");
    }
}
