//! Frame and stack interning, and trace-entry storage, for the snapshot loader.
//!
//! PyTorch shares frame dicts between stacks but gives every `alloc` and `free_requested` trace
//! entry a fresh frames list, so a large snapshot holds millions of lists whose content repeats.
//! Each is reduced to a [`StackId`] by content. Looking a stack up by content touches a table far
//! larger than the CPU caches, so while the pickle VM decodes, that work — and storing the
//! entries — runs on a worker thread ([`Pipeline`]): the decoding thread only resolves frame
//! objects it has not seen yet (the tree lives there), numbers the lists and hands over their
//! frame objects and the entries; the worker interns the stacks, keeps each device's entries and,
//! at [`Pipeline::finish`], replaces list numbers by stack ids. A list filled by the same bytes as
//! an earlier one becomes an alias of it ([`Pipeline::known_run`]), checked byte for byte on the
//! worker; once a run is known, a list that starts with the same bytes is recognised without
//! scanning its run first ([`Pipeline::known_run_at`], compared byte for byte on the decoding
//! thread). With one core, or a small file, the same work runs inline.

use std::collections::VecDeque;
use std::sync::mpsc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::pickle::{Tree, Val};
use crate::torch::model::{Action, Frame, FrameId, StackId, TraceEntry};

/// Frames and stacks interned by object identity first (PyTorch shares them), then by content.
#[derive(Default)]
pub(crate) struct Interner {
    pub(crate) frames: Vec<Frame>,
    /// Frame ids by the hash of their content ([`frame_hash`]); frames whose hashes collide
    /// are chained through `same_hash`. Looked up with borrowed strings: no allocation for a
    /// frame seen before.
    frame_by_hash: FxHashMap<u64, FrameId>,
    same_hash: Vec<FrameId>,
    /// Frames of unshared frame dicts by the objects of their name, filename and line (shared
    /// even where the dicts are not), so equal frames are looked up without building strings.
    frame_by_vals: FxHashMap<[Val; 3], FrameId>,
    /// Key objects of frame dicts seen last, with the field each names (0 name, 1 filename,
    /// 2 line, 3 other).
    frame_keys: Vec<(Val, u8)>,
    /// The key objects of the last frame dict whose three items named the three fields, in its
    /// order, with the field each names: a dict with the same keys in the same order (every
    /// dict of a pickled frames list) takes its fields without looking each key up.
    frame_order: Option<([Val; 3], [u8; 3])>,
    /// Stack tables: on the worker while a pipeline runs, here before and after.
    pub(crate) table: StackTable,
    stack_by_val: FxHashMap<Val, Option<StackId>>,
    /// Trace action names memlsp does not know ([`Action::Other`] indexes them).
    pub(crate) other_actions: Vec<String>,
}

impl Interner {
    /// The action an action string names; unknown names are numbered in order of appearance.
    pub(crate) fn action(&mut self, s: &str) -> Action {
        if let Some(a) = Action::known(s) {
            return a;
        }
        if let Some(i) = self.other_actions.iter().position(|n| n == s) {
            return Action::Other(i as u8);
        }
        if self.other_actions.len() < u8::MAX as usize {
            self.other_actions.push(s.to_string());
            return Action::Other((self.other_actions.len() - 1) as u8);
        }
        // The 255th and later distinct unknown names share one slot.
        if self.other_actions.len() == u8::MAX as usize {
            self.other_actions.push("(other actions)".to_string());
        }
        Action::Other(u8::MAX)
    }

    /// Intern a frames list (a tree value). `None` for an empty list.
    pub(crate) fn stack(&mut self, t: &Tree<'_>, list: Val) -> Result<Option<StackId>, String> {
        if let Some(&s) = self.stack_by_val.get(&list) {
            return Ok(s);
        }
        let items = t.items(list);
        if items.is_empty() && !t.is_seq(list) {
            return Err(format!(
                "a `frames` value is {}, expected a list",
                t.describe(list)
            ));
        }
        for &f in items {
            if self.table.frame_of(f).is_none() {
                let id = self.frame_content(t, f)?;
                self.table.set_frame(f, id);
            }
        }
        let id = self.table.intern(None, items);
        self.stack_by_val.insert(list, id);
        Ok(id)
    }

    /// The frame id of a frame object by its content (`{name, filename, line}` dict, or a plain
    /// string naming a function).
    fn frame_content(&mut self, t: &Tree<'_>, f: Val) -> Result<FrameId, String> {
        if let Some(id) = t.sunk_dict(f) {
            // A frame dict first seen in a trace entry's frames list: already a frame id.
            return Ok(id);
        }
        if t.is_dict(f) {
            // Once per frame object: its items as the sink would have been given them.
            let pairs: Vec<Val> = t.pairs(f).flat_map(|(k, v)| [k, v]).collect();
            self.frame_of_pairs(t, None, &pairs)
        } else if let Some(s) = t.str(f) {
            // `forward_frames`-style plain strings.
            self.intern_frame(s, "", 0)
        } else {
            Err(format!(
                "a stack frame is {}, expected a dict",
                t.describe(f)
            ))
        }
    }

    /// The frame id of a frame dict of a frames list, from its items `[key, value, …]`
    /// ([`crate::pickle::Sink::sequence_dict`]); `prev`: its id for the items it got before.
    pub(crate) fn frame_of_pairs(
        &mut self,
        t: &Tree<'_>,
        prev: Option<FrameId>,
        pairs: &[Val],
    ) -> Result<FrameId, String> {
        let mut fields = [None; 3];
        match (self.frame_order, pairs) {
            (Some((keys, slots)), &[k0, v0, k1, v1, k2, v2]) if [k0, k1, k2] == keys => {
                for (slot, v) in slots.into_iter().zip([v0, v1, v2]) {
                    if let Some(f) = fields.get_mut(slot as usize) {
                        *f = Some(v);
                    }
                }
            }
            _ => self.fields_of_pairs(t, pairs, &mut fields),
        }
        self.frame_of_fields(t, prev, fields)
    }

    /// The fields of a frame dict's items, each key looked up (and remembered) in `frame_keys`;
    /// three items naming the three fields become the order [`Self::frame_of_pairs`] tries first.
    fn fields_of_pairs(&mut self, t: &Tree<'_>, pairs: &[Val], fields: &mut [Option<Val>; 3]) {
        let mut order = ([Val::NONE; 3], [3u8; 3]);
        for (i, p) in pairs.chunks_exact(2).enumerate() {
            let slot = match self.frame_keys.iter().find(|(k, _)| *k == p[0]) {
                Some(&(_, slot)) => slot,
                None => {
                    let slot = match t.str(p[0]) {
                        Some("name") => 0,
                        Some("filename") => 1,
                        Some("line") => 2,
                        _ => 3,
                    };
                    if self.frame_keys.len() >= 8 {
                        self.frame_keys.remove(0);
                    }
                    self.frame_keys.push((p[0], slot));
                    slot
                }
            };
            if let Some(f) = fields.get_mut(slot as usize) {
                *f = Some(p[1]);
            }
            if let (Some(k), Some(s)) = (order.0.get_mut(i), order.1.get_mut(i)) {
                (*k, *s) = (p[0], slot);
            }
        }
        let mut fields_named = order.1;
        fields_named.sort_unstable();
        if pairs.len() == 6 && fields_named == [0, 1, 2] {
            self.frame_order = Some(order);
        }
    }

    /// The frame id of a frame dict's fields (name, filename, line); `prev` as for
    /// [`Self::frame_of_pairs`].
    fn frame_of_fields(
        &mut self,
        t: &Tree<'_>,
        prev: Option<FrameId>,
        fields: [Option<Val>; 3],
    ) -> Result<FrameId, String> {
        let key = fields.map(|f| f.unwrap_or(Val::NONE));
        if prev.is_none()
            && let Some(&id) = self.frame_by_vals.get(&key)
        {
            return Ok(id);
        }
        let text = |i: usize| fields[i].map(|v| t.str(v).unwrap_or(""));
        let line = fields[2].map(|v| line_of(t, v));
        let known = self.frames.len();
        let id = match prev.and_then(|p| self.frames.get(p as usize)) {
            // More items for a dict filled in several batches: the fields they do not name
            // keep what the earlier items said.
            Some(f) => {
                let name = text(0).unwrap_or(&f.name).to_owned();
                let filename = text(1).unwrap_or(&f.filename).to_owned();
                let line = line.unwrap_or(f.line);
                self.intern_frame(&name, &filename, line)?
            }
            None => self.intern_frame(
                text(0).unwrap_or(""),
                text(1).unwrap_or(""),
                line.unwrap_or(0),
            )?,
        };
        // Remembered for new frames only (objects that repeat make few; where every frame has
        // objects of its own, remembering them would cost a map entry per frame), and bounded.
        if prev.is_none() && id as usize >= known && self.frame_by_vals.len() < FRAME_BY_VALS_MAX {
            self.frame_by_vals.insert(key, id);
        }
        Ok(id)
    }

    /// The id of the frame with this content, added if new.
    fn intern_frame(&mut self, name: &str, filename: &str, line: u64) -> Result<FrameId, String> {
        let h = frame_hash(name, filename, line);
        let mut at = self.frame_by_hash.get(&h).copied();
        while let Some(id) = at {
            let f = &self.frames[id as usize];
            if f.line == line && f.name == name && f.filename == filename {
                return Ok(id);
            }
            at = Some(self.same_hash[id as usize]).filter(|&n| n != u32::MAX);
        }
        let id = u32::try_from(self.frames.len())
            .ok()
            .filter(|&id| id != u32::MAX)
            .ok_or_else(|| "more than 2^32 - 1 distinct frames".to_string())?;
        self.frames.push(Frame {
            name: name.to_string(),
            filename: filename.to_string(),
            line,
        });
        // The new frame heads its hash's chain.
        let next = self.frame_by_hash.insert(h, id).unwrap_or(u32::MAX);
        self.same_hash.push(next);
        Ok(id)
    }
}

/// Most frames [`Interner::frame_by_vals`] remembers.
const FRAME_BY_VALS_MAX: usize = 1 << 20;

fn frame_hash(name: &str, filename: &str, line: u64) -> u64 {
    use std::hash::BuildHasher;
    rustc_hash::FxBuildHasher.hash_one((name, filename, line))
}

/// A frame's line as recorded: an int, 0 for anything else or a negative one.
fn line_of(t: &Tree<'_>, v: Val) -> u64 {
    t.int128(v)
        .map_or(0, |i| u64::try_from(i.max(0)).unwrap_or(u64::MAX))
}

/// Frame objects → frame ids, and stacks by content.
#[derive(Default)]
pub(crate) struct StackTable {
    pub(crate) stacks: Vec<Vec<FrameId>>,
    by_content: FxHashMap<Vec<FrameId>, StackId>,
    /// Frame id by arena node id of the frame object (`u32::MAX`: not known).
    frame_by_node: Vec<FrameId>,
    /// Frame objects that are not arena nodes (inline strings).
    frame_by_val: FxHashMap<Val, FrameId>,
    /// Scratch for the frame ids of the stack being interned.
    ids: Vec<FrameId>,
    /// Set when more than 2^32 - 1 distinct stacks were seen.
    overflow: bool,
}

impl StackTable {
    #[inline]
    fn frame_of(&self, f: Val) -> Option<FrameId> {
        if let Some(id) = f.sunk_dict_id() {
            return Some(id);
        }
        match f.node_id() {
            Some(n) => self
                .frame_by_node
                .get(n as usize)
                .copied()
                .filter(|&id| id != u32::MAX),
            None => self.frame_by_val.get(&f).copied(),
        }
    }

    fn set_frame(&mut self, f: Val, id: FrameId) {
        match f.node_id() {
            Some(n) => {
                let n = n as usize;
                if self.frame_by_node.len() <= n {
                    self.frame_by_node.resize(n + 1, u32::MAX);
                }
                self.frame_by_node[n] = id;
            }
            None => {
                self.frame_by_val.insert(f, id);
            }
        }
    }

    /// Intern the stack `prefix` + `items`; every item's frame must be known. `None` when the
    /// stack is empty (or on overflow, which [`StackTable::overflow`] records).
    fn intern(&mut self, prefix: Option<StackId>, items: &[Val]) -> Option<StackId> {
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        if let Some(p) = prefix.and_then(|p| self.stacks.get(p as usize)) {
            ids.extend_from_slice(p);
        }
        ids.extend(items.iter().map(|&f| self.frame_of(f).unwrap_or(u32::MAX)));
        let id = if ids.is_empty() {
            None
        } else if let Some(&id) = self.by_content.get(ids.as_slice()) {
            Some(id)
        } else {
            match u32::try_from(self.stacks.len())
                .ok()
                .filter(|&i| i != u32::MAX)
            {
                Some(id) => {
                    self.stacks.push(ids.clone());
                    self.by_content.insert(ids.clone(), id);
                    Some(id)
                }
                None => {
                    self.overflow = true;
                    None
                }
            }
        };
        self.ids = ids;
        id
    }
}

/// Per device list: its entries (oldest first) and how many older ones were dropped.
pub(crate) type TraceLists = Vec<(Vec<TraceEntry>, u64)>;

/// What the decoding thread hands over, in order.
enum Msg {
    /// A frame object and its id (sent before the first list that contains it).
    Frame(Val, FrameId),
    /// Items of list number `list` (appended to its stack when it already has one: lists over
    /// 1000 items arrive in several batches); its `len` frame objects follow in `Batch::items`.
    List { list: u32, len: u32 },
    /// List number `list` has the content list number `of` had when `of` was filled, because
    /// both were filled by the same run of memo references; the run's `len` bytes follow in
    /// `Batch::raw`, to be checked against the run recorded for `of`.
    Alias { list: u32, of: u32, len: u32 },
    /// List number `list` is filled by the run whose `len` bytes follow in `Batch::raw`:
    /// recorded for checking later aliases.
    Run { list: u32, len: u32 },
    /// List number `list` has the content list number `of` had when `of` was filled: their
    /// runs were compared byte for byte already ([`Pipeline::known_run_at`]).
    Same { list: u32, of: u32 },
}

#[derive(Default)]
struct Batch {
    msgs: Vec<Msg>,
    items: Vec<Val>,
    /// Trace entries (device list number, entry whose stack is still a frames list number).
    entries: Vec<(u32, TraceEntry)>,
    /// Raw runs of memo references ([`Msg::Alias`], [`Msg::Run`]).
    raw: Vec<u8>,
}

impl Batch {
    fn clear(&mut self) {
        self.msgs.clear();
        self.items.clear();
        self.entries.clear();
        self.raw.clear();
    }
}

/// The worker's side: the stack table, the stack id of each list number, and the trace entries.
#[derive(Default)]
struct Worker {
    table: StackTable,
    by_list: Vec<u32>,
    /// Per device list: the newest entries, and how many older ones were dropped.
    traces: Vec<(VecDeque<TraceEntry>, u64)>,
    /// Keep only this many entries per device list (`--max-trace-events`).
    max_events: Option<usize>,
    /// Capacity to reserve for the first device list.
    first_capacity: usize,
    /// The run of memo references that filled a list ([`Msg::Run`]).
    runs: FxHashMap<u32, Box<[u8]>>,
    /// An alias whose run differed from the recorded one (a 64-bit hash collision).
    collision: bool,
}

impl Worker {
    fn store(&mut self, list: u32, entry: TraceEntry) {
        let list = list as usize;
        while self.traces.len() <= list {
            // The first device list holds nearly all of a large file: reserve for it up front
            // (untouched capacity costs no memory) so growing it never copies hundreds of MB.
            // The reservation is an upper bound; where the system refuses that much address
            // space, a quarter of it (growing past that copies, but works).
            let mut buf: Vec<TraceEntry> = Vec::new();
            if self.traces.is_empty() {
                let cap = self
                    .first_capacity
                    .min(self.max_events.unwrap_or(usize::MAX));
                if buf.try_reserve_exact(cap).is_err() {
                    let _ = buf.try_reserve_exact(cap / 4);
                }
                crate::timings::count("trace entries reserved", buf.capacity() as u64);
            }
            self.traces.push((buf.into(), 0));
        }
        let (deque, dropped) = &mut self.traces[list];
        if let Some(cap) = self.max_events {
            if deque.len() >= cap {
                *dropped += 1;
                if deque.pop_front().is_none() {
                    return;
                }
            }
        }
        deque.push_back(entry);
    }

    /// The device lists with stack ids in place of frames list numbers.
    fn into_traces(mut self) -> (StackTable, TraceLists) {
        let by_list = std::mem::take(&mut self.by_list);
        let traces = std::mem::take(&mut self.traces)
            .into_iter()
            .map(|(d, n)| {
                let mut v = Vec::from(d);
                for e in &mut v {
                    let s = e
                        .stack()
                        .and_then(|k| by_list.get(k as usize).copied())
                        .filter(|&s| s != u32::MAX);
                    e.set_stack(s);
                }
                (v, n)
            })
            .collect();
        (self.table, traces)
    }

    /// List number `list` has the stack list number `of` has.
    fn same(&mut self, list: u32, of: u32) {
        let k = list as usize;
        if self.by_list.len() <= k {
            self.by_list.resize(k + 1, u32::MAX);
        }
        self.by_list[k] = self.by_list.get(of as usize).copied().unwrap_or(u32::MAX);
    }

    fn run(&mut self, b: &mut Batch) {
        for (list, e) in b.entries.drain(..) {
            self.store(list, e);
        }
        let mut raw_at = 0usize;
        let mut at = 0usize;
        for m in &b.msgs {
            match *m {
                Msg::Frame(f, id) => self.table.set_frame(f, id),
                Msg::List { list, len } => {
                    let items = &b.items[at..at + len as usize];
                    at += len as usize;
                    let k = list as usize;
                    if self.by_list.len() <= k {
                        self.by_list.resize(k + 1, u32::MAX);
                    }
                    let prefix = Some(self.by_list[k]).filter(|&p| p != u32::MAX);
                    let id = self.table.intern(prefix, items);
                    self.by_list[k] = id.unwrap_or(u32::MAX);
                }
                Msg::Run { list, len } => {
                    let raw = &b.raw[raw_at..raw_at + len as usize];
                    raw_at += len as usize;
                    self.runs.insert(list, raw.into());
                }
                Msg::Alias { list, of, len } => {
                    let raw = &b.raw[raw_at..raw_at + len as usize];
                    raw_at += len as usize;
                    if self.runs.get(&of).is_none_or(|r| &r[..] != raw) {
                        self.collision = true;
                    }
                    self.same(list, of);
                }
                Msg::Same { list, of } => self.same(list, of),
            }
        }
    }
}

/// Files at least this large get a worker thread (below, the thread costs more than it saves).
pub(crate) const THREAD_FROM: usize = 8 << 20;
const BATCH_ITEMS: usize = 64 << 10;
const BATCH_MSGS: usize = 8 << 10;
const BATCH_ENTRIES: usize = 8 << 10;
/// Batches in flight: bounds the memory between the threads to a few MiB.
const IN_FLIGHT: usize = 4;

/// Interns the frames lists of trace entries as the VM hands them over; see the module docs.
pub(crate) struct Pipeline {
    mode: Mode,
    batch: Batch,
    /// Lists handed over so far (the next list number).
    lists: u32,
    /// Frame objects already sent, by node id (a bit each) and, for inline values, by value.
    seen: Vec<u64>,
    seen_val: FxHashSet<Val>,
    /// Lists that received items (a bit per list number), and those that received items in more
    /// than one batch (their content changed after they were first filled).
    filled: Vec<u64>,
    extended: FxHashSet<u32>,
    /// Runs of memo references already seen, by hash: the memo generation they were read
    /// under and the list they filled (the worker keeps the bytes and checks every reuse).
    runs: Option<FxHashMap<u64, (u64, u32)>>,
    run_bytes: usize,
    /// The runs recorded, by the hash of their first [`RUN_PREFIX`] bytes: up to
    /// [`RUN_PREFIX_WAYS`] each, as indices of `ways`.
    prefix_runs: FxHashMap<u64, Vec<u32>>,
    /// The runs `prefix_runs` names.
    ways: Vec<Way>,
    /// The way [`Pipeline::known_run_at`] found last (`NO_WAY`: none, or the last call found
    /// nothing): the way found next is tried first after it the next time.
    last_way: u32,
    /// The bytes of the runs in `prefix_runs` (within [`RUN_CACHE_BYTES`] with `run_bytes`).
    run_store: Vec<u8>,
    /// Lists filled by [`Pipeline::known_run_at`] (a count for `MEMLSP_TIMINGS`).
    runs_at: u64,
    /// Of those, found where `last_way` predicted them.
    runs_predicted: u64,
}

/// A run recorded for [`Pipeline::known_run_at`].
#[derive(Clone, Copy, Debug)]
struct Way {
    /// Offset of its bytes in `run_store`, and their length.
    at: u32,
    len: u32,
    /// The memo generation it was read under, and the list it filled.
    generation: u64,
    list: u32,
    /// The way found right after this one the last time (`NO_WAY`: none yet). A trace repeats
    /// its steps, so the frames list after a known one is most often the one after it before:
    /// tried first, it is found with one comparison and no hash.
    next: u32,
}

const NO_WAY: u32 = u32::MAX;

/// Runs at least this long are found by their first bytes ([`Pipeline::known_run_at`]); shorter
/// ones (under 4 to 16 frames) are scanned, which costs little.
const RUN_PREFIX: usize = 32;
/// Runs kept per prefix (stacks that differ only past their first frames share one).
const RUN_PREFIX_WAYS: usize = 8;
/// Prefixes kept (real snapshots have a few thousand distinct stacks): bounds the index's own
/// memory, beyond the bytes of [`RUN_CACHE_BYTES`], on a file made of millions of distinct runs.
const RUN_PREFIXES: usize = 1 << 16;

/// Memory for remembered runs (a frames list is ~200 bytes of opcodes; snapshots repeat a few
/// thousand distinct stacks, so neither bound is reached by real files).
const RUN_CACHE_BYTES: usize = 32 << 20;
const RUN_CACHE_RUNS: usize = 1 << 20;

#[cfg(test)]
thread_local! {
    /// Tests: every run hashes to 0, so different runs collide.
    pub(crate) static COLLIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`Pipeline::finish`] found two different runs of memo references with one hash: decode again
/// with [`Pipeline::new`]`(…, runs: false)`.
pub(crate) const RUN_COLLISION: &str = "run cache collision";

/// How many first bytes of a run its index key covers, by level: a run goes to the first level
/// whose slot for its first bytes has a free (or stale) way. Frames lists start with their
/// innermost frames, which many stacks share (the allocator's own, the op's), so more than
/// [`RUN_PREFIX_WAYS`] runs can share the first 32 bytes: those are found under their first 64,
/// 128 or 256 bytes instead of being scanned and hashed whole every time.
const RUN_LEVELS: [usize; 4] = [RUN_PREFIX, 2 * RUN_PREFIX, 4 * RUN_PREFIX, 8 * RUN_PREFIX];

/// The index key of a run's first `n` bytes (`n` one of [`RUN_LEVELS`]).
fn prefix_hash(raw: &[u8], n: usize) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hs = rustc_hash::FxBuildHasher.build_hasher();
    hs.write(&raw[..n.min(raw.len())]);
    hs.write_usize(n);
    hs.finish()
}

fn test_and_set(bits: &mut Vec<u64>, n: u32) -> bool {
    let (w, bit) = ((n / 64) as usize, 1u64 << (n % 64));
    if bits.len() <= w {
        bits.resize(w + 1, 0);
    }
    let was = bits[w] & bit != 0;
    bits[w] |= bit;
    was
}

enum Mode {
    Inline(Box<Worker>),
    Thread {
        tx: mpsc::SyncSender<Batch>,
        back: mpsc::Receiver<Batch>,
        handle: std::thread::JoinHandle<Worker>,
    },
}

impl Pipeline {
    /// A pipeline, threaded when `threaded` and a thread can be started; trace lists keep their
    /// newest `max_events` entries, the first one is reserved `first_capacity` entries.
    ///
    /// With `runs`, identical runs of memo references fill lists without being decoded again
    /// ([`Pipeline::known_run`]).
    pub(crate) fn new(
        threaded: bool,
        max_events: Option<usize>,
        first_capacity: usize,
        runs: bool,
    ) -> Pipeline {
        let worker = Worker {
            max_events,
            first_capacity,
            ..Worker::default()
        };
        let mode = if threaded {
            Self::spawn(worker)
        } else {
            Mode::Inline(Box::new(worker))
        };
        Pipeline {
            mode,
            batch: Batch::default(),
            lists: 0,
            seen: Vec::new(),
            seen_val: FxHashSet::default(),
            filled: Vec::new(),
            extended: FxHashSet::default(),
            runs: runs.then(FxHashMap::default),
            run_bytes: 0,
            prefix_runs: FxHashMap::default(),
            ways: Vec::new(),
            last_way: NO_WAY,
            run_store: Vec::new(),
            runs_at: 0,
            runs_predicted: 0,
        }
    }

    fn spawn(worker: Worker) -> Mode {
        let (tx, rx) = mpsc::sync_channel::<Batch>(IN_FLIGHT);
        let (back_tx, back) = mpsc::channel::<Batch>();
        // The worker is moved into the thread; if spawning fails it is lost with the closure, so
        // keep it behind an Option that the failure path can take back.
        let cell = std::sync::Arc::new(std::sync::Mutex::new(Some(worker)));
        let for_thread = cell.clone();
        let spawned = std::thread::Builder::new()
            .name("memlsp-stacks".into())
            .spawn(move || {
                let mut w = for_thread
                    .lock()
                    .ok()
                    .and_then(|mut g| g.take())
                    .unwrap_or_default();
                for mut b in rx {
                    w.run(&mut b);
                    b.clear();
                    let _ = back_tx.send(b);
                }
                w
            });
        match spawned {
            Ok(handle) => Mode::Thread { tx, back, handle },
            Err(_) => {
                let w = cell
                    .lock()
                    .ok()
                    .and_then(|mut g| g.take())
                    .unwrap_or_default();
                Mode::Inline(Box::new(w))
            }
        }
    }

    /// A number for a new frames list.
    pub(crate) fn new_list(&mut self) -> Result<u32, String> {
        let n = self.lists;
        if n >= u32::MAX - 1 {
            return Err("more than 2^32 - 2 frames lists".into());
        }
        self.lists += 1;
        Ok(n)
    }

    /// Fill still-empty list `list` from an identical run of memo references seen before
    /// (see [`crate::pickle::Sink::sequence_run`]); `false` when this run is new, which is
    /// remembered for the next time. Runs are matched by a 64-bit hash here and compared byte
    /// for byte on the worker; a mismatch makes [`Pipeline::finish`] fail with
    /// [`RUN_COLLISION`].
    pub(crate) fn known_run(&mut self, list: u32, raw: &[u8], generation: u64) -> bool {
        let Some(runs) = self.runs.as_mut() else {
            return false;
        };
        let h = {
            use std::hash::{BuildHasher, Hasher};
            let mut hs = rustc_hash::FxBuildHasher.build_hasher();
            hs.write(raw);
            hs.finish()
        };
        #[cfg(test)]
        let h = if COLLIDE.with(|c| c.get()) { 0 } else { h };
        let len = raw.len() as u32;
        if let Some(&(g, of)) = runs.get(&h) {
            if g == generation && !self.extended.contains(&of) {
                self.batch.msgs.push(Msg::Alias { list, of, len });
                self.batch.raw.extend_from_slice(raw);
                test_and_set(&mut self.filled, list);
                return true;
            }
        }
        if self.run_bytes + raw.len() <= RUN_CACHE_BYTES && runs.len() < RUN_CACHE_RUNS {
            self.run_bytes += raw.len();
            runs.insert(h, (generation, list));
            self.batch.msgs.push(Msg::Run { list, len });
            self.batch.raw.extend_from_slice(raw);
            if self.run_store.len() + raw.len() <= RUN_CACHE_BYTES {
                let way = Way {
                    at: self.run_store.len() as u32,
                    len,
                    generation,
                    list,
                    next: NO_WAY,
                };
                for n in RUN_LEVELS {
                    if raw.len() < n {
                        break;
                    }
                    let h = prefix_hash(raw, n);
                    if self.prefix_runs.len() >= RUN_PREFIXES && !self.prefix_runs.contains_key(&h)
                    {
                        break;
                    }
                    let ids = self.prefix_runs.entry(h).or_default();
                    // Full: a run recorded under an older memo generation can never match
                    // again; with none, the next level (this one stays full for lookups).
                    let stale = ids
                        .iter()
                        .position(|&i| self.ways[i as usize].generation != generation);
                    match stale {
                        _ if ids.len() < RUN_PREFIX_WAYS => {
                            ids.push(self.ways.len() as u32);
                            self.ways.push(way);
                        }
                        // The stale run's place: a way that predicted it now predicts a run
                        // that is compared before it is taken, like any other.
                        Some(i) => self.ways[ids[i] as usize] = way,
                        None => continue,
                    }
                    self.run_store.extend_from_slice(raw);
                    break;
                }
            }
        }
        false
    }

    /// Fill still-empty list `list` from a run recorded by [`Pipeline::known_run`] that `rest`
    /// (the input from the list's first memo reference on) starts with, byte for byte, followed
    /// by `APPENDS`, under the same memo generation: the run's length, or `None`. Equal bytes
    /// parse as the same opcodes, so this is the run the VM would have scanned, without the
    /// scan or a hash of the whole run.
    pub(crate) fn known_run_at(
        &mut self,
        list: u32,
        rest: &[u8],
        generation: u64,
    ) -> Option<usize> {
        self.runs.as_ref()?;
        let last = std::mem::replace(&mut self.last_way, NO_WAY);
        let predicted = self.ways.get(last as usize).map_or(NO_WAY, |w| w.next);
        let found = if predicted != NO_WAY && self.way_fits(predicted, rest, generation) {
            self.runs_predicted += 1;
            predicted
        } else {
            let found = self.find_way(rest, generation)?;
            if let Some(w) = self.ways.get_mut(last as usize) {
                w.next = found;
            }
            found
        };
        let Way { len, list: of, .. } = self.ways[found as usize];
        self.last_way = found;
        self.batch.msgs.push(Msg::Same { list, of });
        test_and_set(&mut self.filled, list);
        self.runs_at += 1;
        Some(len as usize)
    }

    /// Whether way `id`'s run is what `rest` starts with, followed by `APPENDS`, under memo
    /// generation `generation`, and its list was filled in one batch.
    #[inline]
    fn way_fits(&self, id: u32, rest: &[u8], generation: u64) -> bool {
        let w = self.ways[id as usize];
        let (at, len) = (w.at as usize, w.len as usize);
        w.generation == generation
            && rest.get(len) == Some(&crate::pickle::opcodes::APPENDS)
            && rest[..len] == self.run_store[at..at + len]
            && !self.extended.contains(&w.list)
    }

    /// The way [`Pipeline::way_fits`] `rest`, looked up by the hash of its first bytes.
    fn find_way(&self, rest: &[u8], generation: u64) -> Option<u32> {
        for n in RUN_LEVELS {
            // A run is under a deeper level only when this one's slot is full.
            let ids = self.prefix_runs.get(&prefix_hash(rest.get(..n)?, n))?;
            if let Some(&id) = ids.iter().find(|&&id| self.way_fits(id, rest, generation)) {
                return Some(id);
            }
            if ids.len() < RUN_PREFIX_WAYS {
                return None;
            }
        }
        None
    }

    /// Hand over the items of frames list `list` (a list may come in several batches).
    pub(crate) fn list(
        &mut self,
        t: &Tree<'_>,
        interner: &mut Interner,
        list: u32,
        items: &[Val],
    ) -> Result<(), String> {
        for &f in items {
            // A dict the sink numbered is a frame id already.
            if f.sunk_dict_id().is_none() && !self.mark_seen(f) {
                let id = interner.frame_content(t, f)?;
                self.batch.msgs.push(Msg::Frame(f, id));
            }
        }
        let len = u32::try_from(items.len()).map_err(|_| "a frames list over 2^32 items")?;
        if test_and_set(&mut self.filled, list) {
            self.extended.insert(list);
        }
        self.batch.msgs.push(Msg::List { list, len });
        self.batch.items.extend_from_slice(items);
        if self.batch.items.len() >= BATCH_ITEMS || self.batch.msgs.len() >= BATCH_MSGS {
            self.flush()?;
        }
        Ok(())
    }

    /// Store a trace entry of device list `list`; its stack is still a frames list number.
    pub(crate) fn entry(&mut self, list: u32, entry: TraceEntry) -> Result<(), String> {
        self.batch.entries.push((list, entry));
        if self.batch.entries.len() >= BATCH_ENTRIES {
            self.flush()?;
        }
        Ok(())
    }

    /// Whether `f` was sent before; marks it sent.
    #[inline]
    fn mark_seen(&mut self, f: Val) -> bool {
        match f.node_id() {
            Some(n) => {
                let (w, bit) = ((n / 64) as usize, 1u64 << (n % 64));
                if self.seen.len() <= w {
                    self.seen.resize(w + 1, 0);
                }
                let was = self.seen[w] & bit != 0;
                self.seen[w] |= bit;
                was
            }
            None => !self.seen_val.insert(f),
        }
    }

    fn flush(&mut self) -> Result<(), String> {
        match &mut self.mode {
            Mode::Inline(w) => {
                w.run(&mut self.batch);
                self.batch.clear();
            }
            Mode::Thread { tx, back, .. } => {
                let next = back.try_recv().unwrap_or_default();
                let full = std::mem::replace(&mut self.batch, next);
                tx.send(full)
                    .map_err(|_| "the stack interning thread stopped".to_string())?;
            }
        }
        Ok(())
    }

    /// Wait for the worker: the stack table and the device trace lists (with stack ids).
    pub(crate) fn finish(mut self) -> Result<(StackTable, TraceLists), String> {
        self.flush()?;
        crate::timings::count("frames lists known by their first bytes", self.runs_at);
        crate::timings::count("of those, the one after the last", self.runs_predicted);
        let w = match self.mode {
            Mode::Inline(w) => *w,
            Mode::Thread { tx, handle, .. } => {
                drop(tx);
                handle
                    .join()
                    .map_err(|_| "the stack interning thread failed".to_string())?
            }
        };
        if w.table.overflow {
            return Err("more than 2^32 - 1 distinct stacks".into());
        }
        if w.collision {
            return Err(RUN_COLLISION.into());
        }
        Ok(w.into_traces())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[f0, f1, f0]`-style lists over three frame dicts, as a decoded tree.
    fn tree_with_frames() -> (Tree<'static>, Vec<Val>) {
        let mut t = Tree::empty();
        let frames = (0..3)
            .map(|i| {
                let k = t.new_str("name");
                let v = t.new_str(&format!("f{i}"));
                t.new_dict(vec![(k, v)])
            })
            .collect();
        (t, frames)
    }

    #[test]
    fn a_known_run_is_recognised_by_its_bytes_only_when_all_of_them_match() {
        // 8 LONG_BINGETs: 40 bytes, past RUN_PREFIX.
        let run: Vec<u8> = (0..8u32)
            .flat_map(|i| {
                let mut op = vec![crate::pickle::opcodes::LONG_BINGET];
                op.extend_from_slice(&(1000 + i).to_le_bytes());
                op
            })
            .collect();
        let appends = crate::pickle::opcodes::APPENDS;
        let with = |tail: &[u8]| [&run[..], tail].concat();
        let mut p = Pipeline::new(false, None, 16, true);
        let first = p.new_list().unwrap();
        assert!(!p.known_run(first, &run, 0), "a new run is not known");
        let next = p.new_list().unwrap();
        assert_eq!(
            p.known_run_at(next, &with(&[appends, b'u']), 0),
            Some(run.len())
        );
        // Another memo generation, no APPENDS after it, a different last byte, a longer run.
        assert_eq!(p.known_run_at(next, &with(&[appends]), 1), None);
        assert_eq!(p.known_run_at(next, &with(b"u"), 0), None);
        let mut other = with(&[appends]);
        other[run.len() - 1] ^= 1;
        assert_eq!(p.known_run_at(next, &other, 0), None);
        assert_eq!(p.known_run_at(next, &with(&[b'h', 7, appends]), 0), None);
        // Without the run cache (after a collision) nothing is known.
        let mut p = Pipeline::new(false, None, 16, false);
        let first = p.new_list().unwrap();
        p.known_run(first, &run, 0);
        assert_eq!(p.known_run_at(first + 1, &with(&[appends]), 0), None);
    }

    /// Many stacks share their innermost frames: more runs than a slot has ways share their
    /// first 32 bytes, and each is still found by its first bytes (under a longer prefix),
    /// never taken for another.
    #[test]
    fn runs_sharing_their_first_bytes_past_the_ways_are_still_found() {
        let op = |i: u32| {
            let mut op = vec![crate::pickle::opcodes::LONG_BINGET];
            op.extend_from_slice(&i.to_le_bytes());
            op
        };
        // 8 shared references (40 bytes), then 12 of the run's own: 100 bytes a run.
        let runs: Vec<Vec<u8>> = (0..3 * RUN_PREFIX_WAYS as u32)
            .map(|r| {
                (0..8)
                    .map(|i| op(1000 + i))
                    .chain((0..12).map(|i| op(5000 + 100 * r + i)))
                    .flatten()
                    .collect()
            })
            .collect();
        let appends = crate::pickle::opcodes::APPENDS;
        let mut p = Pipeline::new(false, None, 16, true);
        for run in &runs {
            let list = p.new_list().unwrap();
            assert!(!p.known_run(list, run, 0), "a new run is not known");
        }
        for run in &runs {
            let list = p.new_list().unwrap();
            let rest = [&run[..], &[appends, b'u']].concat();
            assert_eq!(p.known_run_at(list, &rest, 0), Some(run.len()));
        }
        // One differing byte past the shared part: not any of them.
        let mut other = [&runs[RUN_PREFIX_WAYS + 1][..], &[appends]].concat();
        other[60] ^= 1;
        let list = p.new_list().unwrap();
        assert_eq!(p.known_run_at(list, &other, 0), None);
        assert_eq!(p.runs_at, runs.len() as u64);
    }

    /// The run after a known one is tried first where it came last time; what is taken is
    /// still the one run that matches, under the memo generation, from a list filled once.
    #[test]
    fn the_run_predicted_after_a_known_one_is_taken_only_when_it_matches() {
        let op = |i: u32| {
            let mut op = vec![crate::pickle::opcodes::LONG_BINGET];
            op.extend_from_slice(&i.to_le_bytes());
            op
        };
        let run = |r: u32| -> Vec<u8> { (0..8).flat_map(|i| op(100 * r + i)).collect() };
        let appends = crate::pickle::opcodes::APPENDS;
        let rest = |r: u32| [&run(r)[..], &[appends, b'u']].concat();
        let (t, frames) = tree_with_frames();
        let mut interner = Interner::default();
        let mut p = Pipeline::new(false, None, 16, true);
        // Runs 1, 2 and 3 fill lists 0, 1 and 2.
        for r in 1..=3 {
            let list = p.new_list().unwrap();
            assert!(!p.known_run(list, &run(r), 0));
        }
        // Which recorded list each lookup of `rs` aliased, under generation `g`.
        let looked = |p: &mut Pipeline, rs: &[u32], g: u64| -> Vec<Option<u32>> {
            rs.iter()
                .map(|&r| {
                    let list = p.new_list().unwrap();
                    p.known_run_at(list, &rest(r), g)?;
                    match p.batch.msgs.last() {
                        Some(&Msg::Same { list: l, of }) if l == list => Some(of),
                        _ => panic!("no alias recorded for list {list}"),
                    }
                })
                .collect()
        };
        // 1 then 2 (2 predicted after 1 from then on); after 1, run 3 is not taken for 2.
        assert_eq!(
            looked(&mut p, &[1, 2, 1, 3], 0),
            [Some(0), Some(1), Some(0), Some(2)]
        );
        assert_eq!(p.runs_predicted, 0);
        // 3 after 1 now: predicted (and 1 after 3, learnt on the way); 2 after 1 again is
        // found by its bytes.
        assert_eq!(
            looked(&mut p, &[1, 3, 1, 2], 0),
            [Some(0), Some(2), Some(0), Some(1)]
        );
        assert_eq!(p.runs_predicted, 2);
        assert_eq!(looked(&mut p, &[1, 2, 1], 0), [Some(0), Some(1), Some(0)]);
        assert_eq!(p.runs_predicted, 5);
        // Another memo generation: the predicted run no longer stands for its list.
        assert_eq!(looked(&mut p, &[2], 1), [None]);
        assert_eq!(p.runs_predicted, 5);
        // List 1 received items in two batches: run 2 no longer says what it holds.
        p.list(&t, &mut interner, 1, &frames).unwrap();
        p.list(&t, &mut interner, 1, &frames).unwrap();
        assert_eq!(looked(&mut p, &[1, 2], 0), [Some(0), None]);
    }

    #[test]
    fn threaded_and_inline_pipelines_agree() {
        let (t, f) = tree_with_frames();
        let lists: Vec<Vec<Val>> = (0..50_000)
            .map(|i| match i % 3 {
                0 => vec![f[0], f[1]],
                1 => vec![f[2], f[1], f[0]],
                _ => vec![f[i % 2]],
            })
            .collect();
        let run = |threaded: bool| {
            let mut interner = Interner::default();
            let mut p = Pipeline::new(threaded, None, 0, true);
            for (i, l) in lists.iter().enumerate() {
                // Every tenth list arrives in two batches.
                let k = p.new_list().unwrap();
                if i % 10 == 0 && l.len() > 1 {
                    p.list(&t, &mut interner, k, &l[..1]).unwrap();
                    p.list(&t, &mut interner, k, &l[1..]).unwrap();
                } else {
                    p.list(&t, &mut interner, k, l).unwrap();
                }
                let e = TraceEntry::new(Action::Alloc, i as u64, 512, 0).with_stack(Some(k));
                p.entry((i % 2) as u32, e).unwrap();
            }
            let empty = p.new_list().unwrap();
            p.entry(
                0,
                TraceEntry::new(Action::Oom, 0, 1, 0).with_stack(Some(empty)),
            )
            .unwrap();
            let (table, traces) = p.finish().unwrap();
            assert_eq!(traces[0].0.last().unwrap().stack(), None, "an empty list");
            let stacks: Vec<Vec<FrameId>> = (0..lists.len())
                .map(|i| {
                    let e = &traces[i % 2].0[i / 2];
                    assert_eq!(e.addr, i as u64);
                    table.stacks[e.stack().unwrap() as usize].clone()
                })
                .collect();
            (interner.frames.len(), stacks)
        };
        let (inline, threaded) = (run(false), run(true));
        assert_eq!(inline.0, 3);
        assert_eq!(inline, threaded);
        assert_eq!(inline.1[0], vec![0, 1]);
        assert_eq!(inline.1[1], vec![2, 1, 0]);
        assert_eq!(inline.1[0], inline.1[3], "equal content, one stack");
    }

    #[test]
    fn a_frame_that_is_not_a_dict_is_an_error_on_the_decoding_side() {
        let (mut t, f) = tree_with_frames();
        let bad = t.new_float(1.5);
        let mut interner = Interner::default();
        let mut p = Pipeline::new(true, None, 0, true);
        let k = p.new_list().unwrap();
        let e = p.list(&t, &mut interner, k, &[f[0], bad]).unwrap_err();
        assert_eq!(e, "a stack frame is a float, expected a dict");
        assert!(p.finish().is_ok());
    }
}
