//! The XSpace container: plane index (by positioned reads, so listing never loads the events),
//! plane metadata (prost) and a borrowed walk over lines, events and stats (the hot path).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use prost::Message;
use rustc_hash::FxHashMap;

use super::pb::profiler as xpb;
use super::wire::{Reader, Value, WireError};
use crate::error::{CaptureError, ErrorKind};

/// Largest plane memlsp loads into memory at once (a plane is one length-delimited field).
pub const MAX_PLANE_BYTES: u64 = 8 << 30;

/// Where one `XPlane` lies in the file.
#[derive(Clone, Debug)]
pub struct PlaneIndex {
    pub name: String,
    /// Absolute offset of the plane's payload.
    pub start: u64,
    pub len: u64,
}

/// Turn a wire error into the one-line error users see.
pub fn wire_error(path: &Path, e: WireError) -> CaptureError {
    if e.truncated {
        CaptureError::new(
            path,
            ErrorKind::Truncated,
            Some(e.offset),
            format!("capture ends early: {}", e.what),
            "the profiler may still be writing it; wait for stop_trace() to finish, or re-capture",
        )
    } else {
        CaptureError::new(
            path,
            ErrorKind::Invalid,
            Some(e.offset),
            format!("not a valid XSpace protobuf: {}", e.what),
            "pass the *.xplane.pb written by jax.profiler / xprof",
        )
    }
}

/// An open capture file: its plane index, read with positioned reads.
pub struct SpaceFile {
    pub path: std::path::PathBuf,
    file: File,
    pub len: u64,
    pub planes: Vec<PlaneIndex>,
    /// The file as opened: a fault absorbed under a mapped plane is this file's only if it
    /// changed since (`xla::analyse`).
    pub watch: crate::sigbus::Watch,
    /// Planes loaded from now on walk each line twice, header first ([`Plane::for_each_event_on`]).
    exact_lines: std::sync::atomic::AtomicBool,
    /// Where the walks over the planes loaded from now on publish their position in the file
    /// (at each line and every [`RELEASE_STEP`] within one), and the flag that stops them there.
    pub progress: crate::options::Progress,
    pub cancel: crate::options::Cancel,
    /// The most a loaded plane's metadata may hold in memory, and where that number comes from
    /// (`DecodeOptions::model_budget`).
    budget: (u64, String),
}

/// What a one-pass walk returns when a line's header (id, name, timestamp) follows its events,
/// which no profiler writes but protobuf allows: read the capture again after
/// [`SpaceFile::walk_lines_exactly`].
pub(crate) const LATE_HEADER: &str = "a line's header follows its events";

impl SpaceFile {
    /// Open and index a capture: walks the top-level framing and each plane's field headers only.
    pub fn open(path: &Path) -> Result<SpaceFile, CaptureError> {
        SpaceFile::open_with(path, &crate::options::DecodeOptions::default())
    }

    /// [`SpaceFile::open`] with the decoder's limits (the model budget).
    pub fn open_with(
        path: &Path,
        opts: &crate::options::DecodeOptions,
    ) -> Result<SpaceFile, CaptureError> {
        let file = File::open(path).map_err(|e| CaptureError::io(path, &e))?;
        let len = file
            .metadata()
            .map_err(|e| CaptureError::io(path, &e))?
            .len();
        if len == 0 {
            // As for a pickle: an empty file is one being created, not a broken one.
            return Err(CaptureError::new(
                path,
                ErrorKind::Truncated,
                Some(0),
                "capture file is empty",
                "the profiler may still be writing it; re-run after stop_trace()",
            ));
        }
        let mut sf = SpaceFile {
            path: path.to_path_buf(),
            watch: crate::sigbus::Watch::new(&file),
            exact_lines: std::sync::atomic::AtomicBool::new(false),
            progress: Default::default(),
            cancel: Default::default(),
            budget: (opts.model_budget(len), opts.model_budget_rule(len)),
            file,
            len,
            planes: Vec::new(),
        };
        sf.index()?;
        Ok(sf)
    }

    fn io(&self, e: std::io::Error) -> CaptureError {
        CaptureError::io(&self.path, &e)
    }

    /// Read a field header (key, and length for wire type 2) at `pos` within `[pos, end)`.
    fn header(&self, pos: u64, end: u64, top: bool) -> Result<(u32, Hdr), CaptureError> {
        let mut buf = [0u8; 20];
        let want = (end - pos).min(20) as usize;
        self.file
            .read_exact_at(&mut buf[..want], pos)
            .map_err(|e| self.io(e))?;
        // Parse key + (length) by hand: the reader would insist on the payload being present.
        let (key, n1) = varint(&buf[..want]).ok_or_else(|| {
            wire_error(
                &self.path,
                WireError {
                    offset: pos,
                    truncated: top && want < 20,
                    what: "file ends inside a field key".into(),
                },
            )
        })?;
        let field = (key >> 3) as u32;
        let bad = |what: String, truncated: bool| {
            wire_error(
                &self.path,
                WireError {
                    offset: pos,
                    truncated,
                    what,
                },
            )
        };
        if field == 0 {
            return Err(bad(format!("invalid field key {key}"), false));
        }
        let rest = &buf[n1..want];
        let hdr = match key & 7 {
            0 => {
                let (_, n2) =
                    varint(rest).ok_or_else(|| bad("file ends inside a varint".into(), top))?;
                Hdr::Skip(n1 as u64 + n2 as u64)
            }
            1 => Hdr::Skip(n1 as u64 + 8),
            5 => Hdr::Skip(n1 as u64 + 4),
            2 => {
                let (l, n2) =
                    varint(rest).ok_or_else(|| bad("file ends inside a length".into(), top))?;
                Hdr::Len(pos + (n1 + n2) as u64, l)
            }
            w => return Err(bad(format!("unsupported wire type {w}"), false)),
        };
        let field_end = match hdr {
            Hdr::Skip(n) => pos + n,
            Hdr::Len(p, l) => p.saturating_add(l),
        };
        if field_end > end {
            let what = match hdr {
                Hdr::Len(p, l) => format!(
                    "field {field} claims {l} bytes but only {} remain",
                    end.saturating_sub(p)
                ),
                Hdr::Skip(_) => format!("field {field} runs past the end"),
            };
            return Err(bad(what, top));
        }
        Ok((field, hdr))
    }

    fn index(&mut self) -> Result<(), CaptureError> {
        let mut pos = 0u64;
        let mut planes = Vec::new();
        while pos < self.len {
            let (field, hdr) = self.header(pos, self.len, true)?;
            pos = match hdr {
                Hdr::Skip(n) => pos + n,
                Hdr::Len(start, len) => {
                    if field == 1 {
                        if len > MAX_PLANE_BYTES {
                            return Err(CaptureError::new(
                                &self.path,
                                ErrorKind::Limit,
                                Some(pos),
                                format!("one plane holds {len} bytes, above memlsp's limit"),
                                "capture a shorter window (fewer steps) with jax.profiler",
                            ));
                        }
                        planes.push(PlaneIndex {
                            name: self.plane_name(start, len)?,
                            start,
                            len,
                        });
                    }
                    start + len
                }
            };
        }
        if planes.is_empty() {
            return Err(CaptureError::new(
                &self.path,
                ErrorKind::Invalid,
                Some(0),
                "no XPlane in this file",
                "pass the *.xplane.pb written by jax.profiler / xprof",
            ));
        }
        self.planes = planes;
        Ok(())
    }

    /// The plane's name (field 2), found by hopping over its field headers.
    fn plane_name(&self, start: u64, len: u64) -> Result<String, CaptureError> {
        let end = start + len;
        let mut pos = start;
        while pos < end {
            let (field, hdr) = self.header(pos, end, false)?;
            match hdr {
                Hdr::Skip(n) => pos += n,
                Hdr::Len(p, l) => {
                    if field == 2 {
                        let mut b = vec![0u8; l.min(4096) as usize];
                        self.file.read_exact_at(&mut b, p).map_err(|e| self.io(e))?;
                        return Ok(String::from_utf8_lossy(&b).into_owned());
                    }
                    pos = p + l;
                }
            }
        }
        Ok(String::new())
    }

    /// Planes whose name satisfies `pred`, in file order.
    pub fn find<'s>(
        &'s self,
        pred: impl Fn(&str) -> bool + 's,
    ) -> impl Iterator<Item = &'s PlaneIndex> {
        self.planes.iter().filter(move |p| pred(&p.name))
    }

    /// Load one plane's bytes and decode its metadata.
    pub fn load(&self, idx: &PlaneIndex) -> Result<Plane, CaptureError> {
        let bytes = match self.map(idx) {
            Some(m) => PlaneBytes::Mapped(m),
            None => {
                let mut bytes = vec![0u8; idx.len as usize];
                self.file
                    .read_exact_at(&mut bytes, idx.start)
                    .map_err(|e| self.io(e))?;
                PlaneBytes::Read(bytes)
            }
        };
        let mut plane = Plane::parse(&self.path, bytes, idx.start, &self.budget)?;
        plane.exact = self.walks_lines_exactly();
        plane.progress = self.progress.clone();
        plane.cancel = self.cancel.clone();
        Ok(plane)
    }

    /// A large plane mapped instead of copied into memory: no anonymous gigabyte, no copy, and
    /// the walk reads the page cache directly. As for snapshots ([`crate::sigbus::should_map`]):
    /// small planes are read unless the SIGBUS guard is installed (a mapped file truncated
    /// underneath would otherwise kill the process); `xla::analyse` voids an analysis that met
    /// a truncation.
    fn map(&self, idx: &PlaneIndex) -> Option<memmap2::Mmap> {
        if !crate::sigbus::should_map(idx.len) {
            return None;
        }
        // SAFETY: read-only and private to the plane; a truncation underneath reads as zeros
        // (SIGBUS guard) and is reported by `xla::analyse`.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(idx.start)
                .len(usize::try_from(idx.len).ok()?)
                .map(&self.file)
        }
        .ok()?;
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Sequential);
        Some(map)
    }

    /// From now on, loaded planes find each line's header before walking its events (after a
    /// one-pass walk met a [`LATE_HEADER`]).
    pub fn walk_lines_exactly(&self) {
        self.exact_lines
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn walks_lines_exactly(&self) -> bool {
        self.exact_lines.load(std::sync::atomic::Ordering::Relaxed)
    }
}

enum Hdr {
    /// Whole field is this many bytes.
    Skip(u64),
    /// Payload at (absolute offset, length).
    Len(u64, u64),
}

fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &x) in b.iter().enumerate().take(10) {
        v |= ((x & 0x7f) as u64) << (7 * i);
        if x < 0x80 {
            return Some((v, i + 1));
        }
    }
    None
}

/// A stat value as stored (strings may be interned as stat-metadata names: `Ref`).
#[derive(Clone, Debug, PartialEq)]
pub enum StatValue {
    I64(i64),
    U64(u64),
    F64(f64),
    Str(String),
    Bytes(Vec<u8>),
    Ref(u64),
}

/// A walk of a mapped plane gives back what it walked every this many bytes.
const RELEASE_STEP: usize = 8 << 20;

/// A plane's bytes, read or mapped ([`SpaceFile::load`]).
enum PlaneBytes {
    Read(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl PlaneBytes {
    /// Give back the pages of `[from, to)` (mapped bytes only): already walked, they are read
    /// again from the page cache if a later walk needs them, so a plane's walk holds a few MiB
    /// of it instead of all of it.
    fn release(&self, from: usize, to: usize) {
        #[cfg(unix)]
        if let PlaneBytes::Mapped(m) = self
            && to > from
            && to <= m.len()
        {
            // SAFETY: a private read-only file mapping: DONTNEED only drops clean pages, which
            // the next access reads from the file again.
            let _ = unsafe {
                m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from)
            };
        }
        #[cfg(not(unix))]
        let _ = (from, to);
    }
}

impl std::ops::Deref for PlaneBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            PlaneBytes::Read(v) => v,
            PlaneBytes::Mapped(m) => m,
        }
    }
}

/// One decoded plane: metadata owned, lines kept as byte ranges for a later walk.
pub struct Plane {
    pub name: String,
    bytes: PlaneBytes,
    base: u64,
    /// Byte ranges of the `XLine` messages within `bytes`.
    lines: Vec<(usize, usize)>,
    pub event_meta: FxHashMap<i64, xpb::XEventMetadata>,
    /// Absolute offset of each event-metadata entry (for errors inside its stats).
    pub event_meta_offset: FxHashMap<i64, u64>,
    pub stat_names: FxHashMap<i64, String>,
    pub stats: Vec<xpb::XStat>,
    /// Walk each line twice, header first, instead of once ([`SpaceFile::walk_lines_exactly`]).
    exact: bool,
    progress: crate::options::Progress,
    cancel: crate::options::Cancel,
}

impl Plane {
    fn parse(
        path: &Path,
        bytes: PlaneBytes,
        base: u64,
        budget: &(u64, String),
    ) -> Result<Plane, CaptureError> {
        let mut name = String::new();
        let mut lines = Vec::new();
        let mut event_meta = FxHashMap::default();
        let mut event_meta_offset = FxHashMap::default();
        let mut stat_names = FxHashMap::default();
        let mut stats = Vec::new();
        let mut held = MetadataHeld::default();
        {
            let mut r = Reader::new(&bytes, base);
            while let Some((f, v)) = r.next().map_err(|e| wire_error(path, e))? {
                match (f, v) {
                    (2, v) => name = v.str().to_string(),
                    (3, Value::Len(b, off)) => {
                        let s = (off - base) as usize;
                        lines.push((s, s + b.len()));
                    }
                    (4, Value::Len(b, off)) => {
                        let (k, m) = map_entry::<xpb::XEventMetadata>(path, b, off)?;
                        // Checked before the insert: a table that must grow doubles.
                        held.heap = held.heap.saturating_add(event_meta_heap(&m));
                        held.tables = table_after_insert(&event_meta)
                            .saturating_add(table_after_insert(&event_meta_offset))
                            .saturating_add(table_bytes(&stat_names));
                        held.entries += 1;
                        held.check(path, off, budget)?;
                        event_meta.insert(k, m);
                        event_meta_offset.insert(k, off);
                    }
                    (5, Value::Len(b, off)) => {
                        let (k, m) = map_entry::<xpb::XStatMetadata>(path, b, off)?;
                        held.heap = held.heap.saturating_add(alloc(m.name.capacity()));
                        held.tables = table_bytes(&event_meta)
                            .saturating_add(table_bytes(&event_meta_offset))
                            .saturating_add(table_after_insert(&stat_names));
                        held.entries += 1;
                        held.check(path, off, budget)?;
                        stat_names.insert(k, m.name);
                    }
                    (6, Value::Len(b, off)) => {
                        stats.push(decode_msg::<xpb::XStat>(path, b, off)?);
                        held.heap = held
                            .heap
                            .saturating_add(std::mem::size_of::<xpb::XStat>() as u64 * 2);
                        held.entries += 1;
                        held.check(path, off, budget)?;
                    }
                    _ => {}
                }
            }
        }
        Ok(Plane {
            name,
            bytes,
            base,
            lines,
            event_meta,
            event_meta_offset,
            stat_names,
            stats,
            exact: false,
            progress: Default::default(),
            cancel: Default::default(),
        })
    }

    /// The walk reached absolute file offset `at`: say so, and stop if the analysis is no
    /// longer wanted.
    fn reached(&self, path: &Path, at: u64) -> Result<(), CaptureError> {
        self.progress.advance(at);
        if self.cancel.is_cancelled() {
            return Err(CaptureError::cancelled(path));
        }
        Ok(())
    }

    /// Name of an event metadata id ("" when unknown).
    pub fn event_name(&self, id: i64) -> &str {
        self.event_meta
            .get(&id)
            .map(|m| m.name.as_str())
            .unwrap_or("")
    }

    pub fn stat_name(&self, id: i64) -> &str {
        self.stat_names.get(&id).map(|s| s.as_str()).unwrap_or("")
    }

    /// Stat-metadata id for a stat name, if the plane uses it.
    pub fn stat_id(&self, name: &str) -> Option<i64> {
        self.stat_names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(k, _)| *k)
    }

    /// Plane-level stat by name, as a string (str or ref).
    pub fn plane_stat_str(&self, name: &str) -> Option<String> {
        let s = self
            .stats
            .iter()
            .find(|s| self.stat_name(s.metadata_id) == name)?;
        match s.value.as_ref()? {
            xpb::x_stat::Value::StrValue(v) => Some(v.clone()),
            xpb::x_stat::Value::RefValue(r) => Some(self.stat_name(*r as i64).to_string()),
            xpb::x_stat::Value::Int64Value(v) => Some(v.to_string()),
            xpb::x_stat::Value::Uint64Value(v) => Some(v.to_string()),
            _ => None,
        }
    }

    /// Plane-level stat by name, as a number.
    pub fn plane_stat_num(&self, name: &str) -> Option<f64> {
        let s = self
            .stats
            .iter()
            .find(|s| self.stat_name(s.metadata_id) == name)?;
        match s.value.as_ref()? {
            xpb::x_stat::Value::Int64Value(v) => Some(*v as f64),
            xpb::x_stat::Value::Uint64Value(v) => Some(*v as f64),
            xpb::x_stat::Value::DoubleValue(v) => Some(*v),
            _ => None,
        }
    }

    /// Walk every event of every line. `f` gets the line and the event.
    pub fn for_each_event<'p>(
        &'p self,
        path: &Path,
        f: impl FnMut(&LineInfo<'p>, &RawEvent<'p>),
    ) -> Result<(), CaptureError> {
        self.for_each_event_on(path, |_| true, f)
    }

    /// Walk the events of the lines whose name satisfies `want` (other lines are skipped
    /// without decoding their events).
    pub fn for_each_event_on<'p>(
        &'p self,
        path: &Path,
        want: impl Fn(&str) -> bool,
        mut f: impl FnMut(&LineInfo<'p>, &RawEvent<'p>),
    ) -> Result<(), CaptureError> {
        let mut released = 0usize;
        for &(s, e) in &self.lines {
            let body = &self.bytes[s..e];
            let base = self.base + s as u64;
            self.reached(path, base)?;
            if !self.exact {
                self.walk_line_once(path, body, base, &want, &mut f, &mut released)?;
                continue;
            }
            // Header first (it may follow the events on the wire), then the events, without
            // collecting them.
            let mut line = LineInfo::default();
            let mut r = Reader::new(body, base);
            let mut seen_name = false;
            while let Some((fno, v)) = r.next().map_err(|e| wire_error(path, e))? {
                match fno {
                    1 => line.id = v.as_i64(),
                    2 => {
                        line.name = v.str();
                        seen_name = true;
                    }
                    3 => line.timestamp_ns = v.as_i64(),
                    // Writers emit fields in number order: name (2) and timestamp (3) precede
                    // the events (4), so a line we skip need not be scanned to its end.
                    4 if seen_name && !want(line.name) => break,
                    _ => {}
                }
            }
            if !want(line.name) {
                continue;
            }
            let mut r = Reader::new(body, base);
            let mut next = base.saturating_add(RELEASE_STEP as u64);
            while let Some((fno, v)) = r.next().map_err(|e| wire_error(path, e))? {
                if let (4, Value::Len(b, off)) = (fno, v) {
                    let ev = RawEvent::parse(b, off).map_err(|e| wire_error(path, e))?;
                    f(&line, &ev);
                    if off >= next {
                        self.reached(path, off)?;
                        next = off.saturating_add(RELEASE_STEP as u64);
                    }
                }
            }
        }
        Ok(())
    }

    /// One line in one pass: writers emit fields in number order, so the header (id 1, name 2,
    /// timestamp 3) is known when the events (4) begin, and a line of a gigabyte is read once
    /// instead of twice (the header scan alone was a fifth of a 1 GB report). A header field
    /// after an event would have changed what the events were given: that is a [`LATE_HEADER`]
    /// error, and the capture is read again with exact walks.
    fn walk_line_once<'p>(
        &'p self,
        path: &Path,
        body: &'p [u8],
        base: u64,
        want: &impl Fn(&str) -> bool,
        f: &mut impl FnMut(&LineInfo<'p>, &RawEvent<'p>),
        released: &mut usize,
    ) -> Result<(), CaptureError> {
        let mut line = LineInfo::default();
        let mut seen_name = false;
        // `Some(wanted)` once the events began.
        let mut events: Option<bool> = None;
        let mut r = Reader::new(body, base);
        while let Some((fno, v)) = r.next().map_err(|e| wire_error(path, e))? {
            match fno {
                1..=3 if events.is_some() => {
                    return Err(CaptureError::new(
                        path,
                        ErrorKind::Unsupported,
                        Some(base),
                        LATE_HEADER,
                        "",
                    ));
                }
                1 => line.id = v.as_i64(),
                2 => {
                    line.name = v.str();
                    seen_name = true;
                }
                3 => line.timestamp_ns = v.as_i64(),
                4 => {
                    let wanted = *events.get_or_insert_with(|| want(line.name));
                    if !wanted {
                        if seen_name {
                            // As the exact walk does: a named line we skip is not scanned on.
                            return Ok(());
                        }
                        // Unnamed so far: a name may still come (and make it wanted).
                        continue;
                    }
                    if let Value::Len(b, off) = v {
                        let ev = RawEvent::parse(b, off).map_err(|e| wire_error(path, e))?;
                        f(&line, &ev);
                        // Behind the walk, a MiB of slack: the pages already walked go back.
                        let at = off.saturating_sub(self.base) as usize;
                        if at >= *released + RELEASE_STEP {
                            let upto = at - (1 << 20);
                            self.bytes.release(*released, upto);
                            *released = upto;
                            self.reached(path, off)?;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Resolve a raw stat value to a string (str or ref → stat-metadata name).
    pub fn str_of<'a>(&'a self, v: &RawValue<'a>) -> Option<&'a str> {
        match v {
            RawValue::Str(s) => Some(s),
            RawValue::Ref(r) => self.stat_names.get(&(*r as i64)).map(|s| s.as_str()),
            _ => None,
        }
    }
}

/// One `XLine`'s header.
#[derive(Default, Debug)]
pub struct LineInfo<'a> {
    pub id: i64,
    pub name: &'a str,
    pub timestamp_ns: i64,
}

/// One `XEvent`, borrowed; stats are walked on demand.
pub struct RawEvent<'a> {
    pub metadata_id: i64,
    pub offset_ps: i64,
    pub duration_ps: i64,
    body: &'a [u8],
    off: u64,
}

/// A stat value borrowed from the file.
#[derive(Clone, Copy, Debug)]
pub enum RawValue<'a> {
    I64(i64),
    U64(u64),
    F64(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    Ref(u64),
    None,
}

impl RawValue<'_> {
    /// Numbers are stored as int64, uint64 or double depending on the value (XPLANE_FORMAT §1).
    pub fn num(&self) -> Option<f64> {
        match *self {
            RawValue::I64(v) => Some(v as f64),
            RawValue::U64(v) => Some(v as f64),
            RawValue::F64(v) => Some(v),
            _ => None,
        }
    }
    pub fn int(&self) -> Option<i64> {
        match *self {
            RawValue::I64(v) => Some(v),
            RawValue::U64(v) => Some(v as i64),
            RawValue::F64(v) => Some(v as i64),
            _ => None,
        }
    }
}

impl<'a> RawEvent<'a> {
    fn parse(body: &'a [u8], off: u64) -> Result<RawEvent<'a>, WireError> {
        let mut ev = RawEvent {
            metadata_id: 0,
            offset_ps: 0,
            duration_ps: 0,
            body,
            off,
        };
        let mut r = Reader::new(body, off);
        while let Some((f, v)) = r.next()? {
            match f {
                1 => ev.metadata_id = v.as_i64(),
                2 => ev.offset_ps = v.as_i64(),
                3 => ev.duration_ps = v.as_i64(),
                _ => {}
            }
        }
        Ok(ev)
    }

    /// Absolute start in ps since the line's origin (session start on JAX captures).
    pub fn start_ps(&self, line: &LineInfo) -> i64 {
        line.timestamp_ns
            .saturating_mul(1000)
            .saturating_add(self.offset_ps)
    }

    /// Visit `(stat metadata id, value)` pairs. Malformed stats end the walk silently: the event
    /// framing was already checked when the event was parsed.
    pub fn stats(&self, mut f: impl FnMut(i64, RawValue<'a>)) {
        let mut r = Reader::new(self.body, self.off);
        while let Ok(Some((fno, v))) = r.next() {
            if fno != 4 {
                continue;
            }
            let Value::Len(b, o) = v else { continue };
            let mut s = Reader::new(b, o);
            let mut id = 0;
            let mut val = RawValue::None;
            while let Ok(Some((k, x))) = s.next() {
                match k {
                    1 => id = x.as_i64(),
                    2 => val = RawValue::F64(f64::from_bits(x.as_u64())),
                    3 => val = RawValue::U64(x.as_u64()),
                    4 => val = RawValue::I64(x.as_i64()),
                    5 => val = RawValue::Str(x.str()),
                    6 => val = RawValue::Bytes(x.bytes()),
                    7 => val = RawValue::Ref(x.as_u64()),
                    _ => {}
                }
            }
            f(id, val);
        }
    }
}

fn decode_msg<M: Message + Default>(path: &Path, b: &[u8], off: u64) -> Result<M, CaptureError> {
    M::decode(b).map_err(|e| {
        CaptureError::new(
            path,
            ErrorKind::Invalid,
            Some(off),
            format!("cannot decode a message here: {e}"),
            "the capture is damaged; re-capture it",
        )
    })
}

/// What a plane's decoded metadata holds in memory, counted while it is decoded: the hash
/// tables at their capacity and what each entry owns. Millions of tiny event-metadata entries
/// (22 bytes each in the file) would otherwise hold about 22× the file.
#[derive(Default)]
struct MetadataHeld {
    tables: u64,
    heap: u64,
    entries: u64,
}

impl MetadataHeld {
    fn check(&self, path: &Path, off: u64, budget: &(u64, String)) -> Result<(), CaptureError> {
        let held = self.tables.saturating_add(self.heap);
        if held <= budget.0 {
            return Ok(());
        }
        Err(CaptureError::new(
            path,
            ErrorKind::Limit,
            Some(off),
            format!(
                "the plane's metadata would hold more than {} in memory ({} entries so far), \
                 over the budget of {} ({})",
                crate::findings::fmt_bytes(held),
                self.entries,
                crate::findings::fmt_bytes(budget.0),
                budget.1
            ),
            "no profiler writes this many metadata entries for a capture this size; if you trust \
             the file, raise --max-model-bytes (server: maxModelBytes)",
        ))
    }
}

/// Bytes of a hash table's slots (hashbrown: a power of two of buckets, 7/8 of them usable, one
/// control byte each).
fn table_bytes<K, V>(m: &FxHashMap<K, V>) -> u64 {
    slots_bytes::<K, V>(m.capacity())
}

/// [`table_bytes`] while one more entry goes in: a full table doubles, and holds its old slots
/// and its new ones while it moves them.
fn table_after_insert<K, V>(m: &FxHashMap<K, V>) -> u64 {
    if m.len() < m.capacity() {
        return table_bytes(m);
    }
    table_bytes(m).saturating_add(slots_bytes::<K, V>((m.capacity() * 2).max(3)))
}

fn slots_bytes<K, V>(capacity: usize) -> u64 {
    let buckets = if capacity < 8 {
        capacity + 1
    } else {
        (capacity / 7 * 8).next_power_of_two()
    };
    (buckets as u64).saturating_mul(std::mem::size_of::<(K, V)>() as u64 + 1)
}

/// What an allocation of `n` bytes takes from the allocator (a header, 16-byte steps, 32 at least).
fn alloc(n: usize) -> u64 {
    if n == 0 {
        0
    } else {
        ((n as u64 + 8).div_ceil(16) * 16).max(32)
    }
}

/// What one event-metadata entry owns besides its slot.
fn event_meta_heap(m: &xpb::XEventMetadata) -> u64 {
    let stats = m.stats.capacity() * std::mem::size_of::<xpb::XStat>();
    alloc(m.name.capacity())
        + alloc(m.display_name.capacity())
        + alloc(m.metadata.capacity())
        + alloc(stats)
        + alloc(m.child_id.capacity() * 8)
}

/// Decode a `map<int64, M>` entry `{key = 1, value = 2}`.
fn map_entry<M: Message + Default>(
    path: &Path,
    b: &[u8],
    off: u64,
) -> Result<(i64, M), CaptureError> {
    let mut key = 0;
    let mut val = None;
    let mut r = Reader::new(b, off);
    while let Some((f, v)) = r.next().map_err(|e| wire_error(path, e))? {
        match (f, v) {
            (1, v) => key = v.as_i64(),
            (2, Value::Len(b, o)) => val = Some(decode_msg::<M>(path, b, o)?),
            _ => {}
        }
    }
    Ok((key, val.unwrap_or_default()))
}
