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
use crate::torch::intern::{Interner, RUN_COLLISION};
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
mod pager;
mod sink;

use sink::{TraceSink, trace_sink};

#[cfg(test)]
mod tests;
