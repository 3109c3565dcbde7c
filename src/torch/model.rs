//! The PyTorch CUDA memory snapshot as plain Rust data (no IO, no pickle types).
//!
//! Frames and stacks are interned once per snapshot and shared by id, the way PyTorch built them:
//! a block and its `alloc` trace entry point at the same `StackId`.

/// Index into [`Snapshot::frames`].
pub type FrameId = u32;
/// Index into [`Snapshot::stacks`].
pub type StackId = u32;

/// One stack frame: `{name, filename, line}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub name: String,
    pub filename: String,
    /// Line as recorded (C++ frames use 0; a Python −1 shows as 2^64−1).
    pub line: u64,
}

/// Allocator state of a block.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
    /// Any other string (none is emitted by a known release; kept, never dropped).
    Other(String),
}

impl BlockState {
    pub fn parse(s: &str) -> BlockState {
        match s {
            "active_allocated" => BlockState::ActiveAllocated,
            "active_pending_free" | "active_awaiting_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            other => BlockState::Other(other.to_string()),
        }
    }
    pub fn as_str(&self) -> &str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
            BlockState::Other(s) => s,
        }
    }
}

/// A piece of a segment.
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// Address (2.0 files: computed from the segment address + preceding sizes).
    pub address: u64,
    /// Rounded block size.
    pub size: u64,
    /// Bytes the caller asked for (stale on inactive blocks; 2.0: last `history` item's `real_size`).
    pub requested_size: u64,
    pub state: BlockState,
    /// Allocation stack (2.1+: block `frames`; 2.0: frames of the last `history` entry).
    pub stack: Option<StackId>,
    /// 2.0 files: number of `history` entries on the block (0 otherwise).
    pub history_len: u32,
}

/// One cudaMalloc'd range (for expandable segments: one contiguous mapped range).
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    /// Fields as recorded by the allocator (for cross-checks).
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    /// `"large"` / `"small"`; `None` when absent.
    pub segment_type: Option<String>,
    pub is_expandable: bool,
    /// `(a, b)` of `segment_pool_id`; `None` when absent.
    pub pool_id: Option<(i64, i64)>,
    pub stack: Option<StackId>,
    pub blocks: Vec<Block>,
}

/// Requests up to this size (after rounding) come from the small pool's 2 MiB segments
/// (PyTorch's `kSmallSize`); larger ones from the large pool.
pub const SMALL_SIZE: u64 = 1 << 20;

impl Segment {
    /// Whether this segment's blocks can serve a request of `size` bytes on `stream`: only a
    /// segment of the request's pool and stream can (a small request fails while large-pool
    /// pieces sit inactive, and the other way round). A segment of unknown type may be either.
    pub fn serves(&self, stream: u64, size: u64) -> bool {
        let small = size <= SMALL_SIZE;
        self.stream == stream
            && match self.segment_type.as_deref() {
                Some("small") => small,
                Some("large") => !small,
                _ => true,
            }
    }
}

/// `device_traces[d][i].action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    Annotate,
    /// Any other action string: its index in [`Snapshot::other_actions`] (a byte, so that
    /// millions of entries stay small; the 256th and later distinct names share the last index).
    Other(u8),
}

impl Action {
    /// The action a known action string names (`None` for any other string).
    pub fn known(s: &str) -> Option<Action> {
        Some(match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            "annotate" => Action::Annotate,
            _ => return None,
        })
    }
    /// The action string; for [`Action::Other`] see [`Snapshot::action_name`].
    pub fn as_str(&self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Annotate => "annotate",
            Action::Other(_) => "other",
        }
    }
}

/// One entry of a device's trace (oldest first). 40 bytes: a large snapshot holds millions, so
/// the optional fields are flags rather than `Option`s; read them with the accessors.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEntry {
    /// Block / segment address (0 for `snapshot`). An `oom` entry's `device_free` is kept here,
    /// as torch's own trace entry keeps it (its pickle writes the field as `device_free` instead
    /// of `addr`); read it with [`TraceEntry::device_free`].
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    time_us: i64,
    /// `u32::MAX`: none.
    stack: u32,
    pub action: Action,
    /// `HAS_TIME` | `HAS_DEVICE_FREE`.
    has: u8,
}

const HAS_TIME: u8 = 1;
const HAS_DEVICE_FREE: u8 = 2;

impl TraceEntry {
    pub fn new(action: Action, addr: u64, size: u64, stream: u64) -> TraceEntry {
        TraceEntry {
            addr,
            size,
            stream,
            time_us: 0,
            stack: u32::MAX,
            action,
            has: 0,
        }
    }
    /// µs since the epoch (torch ≥ 2.2).
    pub fn time_us(&self) -> Option<i64> {
        (self.has & HAS_TIME != 0).then_some(self.time_us)
    }
    /// `oom` only: bytes free according to cudaMemGetInfo.
    pub fn device_free(&self) -> Option<u64> {
        (self.action == Action::Oom && self.has & HAS_DEVICE_FREE != 0).then_some(self.addr)
    }
    /// `None` when the entry has no `frames` key (or an empty one).
    pub fn stack(&self) -> Option<StackId> {
        (self.stack != u32::MAX).then_some(self.stack)
    }
    pub fn set_time_us(&mut self, t: Option<i64>) {
        self.time_us = t.unwrap_or(0);
        self.has = (self.has & !HAS_TIME) | if t.is_some() { HAS_TIME } else { 0 };
    }
    /// `oom` entries only (torch records `device_free` for nothing else; on another action the
    /// value is not kept). Set the action first.
    pub fn set_device_free(&mut self, f: Option<u64>) {
        if self.action != Action::Oom {
            return;
        }
        match f {
            Some(v) => {
                self.addr = v;
                self.has |= HAS_DEVICE_FREE;
            }
            None if self.has & HAS_DEVICE_FREE != 0 => {
                self.addr = 0;
                self.has &= !HAS_DEVICE_FREE;
            }
            None => {}
        }
    }
    /// Stack ids are below `u32::MAX` (the loader refuses more stacks).
    pub fn set_stack(&mut self, s: Option<StackId>) {
        self.stack = s.filter(|&s| s != u32::MAX).unwrap_or(u32::MAX);
    }
    pub fn with_time_us(mut self, t: Option<i64>) -> TraceEntry {
        self.set_time_us(t);
        self
    }
    pub fn with_device_free(mut self, f: Option<u64>) -> TraceEntry {
        self.set_device_free(f);
        self
    }
    pub fn with_stack(mut self, s: Option<StackId>) -> TraceEntry {
        self.set_stack(s);
        self
    }
}

/// How the top-level object was shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotFormat {
    /// `{segments, device_traces, …}`.
    Dict,
    /// A bare list of segments (`torch.cuda.memory_snapshot()`), no trace.
    SegmentList,
}

/// The subset of `allocator_settings` the analyses use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllocatorSettings {
    /// `PYTORCH_CUDA_ALLOC_CONF` string as recorded.
    pub conf: Option<String>,
    pub expandable_segments: Option<bool>,
    /// `None` = unlimited (recorded as −1).
    pub max_split_size: Option<u64>,
    /// `roundup_power2_divisions` (2.3+): divisions per size interval, index `i` covering
    /// requests in `[2^i MiB, 2^(i+1) MiB)` (index 0 also covers smaller ones, the last one all
    /// larger), read from the recorded `{"1": d, "2": d, …, "32768": d}`; 0 = plain 512 B rounding.
    /// `None` when absent.
    pub roundup_power2_divisions: Option<Vec<u64>>,
    /// `garbage_collection_threshold` (0 = off).
    pub garbage_collection_threshold: Option<f64>,
}

/// `external_annotations[i].stage` (torch 2.5+): a `record_function` scope entered or left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnnotationStage {
    Start,
    End,
}

/// One `external_annotations` entry (torch 2.5+, FORMAT.md §8): a user `record_function` scope
/// (`Optimizer.step#AdamW.step`, `enumerate(DataLoader)#…`, `… (dynamo_timed)`) entered or left
/// on one device at one time.
#[derive(Clone, Debug, PartialEq)]
pub struct Annotation {
    pub name: String,
    pub stage: AnnotationStage,
    pub device: i64,
    /// µs since the epoch, on the trace entries' clock.
    pub time_us: Option<i64>,
}

/// What the snapshot says about one device's trace ring buffer (`trace_alloc_overflowed`,
/// `trace_alloc_max_entries`, PyTorch 2026; layout [unverified]: a list by device, a dict keyed
/// by device, or one value for every device).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RingBuffer {
    pub device: i64,
    pub overflowed: Option<bool>,
    pub max_entries: Option<u64>,
}

/// The pinned host allocator (`host_segments`, `host_traces`; torch 2.14 with
/// `record_pinned_host_memory=True`; layout [unverified], read like device segments).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostMemory {
    pub segments: u64,
    /// Σ `total_size` (or `size`) of the host segments.
    pub reserved_bytes: u64,
    /// Σ `allocated_size`, or of the `active_allocated` blocks' sizes.
    pub allocated_bytes: u64,
    pub trace_entries: u64,
}

/// A whole snapshot file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub format: Option<SnapshotFormat>,
    /// Pickle protocol from the PROTO opcode (`None` for JSON or protocol < 2).
    pub pickle_protocol: Option<u8>,
    /// Keys of the top-level dict in file order (empty for a segment list).
    pub top_level_keys: Vec<String>,
    pub segments: Vec<Segment>,
    /// One list per device allocator; `None` when the file has no `device_traces`.
    pub device_traces: Option<Vec<Vec<TraceEntry>>>,
    pub frames: Vec<Frame>,
    pub stacks: Vec<Vec<FrameId>>,
    /// Names of the trace actions memlsp does not know, indexed by [`Action::Other`].
    pub other_actions: Vec<String>,
    pub allocator_settings: Option<AllocatorSettings>,
    /// Oldest trace entries dropped by `--max-trace-events`, per device list.
    pub dropped_trace_entries: u64,
    /// Segments by device, built on first use (see [`Snapshot::segments_of`]).
    pub by_device: DeviceIndex,
    /// `external_annotations` in file order (empty when absent).
    pub annotations: Vec<Annotation>,
    /// Per device, where the snapshot recorded its ring buffer's state (empty when absent).
    pub ring_buffers: Vec<RingBuffer>,
    /// The pinned host allocator, when `host_segments` or `host_traces` is present.
    pub host: Option<HostMemory>,
    /// `compile_context` of trace entries (torch 2.8+), where one is recorded.
    pub compile_contexts: CompileContexts,
}

/// The `torch.compile` region each trace entry was recorded in (`compile_context`, torch 2.8+;
/// `"N/A"` outside one). Only entries with a context are kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompileContexts {
    /// Whether any trace entry has the key at all (older files: none does).
    pub recorded: bool,
    pub names: Vec<String>,
    /// Per device trace: (entry index, index into `names`), indices ascending.
    pub entries: Vec<Vec<(u32, u32)>>,
}

/// Positions in [`Snapshot::segments`] of each device's segments, built once on first use so
/// that per-device work stays linear in the devices (50,000 devices each scanning every segment
/// took 17 s). It remembers how many segments it indexed: a snapshot whose segments changed
/// afterwards is scanned instead (correct, only slower). Never part of a comparison.
#[derive(Default)]
pub struct DeviceIndex {
    index: std::sync::OnceLock<(usize, rustc_hash::FxHashMap<i64, Vec<u32>>)>,
    /// Tests: segments visited through [`Snapshot::segments_of`] (work, not time).
    #[cfg(test)]
    pub visits: std::sync::atomic::AtomicU64,
}

impl Clone for DeviceIndex {
    fn clone(&self) -> DeviceIndex {
        DeviceIndex::default()
    }
}

impl std::fmt::Debug for DeviceIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceIndex")
    }
}

impl PartialEq for DeviceIndex {
    fn eq(&self, _: &DeviceIndex) -> bool {
        true
    }
}

impl Snapshot {
    /// The action string of a trace entry.
    pub fn action_name(&self, a: Action) -> &str {
        match a {
            Action::Other(i) => self
                .other_actions
                .get(i as usize)
                .map_or("other", String::as_str),
            known => known.as_str(),
        }
    }

    /// Frames of a stack, innermost first (empty for `None`).
    /// Whether some stack has a frame that `pred` holds for (each frame tested once): an
    /// analysis that looks for blocks made under such a frame can stop before walking the trace.
    pub fn any_stack_has(&self, pred: impl Fn(&Frame) -> bool) -> bool {
        let hit: Vec<bool> = self.frames.iter().map(pred).collect();
        self.any_stack_through(&hit)
    }

    /// Whether some stack has a frame marked in `hit` (indexed by frame id).
    pub fn any_stack_through(&self, hit: &[bool]) -> bool {
        self.stacks
            .iter()
            .any(|ids| ids.iter().any(|&f| hit.get(f as usize) == Some(&true)))
    }

    pub fn stack_frames(&self, stack: Option<StackId>) -> impl Iterator<Item = &Frame> + '_ {
        let ids: &[FrameId] = match stack {
            Some(s) => self
                .stacks
                .get(s as usize)
                .map(|v| v.as_slice())
                .unwrap_or(&[]),
            None => &[],
        };
        ids.iter().filter_map(move |&f| self.frames.get(f as usize))
    }

    /// The trace of `device` (empty when it has none).
    pub fn trace(&self, device: i64) -> &[TraceEntry] {
        self.device_traces
            .as_ref()
            .and_then(|t| usize::try_from(device).ok().and_then(|d| t.get(d)))
            .map_or(&[], Vec::as_slice)
    }

    /// Segments of `device`, in file order, without scanning the others.
    pub fn segments_of(&self, device: i64) -> impl Iterator<Item = &Segment> + '_ {
        let (n, index) = self.by_device.index.get_or_init(|| {
            let mut m: rustc_hash::FxHashMap<i64, Vec<u32>> = rustc_hash::FxHashMap::default();
            for (i, s) in self.segments.iter().enumerate() {
                m.entry(s.device).or_default().push(i as u32);
            }
            (self.segments.len(), m)
        });
        let fresh = *n == self.segments.len() && self.segments.len() < u32::MAX as usize;
        let ids: &[u32] = match index.get(&device) {
            Some(v) if fresh => v,
            _ => &[],
        };
        let scan = if fresh { &[][..] } else { &self.segments[..] };
        let visit = |_: &Segment| {
            #[cfg(test)]
            self.by_device
                .visits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        };
        ids.iter()
            .map(move |&i| &self.segments[i as usize])
            .inspect(move |s| visit(s))
            .chain(
                scan.iter()
                    .inspect(move |s| visit(s))
                    .filter(move |s| s.device == device),
            )
    }

    /// Sorted union of segment devices and trace indices (ORACLE.md §2 `devices`).
    pub fn devices(&self) -> Vec<i64> {
        let mut d: Vec<i64> = self.segments.iter().map(|s| s.device).collect();
        if let Some(t) = &self.device_traces {
            d.extend(0..t.len() as i64);
        }
        d.sort_unstable();
        d.dedup();
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_serves_requests_of_its_pool_and_stream() {
        let seg = |ty: Option<&str>| Segment {
            device: 0,
            address: 0,
            total_size: 2 << 20,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 7,
            segment_type: ty.map(str::to_string),
            is_expandable: false,
            pool_id: None,
            stack: None,
            blocks: Vec::new(),
        };
        let (small, large) = (SMALL_SIZE, SMALL_SIZE + 512);
        assert!(seg(Some("small")).serves(7, small) && !seg(Some("small")).serves(7, large));
        assert!(seg(Some("large")).serves(7, large) && !seg(Some("large")).serves(7, small));
        assert!(
            seg(None).serves(7, small) && seg(None).serves(7, large),
            "unknown: either"
        );
        assert!(
            !seg(Some("small")).serves(0, small),
            "another stream's cache"
        );
    }

    #[test]
    fn trace_entries_stay_small_and_keep_their_optional_fields() {
        assert_eq!(std::mem::size_of::<TraceEntry>(), 40);
        let e = TraceEntry::new(Action::Oom, 0, 4096, 7);
        assert_eq!(
            (e.time_us(), e.device_free(), e.stack()),
            (None, None, None)
        );
        let e = e
            .with_time_us(Some(i64::MIN))
            .with_device_free(Some(0))
            .with_stack(Some(3));
        assert_eq!(e.time_us(), Some(i64::MIN));
        assert_eq!(e.device_free(), Some(0), "zero bytes free is not 'unknown'");
        assert_eq!(e.stack(), Some(3));
        let e = e.with_device_free(Some(u64::MAX));
        assert_eq!(
            (e.device_free(), e.size, e.stream),
            (Some(u64::MAX), 4096, 7)
        );
        assert_eq!(e.with_device_free(None).device_free(), None);
        // Only an OOM records free device memory; an alloc's address is never overwritten.
        let a = TraceEntry::new(Action::Alloc, 0x7f00_0000_0000, 512, 0).with_device_free(Some(1));
        assert_eq!((a.addr, a.device_free()), (0x7f00_0000_0000, None));
        let snap = Snapshot {
            other_actions: vec!["user_defined".into()],
            ..Snapshot::default()
        };
        assert_eq!(snap.action_name(Action::Other(0)), "user_defined");
        assert_eq!(snap.action_name(Action::FreeRequested), "free_requested");
    }
}
