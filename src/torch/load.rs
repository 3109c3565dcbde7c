//! Decode a snapshot file (pickle or JSON) into the [`Snapshot`] model.
//!
//! Every key variant of `torch_snapshots/FORMAT.md` is accepted: torch 2.0 blocks with `history`
//! and no `address`, bare segment lists, missing `device_traces`, multi-device traces,
//! expandable segments, C++ frames, `oom` entries with `device_free`, and the JSON rendering of the
//! same dict. Frames and stacks are interned: a shared stack list becomes one `StackId`.

use std::path::Path;

use rustc_hash::FxHashMap;

use crate::error::{CaptureError, ErrorKind};
use crate::pickle::{self, Kind, Limits, PickleErrorKind, Tree, Val};
use crate::torch::budget;
use crate::torch::intern::{Interner, Pipeline, RUN_COLLISION, THREAD_FROM};
use crate::torch::model::{
    Action, AllocatorSettings, Block, BlockState, Segment, Snapshot, SnapshotFormat, StackId,
    TraceEntry,
};

use crate::options::DecodeOptions;

/// Read and decode a snapshot file (`.pickle`/`.pkl` or the JSON form).
pub fn load_snapshot(path: &Path, opts: &DecodeOptions) -> Result<Snapshot, CaptureError> {
    let file = std::fs::File::open(path).map_err(|e| CaptureError::io(path, &e))?;
    let len = file
        .metadata()
        .map_err(|e| CaptureError::io(path, &e))?
        .len();
    if len == 0 {
        return Err(CaptureError::new(
            path,
            ErrorKind::Truncated,
            Some(0),
            "the file is empty",
            "a snapshot being written is retried when it changes; otherwise re-run _dump_snapshot()",
        ));
    }
    // Mapped pages are released as the decoder passes them, which keeps peak memory near the
    // model's own size.
    if !crate::sigbus::should_map(len) {
        // Read, not mapped: a mapped file that another process truncates while it is decoded
        // raises SIGBUS and kills the whole process (the language server included), and torch
        // re-dumps a snapshot in place (truncate, then write). A file that shrinks while read here
        // is just short, and decodes as truncated.
        use std::io::Read;
        let mut bytes = Vec::with_capacity(len as usize);
        let mut file = file;
        file.read_to_end(&mut bytes)
            .map_err(|e| CaptureError::io(path, &e))?;
        return decode_inner(path, &bytes, opts, None);
    }
    // SAFETY: the map is read-only and private to this call. A file this large that is truncated
    // underneath it by another process can still fault (SIGBUS); see docs/LIMITS.md.
    let map = unsafe { memmap2::Mmap::map(&file) };
    match map {
        Ok(map) => {
            #[cfg(unix)]
            let _ = map.advise(memmap2::Advice::Sequential);
            let watch = crate::sigbus::Watch::new(&file);
            let decoded = decode_inner(path, &map, opts, Some(&map));
            if watch.lost(path) {
                // Pages past the new end of the file read as zeros: whatever was decoded is void.
                return Err(CaptureError::truncated_while_read(path));
            }
            decoded
        }
        Err(_) => {
            let bytes = std::fs::read(path).map_err(|e| CaptureError::io(path, &e))?;
            decode_inner(path, &bytes, opts, None)
        }
    }
}

/// Decode snapshot bytes already in memory (`path` is used for error messages only).
pub fn decode_snapshot(
    path: &Path,
    bytes: &[u8],
    opts: &DecodeOptions,
) -> Result<Snapshot, CaptureError> {
    decode_inner(path, bytes, opts, None)
}

fn decode_inner(
    path: &Path,
    bytes: &[u8],
    opts: &DecodeOptions,
    map: Option<&memmap2::Mmap>,
) -> Result<Snapshot, CaptureError> {
    let first = bytes.iter().position(|b| !b.is_ascii_whitespace());
    let snap = match first.map(|i| bytes[i]) {
        None => Err(CaptureError::new(
            path,
            ErrorKind::Truncated,
            Some(0),
            "the file is empty",
            "re-run _dump_snapshot()",
        )),
        Some(b'{') | Some(b'[') => decode_json(path, bytes, opts, map),
        _ => match decode_pickle(path, bytes, opts, map, true)? {
            Some(snap) => Ok(snap),
            // Two different frames lists looked alike to the run cache: decode again without it.
            None => decode_pickle(path, bytes, opts, map, false)?
                .ok_or_else(|| unexpected_collision(path)),
        },
    }?;
    opts.progress.advance(bytes.len() as u64);
    Ok(snap)
}

/// A run-cache collision where no run cache was used: cannot happen.
fn unexpected_collision(path: &Path) -> CaptureError {
    CaptureError::new(
        path,
        ErrorKind::Invalid,
        None,
        RUN_COLLISION,
        "please report this with the file",
    )
}

/// The sink the decoders stream a snapshot's trace to (`runs`: with the run cache).
fn trace_sink<'m>(
    bytes: &[u8],
    opts: &DecodeOptions,
    map: Option<&'m memmap2::Mmap>,
    runs: bool,
) -> TraceSink<'m> {
    let threaded = bytes.len() >= THREAD_FROM
        && std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
    #[cfg(test)]
    let threaded = threaded && !tests::INLINE.with(|c| c.get());
    TraceSink {
        interner: Interner::default(),
        pipeline: Some(Pipeline::new(
            threaded,
            opts.max_trace_events,
            // At most one trace entry per 24 bytes: the smallest entry torch writes (action,
            // addr, size, stream and an empty frames list as memo references) takes more. The
            // shared-lists shape has 60 bytes an entry, the realistic one 157. Under a cap on
            // the address space, a likelier count (growing past it copies).
            if crate::hugepages::address_space_limited() {
                bytes.len() / 64
            } else {
                bytes.len() / 24
            },
            runs,
        )),
        list_by_val: FxHashMap::default(),
        last_keys: Vec::new(),
        last_slots: Vec::new(),
        actions: Vec::new(),
        map,
        released: 0,
        contexts: Default::default(),
        cancel: opts.cancel.clone(),
        progress: opts.progress.clone(),
    }
}

/// Decode a pickle snapshot, streaming its trace to a [`TraceSink`]; `Ok(None)` when the run
/// cache (`runs`) met a hash collision.
fn decode_pickle(
    path: &Path,
    bytes: &[u8],
    opts: &DecodeOptions,
    map: Option<&memmap2::Mmap>,
    runs: bool,
) -> Result<Option<Snapshot>, CaptureError> {
    let limits = Limits {
        refuse_globals: true,
        ..Limits::default()
    };
    let mut sink = trace_sink(bytes, opts, map, runs);
    let decoded = crate::timings::time("decode", || {
        pickle::decode_streaming(bytes, &limits, Some(&mut sink))
    });
    let tree = decoded.map_err(|e| {
        let (kind, hint) = match e.kind {
            PickleErrorKind::Truncated => (
                ErrorKind::Truncated,
                "the snapshot may still be being written; otherwise the file was cut short — dump it again",
            ),
            PickleErrorKind::Invalid => (
                ErrorKind::Invalid,
                "this is not a pickle written by torch.cuda.memory._dump_snapshot()",
            ),
            PickleErrorKind::Refused => (
                ErrorKind::Unsupported,
                "only data pickles from _dump_snapshot() are read",
            ),
            PickleErrorKind::Limit => (ErrorKind::Limit, "this does not look like a memory snapshot"),
            PickleErrorKind::Cancelled => return CaptureError::cancelled(path),
        };
        CaptureError::new(path, kind, Some(e.offset), e.message, hint)
    })?;
    finish_streamed(path, bytes.len(), opts, sink, tree)
}

/// Decode the JSON form, streaming its trace to the same [`TraceSink`] (no run cache: JSON has
/// no memo references to repeat).
fn decode_json(
    path: &Path,
    bytes: &[u8],
    opts: &DecodeOptions,
    map: Option<&memmap2::Mmap>,
) -> Result<Snapshot, CaptureError> {
    let mut sink = trace_sink(bytes, opts, map, false);
    let decoded = crate::timings::time("decode", || {
        pickle::json::decode_streaming(bytes, Some(&mut sink))
    });
    let tree = decoded.map_err(|e| match e {
        pickle::json::JsonError::Cancelled => CaptureError::cancelled(path),
        pickle::json::JsonError::Syntax(e) => json_error(path, bytes, &e),
    })?;
    finish_streamed(path, bytes.len(), opts, sink, tree)?.ok_or_else(|| unexpected_collision(path))
}

/// The snapshot model from a decoded tree and what its sink collected; `Ok(None)` on a run-cache
/// collision.
fn finish_streamed(
    path: &Path,
    file_len: usize,
    opts: &DecodeOptions,
    mut sink: TraceSink<'_>,
    tree: Tree<'_>,
) -> Result<Option<Snapshot>, CaptureError> {
    let streamed = match crate::timings::time("model: wait for stacks", || sink.finish()) {
        Ok(s) => s,
        Err(m) if m == RUN_COLLISION => return Ok(None),
        Err(m) => {
            return Err(CaptureError::new(
                path,
                ErrorKind::Limit,
                None,
                m,
                "this does not look like a memory snapshot; if it is one, please report it with the file",
            ));
        }
    };
    let contexts = std::mem::take(&mut sink.contexts);
    let mut snap = crate::timings::time("model: build", || {
        build(path, file_len, &tree, opts, sink.interner, streamed)
    })?;
    contexts.attach(&tree, &mut snap);
    snap.pickle_protocol = tree.protocol;
    crate::timings::count(
        "trace entries",
        snap.device_traces
            .iter()
            .flatten()
            .map(|t| t.len() as u64)
            .sum(),
    );
    Ok(Some(snap))
}

/// A JSON error where it happened.
fn json_error(path: &Path, bytes: &[u8], e: &serde_json::Error) -> CaptureError {
    let offset = crate::error::json_error_offset(bytes, e);
    let kind = if e.is_eof() {
        ErrorKind::Truncated
    } else {
        ErrorKind::Invalid
    };
    CaptureError::new(
        path,
        kind,
        Some(offset),
        format!("invalid JSON: {e}"),
        "expected the JSON rendering of a snapshot dict",
    )
}

/// Parse the JSON form into the same object graph the pickle VM produces.
#[cfg(test)]
fn tree_from_json(path: &Path, bytes: &[u8]) -> Result<Tree<'static>, CaptureError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| json_error(path, bytes, &e))?;
    let mut tree = Tree::empty();
    // Iterative conversion (no recursion on hostile nesting).
    enum Work<'j> {
        Visit(&'j serde_json::Value),
        List(usize),
        Dict(Vec<String>),
    }
    let mut work = vec![Work::Visit(&value)];
    let mut out: Vec<Val> = Vec::new();
    let mut depth = 0usize;
    // serde_json already stops at 128 levels; this keeps the conversion bounded on its own.
    let enter = |depth: usize| {
        if depth >= 1000 {
            Err(CaptureError::new(
                path,
                ErrorKind::Limit,
                None,
                "JSON nested more than 1000 levels",
                "",
            ))
        } else {
            Ok(depth + 1)
        }
    };
    while let Some(w) = work.pop() {
        match w {
            Work::Visit(v) => match v {
                serde_json::Value::Null => out.push(Val::NONE),
                serde_json::Value::Bool(b) => out.push(if *b { Val::TRUE } else { Val::FALSE }),
                serde_json::Value::Number(n) => {
                    let v = if let Some(i) = n.as_i64() {
                        tree.new_int(i as i128)
                    } else if let Some(u) = n.as_u64() {
                        tree.new_int(u as i128)
                    } else {
                        tree.new_float(n.as_f64().unwrap_or(f64::NAN))
                    };
                    out.push(v);
                }
                serde_json::Value::String(s) => {
                    let v = tree.new_str(s);
                    out.push(v);
                }
                serde_json::Value::Array(items) => {
                    depth = enter(depth)?;
                    work.push(Work::List(items.len()));
                    for it in items.iter().rev() {
                        work.push(Work::Visit(it));
                    }
                }
                serde_json::Value::Object(map) => {
                    depth = enter(depth)?;
                    work.push(Work::Dict(map.keys().cloned().collect()));
                    for it in map.values().rev() {
                        work.push(Work::Visit(it));
                    }
                }
            },
            Work::List(n) => {
                depth = depth.saturating_sub(1);
                let items = out.split_off(out.len() - n);
                let v = tree.new_list(items);
                out.push(v);
            }
            Work::Dict(keys) => {
                depth = depth.saturating_sub(1);
                let vals = out.split_off(out.len() - keys.len());
                let pairs = keys
                    .iter()
                    .zip(vals)
                    .map(|(k, v)| (tree.new_str(k), v))
                    .collect();
                let v = tree.new_dict(pairs);
                out.push(v);
            }
        }
    }
    tree.root = out.pop().unwrap_or(Val::NONE);
    Ok(tree)
}

/// Converts trace-entry dicts to [`TraceEntry`]s while the pickle is decoded, so millions of
/// entries never sit in the object graph.
struct TraceSink<'m> {
    interner: Interner,
    /// Interns frames lists and stores the entries (on a worker thread for large files).
    pipeline: Option<Pipeline>,
    /// List number of frames lists that are not sunk (`None`: empty), by object.
    list_by_val: FxHashMap<Val, Option<u32>>,
    /// Key objects of the previous entry and their field slots.
    last_keys: Vec<Val>,
    last_slots: Vec<u8>,
    /// Action str object → action, for the last few action objects seen.
    actions: Vec<(Val, Action)>,
    map: Option<&'m memmap2::Mmap>,
    cancel: crate::options::Cancel,
    progress: crate::options::Progress,
    /// Input bytes before this offset were given back to the kernel.
    released: usize,
    /// `compile_context` of the entries (`load/compile_context.rs`).
    contexts: compile_context::Contexts,
}

impl TraceSink<'_> {
    /// Wait for the pipeline: the device trace lists, with stack ids.
    fn finish(&mut self) -> Result<Streamed, String> {
        let Some(pipeline) = self.pipeline.take() else {
            return Ok(None);
        };
        let (table, traces) = pipeline.finish()?;
        self.interner.table = table;
        Ok((!traces.is_empty()).then_some(traces))
    }

    /// The list number of an entry's `frames` value.
    fn frames_list(&mut self, t: &Tree<'_>, fr: Val) -> Result<Option<u32>, String> {
        if let Some(k) = t.sunk(fr) {
            return Ok(Some(k));
        }
        if let Some(&k) = self.list_by_val.get(&fr) {
            return Ok(k);
        }
        let items = t.items(fr);
        let k = if items.is_empty() {
            if !t.is_seq(fr) {
                return Err(format!(
                    "a `frames` value is {}, expected a list",
                    t.describe(fr)
                ));
            }
            None
        } else {
            let p = self.pipeline.as_mut().ok_or("decoding already finished")?;
            let k = p.new_list()?;
            p.list(t, &mut self.interner, k, items)?;
            Some(k)
        };
        self.list_by_val.insert(fr, k);
        Ok(k)
    }
}

impl pickle::Sink for TraceSink<'_> {
    fn key(&self) -> &str {
        "device_traces"
    }

    fn entry(&mut self, t: &Tree<'_>, list: u32, pairs: &[Val]) -> Result<(), String> {
        // Every entry of a snapshot has the same key objects in the same order: map them once.
        let same_keys = pairs.len() == 2 * self.last_keys.len()
            && pairs
                .chunks_exact(2)
                .zip(&self.last_keys)
                .all(|(p, k)| p[0] == *k);
        if !same_keys {
            self.last_keys.clear();
            self.last_slots.clear();
            for p in pairs.chunks_exact(2) {
                let slot = t
                    .str(p[0])
                    .and_then(|name| TRACE_KEYS.iter().position(|w| *w == name))
                    .map_or(u8::MAX, |i| i as u8);
                self.last_keys.push(p[0]);
                self.last_slots.push(slot);
            }
        }
        let mut fields = [None; 7];
        for (slot, p) in self.last_slots.iter().zip(pairs.chunks_exact(2)) {
            if let Some(f) = fields.get_mut(*slot as usize) {
                *f = Some(p[1]);
            }
        }
        let action = match fields[0] {
            // Snapshots memoize the few action strings: remember the last ones by object.
            Some(a) => match self.actions.iter().find(|(v, _)| *v == a) {
                Some(&(_, act)) => act,
                None => {
                    let act = self.interner.action(t.str(a).unwrap_or("<not a str>"));
                    if self.actions.len() >= 16 {
                        self.actions.remove(0);
                    }
                    self.actions.push((a, act));
                    act
                }
            },
            None => self.interner.action("<missing>"),
        };
        // Until `finish`, `stack` holds the frames list number.
        let stack = match fields[6] {
            Some(fr) => self.frames_list(t, fr)?,
            None => None,
        };
        let entry = trace_entry(t, action, fields, stack);
        self.contexts.note(t, list, pairs);
        self.pipeline
            .as_mut()
            .ok_or("decoding already finished")?
            .entry(list, entry)
    }

    fn takes_sequences(&self) -> bool {
        true
    }

    fn new_sequence(&mut self) -> Result<u32, String> {
        self.pipeline
            .as_mut()
            .ok_or("decoding already finished")?
            .new_list()
    }

    fn sequence_run(&mut self, seq: u32, raw: &[u8], generation: u64) -> Result<bool, String> {
        let p = self.pipeline.as_mut().ok_or("decoding already finished")?;
        Ok(p.known_run(seq, raw, generation))
    }

    fn sequence_dict(
        &mut self,
        t: &Tree<'_>,
        prev: Option<u32>,
        pairs: &[Val],
    ) -> Result<u32, String> {
        self.interner.frame_of_pairs(t, prev, pairs)
    }

    fn sequence(&mut self, t: &Tree<'_>, seq: u32, items: &[Val]) -> Result<(), String> {
        let p = self.pipeline.as_mut().ok_or("decoding already finished")?;
        p.list(t, &mut self.interner, seq, items)
    }

    fn progress(&mut self, offset: usize) -> bool {
        if self.cancel.is_cancelled() {
            return false;
        }
        self.progress.advance(offset as u64);
        // Give back the pages of input already decoded: the strings kept point into the map and
        // are re-read from the page cache if needed, so peak memory stays near the model's size.
        #[cfg(unix)]
        if let Some(map) = self.map {
            let page = 4096;
            let upto = (offset.saturating_sub(256 << 10)) / page * page;
            if upto > self.released {
                // SAFETY: the mapping is private and read-only; DONTNEED only drops clean pages.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        self.released,
                        upto - self.released,
                    )
                };
                self.released = upto;
            }
        }
        #[cfg(not(unix))]
        let _ = (offset, self.map);
        true
    }
}

/// One trace entry from its field values (in `TRACE_KEYS` order; the action already parsed).
fn trace_entry(
    t: &Tree<'_>,
    action: Action,
    f: [Option<Val>; 7],
    stack: Option<StackId>,
) -> TraceEntry {
    let [_, addr, size, stream, time_us, device_free, _] = f;
    let uint = |v: Option<Val>| {
        v.and_then(|v| t.int128(v))
            .map_or(0, |i| u64::try_from(i.max(0)).unwrap_or(u64::MAX))
    };
    TraceEntry::new(action, uint(addr), uint(size), uint(stream))
        .with_time_us(
            time_us
                .and_then(|v| t.int128(v))
                .map(|i| i.clamp(i64::MIN as i128, i64::MAX as i128) as i64),
        )
        .with_device_free(device_free.map(|v| uint(Some(v))))
        .with_stack(stack)
}

/// Builds the model from the object graph.
struct Builder<'t, 'a> {
    path: &'t Path,
    t: &'t Tree<'a>,
    snap: Snapshot,
    interner: Interner,
    /// Per dict shape: positions of the keys a reader asks for.
    shape_slots: FxHashMap<(u32, usize), Vec<Option<usize>>>,
}

type Streamed = Option<Vec<(Vec<TraceEntry>, u64)>>;

fn build(
    path: &Path,
    file_len: usize,
    t: &Tree<'_>,
    opts: &DecodeOptions,
    interner: Interner,
    streamed: Streamed,
) -> Result<Snapshot, CaptureError> {
    let mut b = Builder {
        path,
        t,
        snap: Snapshot::default(),
        interner,
        shape_slots: FxHashMap::default(),
    };
    let root = t.root;
    match t.kind(root) {
        Kind::Dict => {
            b.snap.format = Some(SnapshotFormat::Dict);
            b.snap.top_level_keys = t
                .pairs(root)
                .filter_map(|(k, _)| t.str(k).map(str::to_string))
                .collect();
            let [
                segments,
                traces,
                settings,
                annotations,
                overflowed,
                max_entries,
                host_segments,
                host_traces,
            ] = b.fields(root, TOP_KEYS);
            let extras = (annotations, [overflowed, max_entries]);
            within_budget(
                path,
                file_len,
                t,
                (segments, traces),
                extras,
                &streamed,
                opts,
            )?;
            match segments {
                Some(s) => b.segments(s)?,
                None => {
                    if traces.is_none() {
                        return Err(b.shape_error(
                            "the top-level dict has neither `segments` nor `device_traces`",
                        ));
                    }
                }
            }
            if let Some(tr) = traces {
                b.traces(tr, opts, streamed)?;
            }
            if let Some(s) = settings {
                b.settings(s);
            }
            if let Some(a) = annotations {
                b.annotations(a);
            }
            b.ring_buffers(overflowed, max_entries);
            if host_segments.is_some() || host_traces.is_some() {
                b.host(host_segments, host_traces);
            }
        }
        Kind::List => {
            b.snap.format = Some(SnapshotFormat::SegmentList);
            within_budget(
                path,
                file_len,
                t,
                (Some(root), None),
                NO_EXTRAS,
                &streamed,
                opts,
            )?;
            b.segments(root)?;
        }
        Kind::Consumed => {
            return Err(b.shape_error("a streamed trace entry is used as the top-level object"));
        }
        _ => {
            let what = t.describe(root);
            return Err(b.shape_error(&format!(
                "the top-level object is {what}, not a snapshot dict or a list of segments"
            )));
        }
    }
    b.snap.frames = std::mem::take(&mut b.interner.frames);
    b.snap.other_actions = std::mem::take(&mut b.interner.other_actions);
    b.snap.stacks = std::mem::take(&mut b.interner.table.stacks);
    Ok(b.snap)
}

/// Refuse a tree whose model would not fit the budget (`torch::budget`), before building it.
fn within_budget(
    path: &Path,
    file_len: usize,
    t: &Tree<'_>,
    (segments, traces): (Option<Val>, Option<Val>),
    (annotations, ring): Extras,
    streamed: &Streamed,
    opts: &DecodeOptions,
) -> Result<(), CaptureError> {
    let lens: Vec<u64> = streamed
        .iter()
        .flatten()
        .map(|(e, _)| e.len() as u64)
        .collect();
    let mut c = budget::count(t, segments, traces, &lens, opts.max_trace_events);
    c.add_extras(t, annotations, ring);
    crate::timings::count("model bytes (estimated)", c.bytes());
    budget::check(path, &c, file_len as u64, opts)
}

/// `external_annotations` and the two ring-buffer keys, counted by the budget.
type Extras = (Option<Val>, [Option<Val>; 2]);
const NO_EXTRAS: Extras = (None, [None, None]);

const TOP_KEYS: &[&str; 8] = &[
    "segments",
    "device_traces",
    "allocator_settings",
    "external_annotations",
    "trace_alloc_overflowed",
    "trace_alloc_max_entries",
    "host_segments",
    "host_traces",
];
const SEGMENT_KEYS: &[&str; 12] = &[
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
];
const BLOCK_KEYS: &[&str; 6] = &[
    "address",
    "size",
    "requested_size",
    "state",
    "frames",
    "history",
];
const HISTORY_KEYS: &[&str; 3] = &["addr", "real_size", "frames"];
const TRACE_KEYS: &[&str; 7] = &[
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "device_free",
    "frames",
];

/// `roundup_power2_divisions` as recorded: `{"1": d, "2": d, …}` keyed by the interval's start in
/// MiB (a power of two); a list is taken in order. Keys that are not powers of two are ignored.
fn roundup_divisions(t: &Tree, v: Val) -> Vec<u64> {
    const INTERVALS: usize = 16;
    let mut out = vec![0u64; INTERVALS];
    let value = |x: Val| t.int128(x).and_then(|i| u64::try_from(i).ok()).unwrap_or(0);
    if matches!(t.kind(v), Kind::List | Kind::Tuple) {
        for (i, &x) in t.items(v).iter().take(INTERVALS).enumerate() {
            out[i] = value(x);
        }
        return out;
    }
    for (k, x) in t.pairs(v) {
        let key = t
            .str(k)
            .and_then(|s| s.parse::<u64>().ok())
            .or_else(|| t.int128(k).and_then(|i| u64::try_from(i).ok()));
        if let Some(mb) = key.filter(|m| m.is_power_of_two()) {
            let i = (mb.trailing_zeros() as usize).min(INTERVALS - 1);
            out[i] = value(x);
        }
    }
    out
}

impl<'t, 'a> Builder<'t, 'a> {
    fn shape_error(&self, what: &str) -> CaptureError {
        CaptureError::new(
            self.path,
            ErrorKind::Invalid,
            None,
            what.to_string(),
            "this is not a torch.cuda.memory snapshot",
        )
    }

    /// Values of `keys` in `dict` (missing → None). Cached per dict shape.
    fn fields<const N: usize>(
        &mut self,
        dict: Val,
        keys: &'static [&'static str; N],
    ) -> [Option<Val>; N] {
        let mut out = [None; N];
        let t = self.t;
        if let Some(shape) = t.shape_of(dict) {
            let cache_key = (shape, keys.as_ptr() as usize);
            let slots = self.shape_slots.entry(cache_key).or_insert_with(|| {
                let names: Vec<Option<&str>> = t.pairs(dict).map(|(k, _)| t.str(k)).collect();
                keys.iter()
                    .map(|want| names.iter().position(|n| *n == Some(*want)))
                    .collect()
            });
            let values = t.shaped_values(dict);
            for (i, slot) in slots.iter().enumerate() {
                if let Some(p) = slot {
                    out[i] = values.get(*p).copied();
                }
            }
            return out;
        }
        for (k, v) in t.pairs(dict) {
            if let Some(name) = t.str(k) {
                if let Some(i) = keys.iter().position(|want| *want == name) {
                    out[i] = Some(v);
                }
            }
        }
        out
    }

    fn uint(&self, v: Option<Val>) -> u64 {
        let Some(v) = v else { return 0 };
        match self.t.int128(v) {
            Some(i) if i < 0 => 0,
            Some(i) => u64::try_from(i).unwrap_or(u64::MAX),
            None => 0,
        }
    }

    fn int(&self, v: Option<Val>) -> Option<i64> {
        let v = v?;
        self.t
            .int128(v)
            .map(|i| i.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
    }

    fn segments(&mut self, list: Val) -> Result<(), CaptureError> {
        let t = self.t;
        if !t.is_seq(list) {
            let what = t.describe(list);
            return Err(self.shape_error(&format!("`segments` is {what}, expected a list")));
        }
        let items = t.items(list);
        self.snap.segments.reserve(items.len());
        for (si, &seg) in items.iter().enumerate() {
            if !t.is_dict(seg) {
                let what = t.describe(seg);
                return Err(self.shape_error(&format!("segments[{si}] is {what}, expected a dict")));
            }
            let [
                device,
                address,
                total,
                allocated,
                active,
                requested,
                stream,
                stype,
                pool,
                expandable,
                frames,
                blocks,
            ] = self.fields(seg, SEGMENT_KEYS);
            let seg_addr = self.uint(address);
            let stack = match frames {
                Some(f) => self.stack(f)?,
                None => None,
            };
            let mut seg_model = Segment {
                device: self.int(device).unwrap_or(0),
                address: seg_addr,
                total_size: self.uint(total),
                allocated_size: self.uint(allocated),
                active_size: self.uint(active),
                requested_size: self.uint(requested),
                stream: self.uint(stream),
                segment_type: stype.and_then(|v| t.str(v)).map(str::to_string),
                is_expandable: expandable.and_then(|v| t.bool(v)).unwrap_or(false),
                pool_id: pool.and_then(|p| {
                    let it = t.items(p);
                    match it {
                        [a, b] => Some((t.int(*a)?, t.int(*b)?)),
                        _ => None,
                    }
                }),
                stack,
                blocks: Vec::new(),
            };
            if let Some(bl) = blocks {
                let bitems = t.items(bl);
                seg_model.blocks.reserve(bitems.len());
                let mut next_addr = seg_addr;
                for (bi, &blk) in bitems.iter().enumerate() {
                    if !t.is_dict(blk) {
                        let what = t.describe(blk);
                        return Err(self.shape_error(&format!(
                            "segments[{si}].blocks[{bi}] is {what}, expected a dict"
                        )));
                    }
                    let [baddr, size, req, state, bframes, history] = self.fields(blk, BLOCK_KEYS);
                    let size = self.uint(size);
                    let address = if baddr.is_some() {
                        self.uint(baddr)
                    } else {
                        next_addr
                    };
                    next_addr = address.saturating_add(size);
                    let state = match state.and_then(|s| t.str(s)) {
                        Some(s) => BlockState::parse(s),
                        None => BlockState::Other(String::from("<missing>")),
                    };
                    let mut requested_size = req.map(|r| self.uint(Some(r)));
                    let mut stack = match bframes {
                        Some(f) => self.stack(f)?,
                        None => None,
                    };
                    let mut history_len = 0u32;
                    if let Some(h) = history {
                        let hitems = t.items(h);
                        history_len = hitems.len().min(u32::MAX as usize) as u32;
                        if let Some(&last) = hitems.last() {
                            let [_, real_size, hframes] = self.fields(last, HISTORY_KEYS);
                            if bframes.is_none() {
                                stack = match hframes {
                                    Some(f) => self.stack(f)?,
                                    None => None,
                                };
                            }
                            if requested_size.is_none() {
                                requested_size = Some(self.uint(real_size));
                            }
                        }
                    }
                    seg_model.blocks.push(Block {
                        address,
                        size,
                        requested_size: requested_size.unwrap_or(0),
                        state,
                        stack,
                        history_len,
                    });
                }
            }
            self.snap.segments.push(seg_model);
        }
        Ok(())
    }

    fn traces(
        &mut self,
        traces: Val,
        opts: &DecodeOptions,
        streamed: Streamed,
    ) -> Result<(), CaptureError> {
        let t = self.t;
        if !t.is_seq(traces) {
            let what = t.describe(traces);
            return Err(self.shape_error(&format!(
                "`device_traces` is {what}, expected a list of lists"
            )));
        }
        let mut streamed = streamed.unwrap_or_default();
        let mut all = Vec::new();
        for (d, &dev) in t.items(traces).iter().enumerate() {
            if let Some(ordinal) = t.streamed_ordinal(dev) {
                // Entries arrived through the sink while decoding.
                let (entries, dropped) = streamed
                    .get_mut(ordinal as usize)
                    .map(std::mem::take)
                    .unwrap_or_default();
                self.snap.dropped_trace_entries += dropped;
                all.push(entries);
                continue;
            }
            if !t.is_seq(dev) {
                let what = t.describe(dev);
                return Err(
                    self.shape_error(&format!("device_traces[{d}] is {what}, expected a list"))
                );
            }
            let items = t.items(dev);
            let skip = match opts.max_trace_events {
                Some(cap) if items.len() > cap => items.len() - cap,
                _ => 0,
            };
            self.snap.dropped_trace_entries += skip as u64;
            let mut entries = Vec::with_capacity(items.len() - skip);
            let mut action_cache: FxHashMap<Val, Action> = FxHashMap::default();
            for (i, &e) in items.iter().enumerate().skip(skip) {
                if !t.is_dict(e) {
                    let what = t.describe(e);
                    return Err(self.shape_error(&format!(
                        "device_traces[{d}][{i}] is {what}, expected a dict"
                    )));
                }
                let [action, addr, size, stream, time_us, device_free, frames] =
                    self.fields(e, TRACE_KEYS);
                let action = match action {
                    Some(a) => match action_cache.get(&a) {
                        Some(&act) => act,
                        None => {
                            let act = self.interner.action(t.str(a).unwrap_or("<not a str>"));
                            action_cache.insert(a, act);
                            act
                        }
                    },
                    None => self.interner.action("<missing>"),
                };
                let stack = match frames {
                    Some(f) => self.stack(f)?,
                    None => None,
                };
                entries.push(
                    TraceEntry::new(action, self.uint(addr), self.uint(size), self.uint(stream))
                        .with_time_us(self.int(time_us))
                        .with_device_free(device_free.map(|v| self.uint(Some(v))))
                        .with_stack(stack),
                );
            }
            all.push(entries);
        }
        self.snap.device_traces = Some(all);
        Ok(())
    }

    fn settings(&mut self, s: Val) {
        let t = self.t;
        let mut st = AllocatorSettings::default();
        for (k, v) in t.pairs(s) {
            match t.str(k) {
                Some("PYTORCH_CUDA_ALLOC_CONF") | Some("PYTORCH_ALLOC_CONF") => {
                    st.conf = t.str(v).map(str::to_string)
                }
                Some("expandable_segments") => st.expandable_segments = t.bool(v),
                Some("max_split_size") => {
                    st.max_split_size = t.int128(v).and_then(|i| u64::try_from(i).ok())
                }
                Some("garbage_collection_threshold") => {
                    st.garbage_collection_threshold =
                        t.float(v).or_else(|| t.int128(v).map(|i| i as f64))
                }
                Some("roundup_power2_divisions") => {
                    st.roundup_power2_divisions = Some(roundup_divisions(t, v))
                }
                _ => {}
            }
        }
        self.snap.allocator_settings = Some(st);
    }

    fn stack(&mut self, list: Val) -> Result<Option<StackId>, CaptureError> {
        let t = self.t;
        self.interner
            .stack(t, list)
            .map_err(|m| self.shape_error(&m))
    }
}

mod compile_context;
mod extras;

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Tests: never start the interning thread.
        pub(super) static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// What `python3 ARGS…` writes to stdout (the test fails if it fails).
    fn python(args: &[&str]) -> Vec<u8> {
        let out = std::process::Command::new("python3")
            .args(args)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    fn load_py(script: &str) -> Result<Snapshot, CaptureError> {
        let bytes = python(&["-c", script]);
        decode_snapshot(Path::new("t.pickle"), &bytes, &DecodeOptions::default())
    }

    #[test]
    fn torch20_blocks_get_addresses_and_history_stacks() {
        let s = load_py(
            r#"
import pickle, sys
f = {'filename': '/w/train.py', 'name': 'step', 'line': 12}
seg = {'device': 0, 'address': 1000, 'total_size': 3072, 'allocated_size': 1024, 'active_size': 1024,
       'requested_size': 1000, 'stream': 0, 'segment_type': 'small',
       'blocks': [{'size': 1024, 'requested_size': 1000, 'state': 'active_allocated',
                   'history': [{'addr': 1000, 'real_size': 1000, 'frames': [f]}]},
                  {'size': 2048, 'requested_size': 0, 'state': 'inactive'}]}
sys.stdout.buffer.write(pickle.dumps({'segments': [seg], 'device_traces': [[]]}, protocol=4))
"#,
        )
        .unwrap();
        let b = &s.segments[0].blocks;
        assert_eq!((b[0].address, b[1].address), (1000, 2024));
        assert_eq!(b[0].history_len, 1);
        let frames: Vec<_> = s.stack_frames(b[0].stack).collect();
        assert_eq!(frames[0].filename, "/w/train.py");
        assert_eq!(frames[0].line, 12);
        assert_eq!(s.device_traces.as_ref().map(|t| t.len()), Some(1));
    }

    #[test]
    fn allocator_settings_keep_roundup_divisions_and_gc_threshold() {
        let json = br#"{"segments": [], "device_traces": [[]], "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[256:4,>:8]",
            "max_split_size": -1, "garbage_collection_threshold": 0.0,
            "expandable_segments": false,
            "roundup_power2_divisions": {"1": 0, "2": 0, "256": 4, "512": 8, "32768": 8,
                                         "3": 99, "x": 5}}}"#;
        let s = decode_snapshot(Path::new("t.json"), json, &DecodeOptions::default()).unwrap();
        let st = s.allocator_settings.unwrap();
        assert_eq!(st.max_split_size, None, "-1 is unlimited");
        assert_eq!(st.garbage_collection_threshold, Some(0.0));
        let d = st.roundup_power2_divisions.unwrap();
        assert_eq!(d.len(), 16);
        assert_eq!((d[0], d[1], d[8], d[9], d[15]), (0, 0, 4, 8, 8));
        assert_eq!(
            d.iter().filter(|&&x| x == 99 || x == 5).count(),
            0,
            "bad keys ignored"
        );
        // Hostile values: negative or huge divisions read as 0, never panic.
        let json = br#"{"segments": [], "allocator_settings": {"roundup_power2_divisions":
            {"1": -4, "1024": 1.5e300, "9223372036854775808": 2}}}"#;
        let s = decode_snapshot(Path::new("t.json"), json, &DecodeOptions::default()).unwrap();
        let d = s
            .allocator_settings
            .unwrap()
            .roundup_power2_divisions
            .unwrap();
        assert_eq!((d[0], d[10], d[15]), (0, 0, 2));
    }

    #[test]
    fn shared_stacks_are_interned_once_and_max_trace_events_drops_oldest() {
        let s = load_py(
            r#"
import pickle, sys
f = {'name': 'fwd', 'filename': '/w/m.py', 'line': 3}
st = [f, {'name': '??', 'filename': '??', 'line': 0}]
tr = [{'action': 'alloc', 'addr': i, 'size': 512, 'stream': 0, 'time_us': i, 'frames': st} for i in range(10)]
sys.stdout.buffer.write(pickle.dumps({'segments': [], 'device_traces': [tr, []]}, protocol=4))
"#,
        )
        .unwrap();
        assert_eq!(s.stacks.len(), 1);
        assert_eq!(s.frames.len(), 2);
        let bytes = python(&[
            "-c",
            "import pickle,sys; tr=[{'action':'alloc','addr':i,'size':1,'stream':0} for i in range(10)]; sys.stdout.buffer.write(pickle.dumps({'segments':[],'device_traces':[tr]}))",
        ]);
        let s = decode_snapshot(
            Path::new("t"),
            &bytes,
            &DecodeOptions {
                max_trace_events: Some(3),
                ..DecodeOptions::default()
            },
        )
        .unwrap();
        let tr = &s.device_traces.unwrap()[0];
        assert_eq!(tr.len(), 3);
        assert_eq!(tr[0].addr, 7);
        assert_eq!(s.dropped_trace_entries, 7);
    }

    #[test]
    fn fresh_frames_lists_intern_by_content_and_long_stacks_stay_whole() {
        // Real sharing: each alloc and free_requested has its own list, free_completed shares
        // the free_requested one; one 1500-frame stack arrives in two APPENDS batches.
        let s = load_py(
            r#"
import pickle, sys
f = {'name': 'fwd', 'filename': '/w/m.py', 'line': 3}
c = {'name': 'c10::alloc()', 'filename': '??', 'line': 0}
tr = []
for i in range(4):
    tr.append({'action': 'alloc', 'addr': i, 'size': 512, 'stream': 0, 'frames': [c, f]})
    fs = [c, c, f]
    tr.append({'action': 'free_requested', 'addr': i, 'size': 512, 'stream': 0, 'frames': fs})
    tr.append({'action': 'free_completed', 'addr': i, 'size': 512, 'stream': 0, 'frames': fs})
tr.append({'action': 'alloc', 'addr': 9, 'size': 512, 'stream': 0, 'frames': [f] * 1499 + [c]})
tr.append({'action': 'oom', 'size': 1, 'device_free': 0, 'stream': 0, 'frames': []})
sys.stdout.buffer.write(pickle.dumps({'segments': [], 'device_traces': [tr]}, protocol=4))
"#,
        )
        .unwrap();
        let tr = &s.device_traces.as_ref().unwrap()[0];
        assert_eq!(tr.len(), 14);
        let used: std::collections::HashSet<_> = tr.iter().filter_map(|e| e.stack()).collect();
        assert_eq!(used.len(), 3, "two short stacks and the long one");
        assert_eq!(tr[0].stack(), tr[3].stack());
        assert_eq!(tr[1].stack(), tr[2].stack());
        assert_ne!(tr[0].stack(), tr[1].stack());
        let long: Vec<_> = s.stack_frames(tr[12].stack()).collect();
        assert_eq!(long.len(), 1500);
        assert_eq!(long[1499].name, "c10::alloc()");
        assert_eq!(long[0].filename, "/w/m.py");
        assert_eq!(tr[13].stack(), None, "an empty frames list is no stack");
    }

    #[test]
    fn unshared_frame_dicts_read_as_the_shared_ones() {
        // The same trace written with frame dicts shared (as torch writes them) and with a fresh
        // dict per frame: an empty one, one with a single key (SETITEM), one with 1,500 keys
        // (two SETITEMS batches, the later one naming the line again), one that refers to
        // itself, one dict of a trace entry referenced again by a later entry, and by a segment
        // written after the traces.
        let script = |fresh: bool| {
            format!(
                r#"
import pickle, sys
fresh = {fresh}
f = {{'name': 'fwd', 'filename': '/w/m.py', 'line': 3}}
c = {{'name': 'c10::alloc()', 'filename': '??', 'line': 0}}
big = {{f'k{{i}}': i for i in range(1500)}}
big.update(name='wide', filename='/w/w.py')
big['line'] = 7
d = (lambda x: dict(x)) if fresh else (lambda x: x)
tr = []
for i in range(3):
    tr.append({{'action': 'alloc', 'addr': i, 'size': 512, 'stream': 0, 'frames': [d(c), d(f), {{}}]}})
    tr.append({{'action': 'free_requested', 'addr': i, 'size': 512, 'stream': 0, 'frames': [d(c), {{'name': 'one'}}]}})
    tr.append({{'action': 'free_completed', 'addr': i, 'size': 512, 'stream': 0, 'frames': [d(big)]}})
shared = d(f)
tr.append({{'action': 'alloc', 'addr': 8, 'size': 512, 'stream': 0, 'frames': [shared, d(c)]}})
tr.append({{'action': 'alloc', 'addr': 9, 'size': 512, 'stream': 0, 'frames': [d(c), shared]}})
me = {{'name': 'me'}}
me['self'] = me  # refers to itself before its items are in
tr.append({{'action': 'alloc', 'addr': 10, 'size': 512, 'stream': 0, 'frames': [me]}})
seg = {{'device': 0, 'address': 0, 'total_size': 2097152, 'allocated_size': 512,
        'active_size': 512, 'requested_size': 512, 'stream': 0, 'segment_type': 'small',
        'blocks': [{{'address': 9, 'size': 512, 'requested_size': 512, 'state': 'active_allocated',
                    'frames': [shared]}}]}}
snap = {{'device_traces': [tr], 'segments': [seg]}}
sys.stdout.buffer.write(pickle.dumps(snap, protocol=4))
"#,
                fresh = if fresh { "True" } else { "False" }
            )
        };
        let frames_of = |s: &Snapshot| -> Vec<Vec<(String, String, u64)>> {
            let tr = &s.device_traces.as_ref().unwrap()[0];
            let mut out: Vec<Vec<(String, String, u64)>> = tr
                .iter()
                .map(|e| {
                    s.stack_frames(e.stack())
                        .map(|f| (f.name.clone(), f.filename.clone(), f.line))
                        .collect()
                })
                .collect();
            out.push(
                s.stack_frames(s.segments[0].blocks[0].stack)
                    .map(|f| (f.name.clone(), f.filename.clone(), f.line))
                    .collect(),
            );
            out
        };
        let shared = load_py(&script(false)).unwrap();
        let fresh = load_py(&script(true)).unwrap();
        let (a, b) = (frames_of(&shared), frames_of(&fresh));
        assert_eq!(a, b);
        let t = |n: &str, f: &str, l: u64| (n.to_string(), f.to_string(), l);
        assert_eq!(
            b[0],
            vec![
                t("c10::alloc()", "??", 0),
                t("fwd", "/w/m.py", 3),
                t("", "", 0)
            ]
        );
        assert_eq!(b[1], vec![t("c10::alloc()", "??", 0), t("one", "", 0)]);
        assert_eq!(b[2], vec![t("wide", "/w/w.py", 7)]);
        assert_eq!(b[11], vec![t("me", "", 0)]);
        assert_eq!(b[12], vec![t("fwd", "/w/m.py", 3)], "the segment's block");
        // Stacks and frames are interned by content in both.
        assert_eq!(shared.stacks.len(), fresh.stacks.len());
        assert_eq!(shared.frames.len(), fresh.frames.len());
    }

    #[test]
    fn repeated_frames_lists_reuse_their_stack_and_a_hash_collision_decodes_again() {
        // Three distinct stacks, each allocated many times: from the second time on, a list's
        // run of memo references is recognised and not decoded again.
        let script = r#"
import pickle, sys
fs = [{'name': f'f{i}', 'filename': f'/w/m{i}.py', 'line': i} for i in range(6)]
shapes = [[fs[0], fs[1]], [fs[2], fs[3], fs[4]], [fs[5], fs[0]]]
tr = []
for i in range(300):
    st = list(shapes[i % 3])
    tr.append({'action': 'alloc', 'addr': i, 'size': 512, 'stream': 0, 'frames': st})
sys.stdout.buffer.write(pickle.dumps({'segments': [], 'device_traces': [tr]}, protocol=4))
"#;
        let names = |s: &Snapshot| -> Vec<Vec<String>> {
            s.device_traces.as_ref().unwrap()[0]
                .iter()
                .map(|e| s.stack_frames(e.stack()).map(|f| f.name.clone()).collect())
                .collect()
        };
        let plain = load_py(script).unwrap();
        let got = names(&plain);
        assert_eq!(got.len(), 300);
        assert_eq!(got[0], ["f0", "f1"]);
        assert_eq!(got[1], ["f2", "f3", "f4"]);
        assert_eq!(got[299], ["f5", "f0"]);
        assert_eq!(plain.stacks.len(), 3);
        crate::torch::intern::COLLIDE.with(|c| c.set(true));
        let collided = load_py(script);
        crate::torch::intern::COLLIDE.with(|c| c.set(false));
        assert_eq!(
            names(&collided.unwrap()),
            got,
            "decoded again without the cache"
        );
    }

    #[test]
    fn a_frames_list_appended_to_after_its_entry_has_its_final_content_as_in_python() {
        // Hand-written: entry 1 has L = [f0]; then `L.append(f0)` through a memo reference; entry
        // 2 refers to L. pickle.loads gives both entries [f0, f0].
        let data = b"\x80\x04}\x94\x8c\rdevice_traces\x94]\x94]\x94(}\x94(\x8c\x06frames\x94]\x94(}\x94(\x8c\x04name\x94\x8c\x02f0\x94ue\x8c\x06action\x94\x8c\x05alloc\x94uh\x06h\x07a0}\x94(h\x05h\x06h\nh\x0bueas.";
        let s = decode_snapshot(Path::new("t.pickle"), data, &DecodeOptions::default()).unwrap();
        let tr = &s.device_traces.as_ref().unwrap()[0];
        assert_eq!(tr.len(), 2);
        for e in tr {
            let names: Vec<_> = s.stack_frames(e.stack()).map(|f| f.name.as_str()).collect();
            assert_eq!(names, ["f0", "f0"]);
        }
    }

    #[test]
    fn a_large_snapshot_loads_the_same_threaded_inline_and_without_the_run_cache() {
        // The benchmark's generator at ~10 MB: above THREAD_FROM, so the worker thread runs.
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/gen_snapshot.py");
        let bytes = python(&[script, "/dev/stdout", "45000"]);
        assert!(bytes.len() >= THREAD_FROM, "{} bytes", bytes.len());
        let load = || decode_snapshot(Path::new("big.pickle"), &bytes, &DecodeOptions::default());
        type Row = (Action, u64, u64, Option<i64>, Vec<String>);
        let view = |s: &Snapshot| -> Vec<Row> {
            s.device_traces.as_ref().unwrap()[0]
                .iter()
                .map(|e| {
                    let frames = s.stack_frames(e.stack()).map(|f| f.name.clone()).collect();
                    (e.action, e.addr, e.size, e.time_us(), frames)
                })
                .collect()
        };
        let threaded = view(&load().unwrap());
        assert_eq!(threaded.len(), 45_000);
        assert!(
            threaded.iter().all(|e| !e.4.is_empty()),
            "every entry has its stack"
        );
        INLINE.with(|c| c.set(true));
        let inline = view(&load().unwrap());
        crate::torch::intern::COLLIDE.with(|c| c.set(true));
        let no_cache = view(&load().unwrap());
        crate::torch::intern::COLLIDE.with(|c| c.set(false));
        INLINE.with(|c| c.set(false));
        assert!(threaded == inline, "threaded and inline loads differ");
        assert!(threaded == no_cache, "the run cache changed a stack");
    }

    #[test]
    fn json_form_loads_like_the_pickle() {
        let json = br#"{"segments":[{"device":0,"address":4096,"total_size":2097152,"allocated_size":512,
            "active_size":512,"requested_size":100,"stream":0,"segment_type":"small","segment_pool_id":[0,0],
            "is_expandable":false,"frames":[],"blocks":[{"address":4096,"size":512,"requested_size":100,
            "state":"active_allocated","frames":[{"name":"f","filename":"/w/a.py","line":7}]},
            {"address":4608,"size":2096640,"requested_size":0,"state":"inactive","frames":[]}]}],
            "device_traces":[[{"action":"oom","device_free":1024,"size":4096,"stream":0,"frames":[]}]]}"#;
        let s = decode_snapshot(Path::new("s.json"), json, &DecodeOptions::default()).unwrap();
        assert_eq!(s.segments[0].pool_id, Some((0, 0)));
        assert_eq!(s.segments[0].blocks[0].state, BlockState::ActiveAllocated);
        let tr = &s.device_traces.unwrap()[0];
        assert_eq!(tr[0].action, Action::Oom);
        assert_eq!(tr[0].device_free(), Some(1024));
        assert_eq!(tr[0].stack(), None);
    }

    #[test]
    fn json_streams_its_trace_and_reads_as_python_does() {
        // Escaped strings, a repeated key (the last value counts, as in json.load), a frame
        // with an extra nested value, an empty frames list, and the top-level keys in file order.
        let json = br#"{"device_traces":[[
            {"action":"alloc","addr":4096,"size":1,"size":512,"stream":0,"frames":[
                {"name":"f\u00e9","filename":"C:\\w\\a.py","line":7,"extra":{"k":[1]}},
                {"name":"g","filename":"/w/b.py","line":9}]},
            {"action":"free_requested","addr":4096,"size":512,"stream":0,"frames":[]}]],
            "segments":[]}"#;
        let s = decode_snapshot(Path::new("s.json"), json, &DecodeOptions::default()).unwrap();
        assert_eq!(s.top_level_keys, vec!["device_traces", "segments"]);
        let tr = &s.device_traces.as_ref().unwrap()[0];
        assert_eq!((tr[0].size, tr[1].stack()), (512, None));
        let f: Vec<_> = s.stack_frames(tr[0].stack()).collect();
        assert_eq!(
            (f[0].name.as_str(), f[0].filename.as_str()),
            ("fé", r"C:\w\a.py")
        );
        assert_eq!((f[1].name.as_str(), f[1].line), ("g", 9));
        // A trace item that is not a dict: the same error as in a pickle, where it stands.
        let json = br#"{"segments":[],"device_traces":[[{"action":"alloc"}, 7]]}"#;
        let e = decode_snapshot(Path::new("s.json"), json, &DecodeOptions::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("an item of `device_traces` is an int, expected a dict"),
            "{e}"
        );
        assert_eq!(e.offset, Some(53));
    }

    #[test]
    fn json_decodes_to_the_snapshot_its_document_tree_gives() {
        // The streaming decoder against serde_json's document tree converted to the same graph
        // (the previous way), on a bigger JSON form: the same snapshot.
        let bytes = python(&[
            "-c",
            r#"
import json, sys
fs = [{'name': f'f{i}', 'filename': f'/w/m{i % 3}.py', 'line': i} for i in range(40)]
tr = []
for i in range(300):
    tr.append({'action': 'alloc', 'addr': 4096 * i, 'size': 512, 'stream': 0, 'time_us': i,
               'frames': fs[i % 7:i % 7 + 20]})
    tr.append({'action': 'free_requested', 'addr': 4096 * i, 'size': 512, 'stream': 0,
               'frames': fs[:3]})
    tr.append({'action': 'free_completed', 'addr': 4096 * i, 'size': 512, 'stream': 0, 'frames': []})
seg = {'device': 0, 'address': 0, 'total_size': 2097152, 'allocated_size': 0, 'active_size': 0,
       'requested_size': 0, 'stream': 0, 'segment_type': 'small',
       'blocks': [{'address': 0, 'size': 2097152, 'requested_size': 0, 'state': 'inactive',
                   'frames': fs[:2]}]}
sys.stdout.write(json.dumps({'segments': [seg], 'device_traces': [tr, []]}))
"#,
        ]);
        let path = Path::new("s.json");
        let opts = DecodeOptions::default();
        let streamed = decode_snapshot(path, &bytes, &opts).unwrap();
        let tree = tree_from_json(path, &bytes).unwrap();
        let whole = build(path, bytes.len(), &tree, &opts, Interner::default(), None).unwrap();
        use crate::torch::model::Frame;
        let frames = |s: &Snapshot| -> Vec<Vec<Frame>> {
            let mut v: Vec<Vec<Frame>> = s
                .device_traces
                .iter()
                .flatten()
                .flatten()
                .map(|e| s.stack_frames(e.stack()).cloned().collect())
                .collect();
            v.extend(
                s.segments
                    .iter()
                    .flat_map(|g| &g.blocks)
                    .map(|b| s.stack_frames(b.stack).cloned().collect()),
            );
            v
        };
        assert_eq!(frames(&streamed), frames(&whole));
        assert_eq!(frames(&streamed).len(), 901);
        type Entry = (Action, u64, u64, Option<i64>);
        let strip = |s: &Snapshot| -> Vec<Vec<Entry>> {
            s.device_traces
                .iter()
                .flatten()
                .map(|t| {
                    t.iter()
                        .map(|e| (e.action, e.addr, e.size, e.time_us()))
                        .collect()
                })
                .collect()
        };
        assert_eq!(strip(&streamed), strip(&whole));
        // Stack ids are numbered in the order stacks are met (compared by content above).
        let segs = |s: &Snapshot| {
            let mut v = s.segments.clone();
            v.iter_mut()
                .flat_map(|g| &mut g.blocks)
                .for_each(|b| b.stack = None);
            v
        };
        assert_eq!(segs(&streamed), segs(&whole));
    }

    #[test]
    fn code_and_garbage_are_refused_with_offsets() {
        let e = decode_snapshot(
            Path::new("evil.pickle"),
            b"cos\nsystem\n(S'touch MARKER'\ntR.",
            &DecodeOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.offset, Some(0));
        assert!(e.to_string().contains("os.system"), "{e}");
        let e = decode_snapshot(
            Path::new("x.pickle"),
            b"\x80\x04K\x01.",
            &DecodeOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("top-level object is an int"), "{e}");
        let e = decode_snapshot(
            Path::new("x.json"),
            b"{\"segments\": [",
            &DecodeOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Truncated);
    }
}
