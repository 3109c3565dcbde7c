//! The pickle virtual machine: protocols 0–5, data opcodes only, nothing executed.
//!
//! `GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `NEWOBJ`, `NEWOBJ_EX`, `INST` and `OBJ` are recorded
//! as inert [`Node::Global`] / [`Node::Call`] nodes — no import, no call. `PERSID`/`BINPERSID`,
//! `EXT1/2/4` and out-of-band buffers (`NEXT_BUFFER`, `READONLY_BUFFER`) are refused.
//!
//! Hard limits keep hostile input bounded: every length is checked against the bytes left, memo
//! indices must be plausible for the bytes read so far, container nesting is capped, and the VM
//! never recurses.

use rustc_hash::FxHashMap;

use super::opcodes as op;
pub use super::sink::Sink;
use super::value::{Node, Tree, Val};

mod containers;
mod fast;
mod rare;
mod scalars;
mod stream;

/// Why decoding stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickleErrorKind {
    /// The input ends before `STOP` (maybe still being written).
    Truncated,
    /// Bytes that are not a valid pickle.
    Invalid,
    /// A valid opcode memlsp refuses (persistent ids, extension registry, out-of-band buffers).
    Refused,
    /// A resource limit was hit (nesting depth, memo size, object count).
    Limit,
    /// The sink asked to stop ([`Sink::progress`] returned `false`).
    Cancelled,
}

/// A decoding error at a byte offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PickleError {
    pub offset: u64,
    pub kind: PickleErrorKind,
    pub message: String,
}

impl std::fmt::Display for PickleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at byte {}: {}", self.offset, self.message)
    }
}

/// Resource limits. Defaults suit snapshots of any size; lengths are always checked against the
/// remaining input, so they are relative to the file size by construction.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Maximum container nesting depth.
    pub max_depth: u32,
    /// Maximum number of values on the VM stack.
    pub max_stack: usize,
    /// Stop at the first `GLOBAL`/`STACK_GLOBAL`/`INST` instead of recording it (data-only files
    /// such as memory snapshots never contain one).
    pub refuse_globals: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 1000,
            max_stack: 1 << 22,
            refuse_globals: false,
        }
    }
}

/// Decode a whole pickle held in memory. Strings point into `data`.
pub fn decode(data: &[u8]) -> Result<Tree<'_>, PickleError> {
    decode_with(data, &Limits::default())
}

/// [`decode`] with explicit limits.
pub fn decode_with<'a>(data: &'a [u8], limits: &Limits) -> Result<Tree<'a>, PickleError> {
    decode_streaming(data, limits, None)
}

/// [`decode_with`], handing the dicts of the lists selected by `sink` to it as they complete.
pub fn decode_streaming<'a>(
    data: &'a [u8],
    limits: &Limits,
    sink: Option<&mut dyn Sink>,
) -> Result<Tree<'a>, PickleError> {
    let key = sink.as_ref().map(|s| s.key().as_bytes().to_vec());
    let sink_sequences = sink.as_ref().is_some_and(|s| s.takes_sequences());
    let mut vm = Vm {
        sink_sequences,
        memo_generation: 0,
        sink,
        stream_key: key,
        streamed: 0,
        next_progress: PROGRESS_STEP,
        d: data,
        p: 0,
        op_at: 0,
        tree: Tree {
            data,
            nodes: Vec::with_capacity(data.len() / 64),
            pool: Vec::with_capacity(data.len() / 16),
            shapes: Vec::new(),
            root: Val::NONE,
            protocol: None,
        },
        stack: Vec::with_capacity(64),
        marks: Vec::with_capacity(16),
        memo: Vec::with_capacity(data.len() / 32),
        depth: Vec::new(),
        shape_ids: FxHashMap::default(),
        dict_index: FxHashMap::default(),
        sunk_dicts: Vec::new(),
        pending_next: 0,
        open_entry: None,
        limits: limits.clone(),
    };
    vm.run()?;
    crate::timings::count("pickle memo slots", vm.memo.len() as u64);
    crate::timings::count("pickle nodes", vm.tree.nodes.len() as u64);
    crate::timings::count("pickle pool items", vm.tree.pool.len() as u64);
    Ok(vm.tree)
}

const MARK: Val = Val::NONE; // never read back: marks are positions in `marks`
const MAX_SHAPES: usize = 1 << 16;
const MAX_SHAPE_KEYS: usize = 64;

/// Input bytes between two calls of the sink's progress (cancel checks, and the snapshot loader
/// giving back the mapped pages already decoded: they count in the peak until then).
pub(super) const PROGRESS_STEP: usize = 2 << 20;

struct Vm<'a, 's> {
    sink: Option<&'s mut dyn Sink>,
    /// The sink takes the lists inside streamed dicts ([`Sink::takes_sequences`]).
    sink_sequences: bool,
    /// Bumped whenever an existing memo slot is overwritten ([`Sink::sequence_run`]).
    memo_generation: u64,
    stream_key: Option<Vec<u8>>,
    /// Streamed lists created so far (the next one's list number).
    streamed: u32,
    next_progress: usize,
    d: &'a [u8],
    p: usize,
    /// Offset of the opcode being executed (for errors).
    op_at: usize,
    tree: Tree<'a>,
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: Vec<Val>,
    /// Nesting depth per node id (containers only matter; others are 0).
    depth: Vec<u16>,
    shape_ids: FxHashMap<Box<[Val]>, u32>,
    /// Key hash → positions, for owned dicts past [`INDEX_FROM`] entries (node id → index), so
    /// `SETITEM` stays O(1) on a dict a hostile file grows to millions of keys.
    dict_index: FxHashMap<u32, FxHashMap<u64, Vec<u32>>>,
    /// Dicts being built inside sunk lists ([`Val::pending_dict`]) and those the sink already
    /// took ([`Val::sunk_dict`]) whose list has not received them yet, with the memo slots that
    /// hold them, to be rewritten when the sink gives a dict its number.
    sunk_dicts: Vec<SunkDict>,
    /// The next [`Val::pending_dict`] index.
    pending_next: u32,
    /// The streamed dict created last, until it is filled.
    open_entry: Option<OpenEntry>,
    limits: Limits,
}

/// A streamed dict (a trace entry) not filled yet: where it is on the stack and the memo slot
/// holding it. Filled, it is handed to the sink and its memo slot says so
/// ([`Val::READ_ENTRY`]); still unfilled when the next one is created, it was `{}` and goes to
/// the sink then, in the list's order.
struct OpenEntry {
    at: usize,
    val: Val,
    slot: Option<usize>,
}

/// A dict of a sunk list on its way to the sink: its current value and the memo slots holding it
/// (pickle memoizes a dict once, right after creating it: the first slot is kept inline).
struct SunkDict {
    val: Val,
    slot: Option<usize>,
    more_slots: Vec<usize>,
}

/// Most dicts of sunk lists tracked at once; beyond, a hostile file's dicts become arena nodes.
const MAX_SUNK_DICTS: usize = 4096;

/// Most opcodes [`Vm::fast_ops`] runs before it returns to the main loop (which reports
/// progress every few MiB).
const FAST_OPS_MAX: usize = 256;

/// Owned dicts with at least this many entries get a hash index; smaller ones are scanned.
const INDEX_FROM: usize = 32;

type R<T> = Result<T, PickleError>;

/// A sink's refusal, at the opcode at `at`.
fn sink_error(at: usize, message: String) -> PickleError {
    PickleError {
        offset: at as u64,
        kind: PickleErrorKind::Invalid,
        message,
    }
}

impl<'a> Vm<'a, '_> {
    fn err(&self, kind: PickleErrorKind, message: impl Into<String>) -> PickleError {
        PickleError {
            offset: self.op_at as u64,
            kind,
            message: message.into(),
        }
    }

    fn truncated(&self, what: &str) -> PickleError {
        PickleError {
            offset: self.p as u64,
            kind: PickleErrorKind::Truncated,
            message: format!("file ends inside {what} (no STOP opcode yet)"),
        }
    }

    #[inline]
    fn byte(&mut self) -> R<u8> {
        match self.d.get(self.p) {
            Some(&b) => {
                self.p += 1;
                Ok(b)
            }
            None => Err(self.truncated_arg()),
        }
    }

    #[cold]
    #[inline(never)]
    fn truncated_arg(&self) -> PickleError {
        self.truncated("an opcode argument")
    }

    #[inline]
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        match self.d.get(self.p..self.p.wrapping_add(n)) {
            Some(s) if self.p.checked_add(n).is_some() => {
                self.p += n;
                Ok(s)
            }
            _ => Err(self.past_end(n as u64)),
        }
    }

    /// A length that runs past the end of the input (kept out of line: the hot path is tiny).
    #[cold]
    #[inline(never)]
    fn past_end(&self, n: u64) -> PickleError {
        let left = (self.d.len() - self.p) as u64;
        PickleError {
            offset: self.op_at as u64,
            kind: PickleErrorKind::Truncated,
            message: format!(
                "a length of {n} bytes runs past the end of the file ({left} bytes left)"
            ),
        }
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> R<[u8; N]> {
        match self.d.get(self.p..self.p + N) {
            Some(s) => {
                self.p += N;
                let mut a = [0u8; N];
                a.copy_from_slice(s);
                Ok(a)
            }
            None => Err(self.past_end(N as u64)),
        }
    }

    #[inline]
    fn u16(&mut self) -> R<u16> {
        self.array().map(u16::from_le_bytes)
    }

    #[inline]
    fn u32(&mut self) -> R<u32> {
        self.array().map(u32::from_le_bytes)
    }

    #[inline]
    fn u64(&mut self) -> R<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// A length field checked against the remaining input (a 2^62 length allocates nothing).
    fn len_of(&self, n: u64) -> R<usize> {
        if n > (self.d.len() - self.p) as u64 {
            return Err(self.past_end(n));
        }
        Ok(n as usize)
    }

    /// A newline-terminated argument of the text opcodes.
    fn line(&mut self) -> R<&'a [u8]> {
        let rest = &self.d[self.p..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                self.p += i + 1;
                Ok(&rest[..i])
            }
            None => Err(self.truncated("a text argument")),
        }
    }

    /// The decimal memo index argument of the text opcodes `PUT` / `GET`.
    fn text_index(&mut self, opcode: &str) -> R<usize> {
        let line = self.line()?;
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .ok_or_else(|| {
                self.err(
                    PickleErrorKind::Invalid,
                    format!("{opcode} with a malformed index"),
                )
            })
    }

    #[inline]
    fn push(&mut self, v: Val) -> R<()> {
        if self.stack.len() >= self.limits.max_stack {
            return Err(self.err(
                PickleErrorKind::Limit,
                format!("more than {} values on the stack", self.limits.max_stack),
            ));
        }
        self.stack.push(v);
        Ok(())
    }

    #[inline]
    fn pop(&mut self) -> R<Val> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(self.err(
                PickleErrorKind::Invalid,
                "stack underflow: pop across a MARK",
            ));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.err(PickleErrorKind::Invalid, "stack underflow"))
    }

    #[inline]
    fn top(&self) -> R<Val> {
        match self.stack.last() {
            Some(&v) if self.marks.last().is_none_or(|&m| m < self.stack.len()) => Ok(v),
            _ => Err(self.err(
                PickleErrorKind::Invalid,
                "stack underflow: no object to modify",
            )),
        }
    }

    fn pop_mark(&mut self) -> R<usize> {
        self.marks
            .pop()
            .ok_or_else(|| self.err(PickleErrorKind::Invalid, "no MARK on the stack"))
    }

    fn new_node(&mut self, n: Node) -> R<Val> {
        let v = self
            .tree
            .push_node(n)
            .map_err(|m| self.err(PickleErrorKind::Limit, m))?;
        Ok(v)
    }

    fn memo_put(&mut self, idx: usize) -> R<()> {
        let v = self.top()?;
        // Each memo slot costs at least one opcode byte to fill, so an index far beyond the bytes
        // read so far can only come from a hostile file.
        if idx > self.p.saturating_mul(2) + 1024 {
            return Err(self.err(
                PickleErrorKind::Limit,
                format!("memo index {idx} is implausible at this offset"),
            ));
        }
        if idx >= self.memo.len() {
            self.memo.resize(idx + 1, Val::NONE);
        } else {
            // An existing slot changes: memo indices seen before may now mean something else.
            self.memo_generation += 1;
        }
        self.memo[idx] = v;
        self.note_memo(v, idx);
        Ok(())
    }

    /// Memo slot `idx` now holds `v`: remember it if `v` is a dict of a sunk list in progress.
    #[inline]
    fn note_memo(&mut self, v: Val, idx: usize) {
        if v.pending_dict_index().is_none() && v.sunk_dict_id().is_none() {
            if let Some(e) = self.open_entry.as_mut()
                && v.stream_dict_ordinal().is_some()
            {
                e.slot = Some(idx);
            }
            return;
        }
        if let Some(d) = self.sunk_dicts.iter_mut().rev().find(|d| d.val == v) {
            if d.slot.is_none() {
                d.slot = Some(idx);
            } else if d.more_slots.len() < MAX_SUNK_DICTS {
                d.more_slots.push(idx);
            }
        }
    }

    fn memo_get(&mut self, idx: usize) -> R<()> {
        match self.memo.get(idx) {
            Some(&v) => self.push(v),
            None => Err(self.err(
                PickleErrorKind::Invalid,
                format!("memo index {idx} was never stored"),
            )),
        }
    }

    /// `PROTO`, `FRAME`, `MARK`, `POP`, `POP_MARK`, `DUP`: framing and stack control.
    #[inline(always)]
    fn control_op(&mut self, op: u8) -> R<()> {
        use PickleErrorKind::*;
        match op {
            op::PROTO => {
                let proto = self.byte()?;
                if proto > 5 {
                    return Err(self.err(Invalid, format!("unsupported pickle protocol {proto}")));
                }
                self.tree.protocol = Some(proto);
            }
            op::FRAME => {
                let n = self.u64()?;
                // A frame only announces how many bytes follow; opcodes are read as usual.
                let left = (self.d.len() - self.p) as u64;
                if n > left {
                    return Err(PickleError {
                        offset: self.op_at as u64,
                        kind: Truncated,
                        message: format!(
                            "a frame of {n} bytes runs past the end of the file ({left} bytes left)"
                        ),
                    });
                }
            }
            op::MARK => {
                if self.marks.len() >= self.limits.max_depth as usize {
                    return Err(self.err(
                        Limit,
                        format!("more than {} nested MARKs", self.limits.max_depth),
                    ));
                }
                self.marks.push(self.stack.len());
            }
            op::POP => {
                // POP: discards the top item, or the topmost mark if it is on top.
                if self.marks.last() == Some(&self.stack.len()) {
                    self.marks.pop();
                } else {
                    self.pop()?;
                }
            }
            op::POP_MARK => {
                let m = self.pop_mark()?;
                self.stack.truncate(m);
            }
            op::DUP => {
                let v = self.top()?;
                self.push(v)?;
            }
            _ => unreachable!("control_op called with opcode 0x{op:02x}"),
        }
        Ok(())
    }

    /// `MEMOIZE`, `BINPUT`, `LONG_BINPUT`, `BINGET`, `LONG_BINGET`.
    #[inline(always)]
    fn memo_op(&mut self, op: u8) -> R<()> {
        match op {
            op::MEMOIZE => {
                let v = self.top()?;
                self.memo.push(v);
                self.note_memo(v, self.memo.len() - 1);
            }
            op::BINPUT => {
                let i = self.byte()? as usize;
                self.memo_put(i)?;
            }
            op::LONG_BINPUT => {
                let i = self.u32()? as usize;
                self.memo_put(i)?;
            }
            op::BINGET | op::LONG_BINGET => {
                // A frames list seen before is skipped whole; otherwise this reference and
                // the simple opcodes after it run in the fast loop.
                if !(self.sink_sequences && self.skip_known_run()?) {
                    let i = if op == op::BINGET {
                        self.byte()? as usize
                    } else {
                        self.u32()? as usize
                    };
                    self.memo_get(i)?;
                    self.fast_ops();
                }
            }
            _ => unreachable!("memo_op called with opcode 0x{op:02x}"),
        }
        Ok(())
    }

    /// Every [`PROGRESS_STEP`] bytes: tell the sink how far decoding is; `Err` when it cancels.
    #[cold]
    fn report_progress(&mut self) -> R<()> {
        self.next_progress = self.p + PROGRESS_STEP;
        if let Some(sink) = self.sink.as_deref_mut() {
            if !sink.progress(self.p) {
                return Err(PickleError {
                    offset: self.p as u64,
                    kind: PickleErrorKind::Cancelled,
                    message: "decoding was cancelled".into(),
                });
            }
        }
        Ok(())
    }

    /// The input ends where an opcode should be.
    #[cold]
    fn ended(&self) -> PickleError {
        PickleError {
            offset: self.p as u64,
            kind: PickleErrorKind::Truncated,
            message: if self.p == 0 {
                "the file is empty".into()
            } else {
                "file ends before the STOP opcode (still being written, or cut short)".into()
            },
        }
    }

    /// The main loop: one opcode at a time, by family, until `STOP`.
    fn run(&mut self) -> R<()> {
        loop {
            self.op_at = self.p;
            if self.p >= self.next_progress {
                self.report_progress()?;
            }
            let Some(&op) = self.d.get(self.p) else {
                return Err(self.ended());
            };
            self.p += 1;
            // One arm per opcode, each a call of its family with the opcode as a constant: the
            // family is inlined and folds to that opcode's code, so this stays one jump table.
            match op {
                op::STOP => {
                    let root = self.pop()?;
                    self.tree.root = root;
                    return Ok(());
                }
                op::PROTO => self.control_op(op::PROTO)?,
                op::FRAME => self.control_op(op::FRAME)?,
                op::MARK => self.control_op(op::MARK)?,
                op::POP => self.control_op(op::POP)?,
                op::POP_MARK => self.control_op(op::POP_MARK)?,
                op::DUP => self.control_op(op::DUP)?,
                op::NONE => self.scalar_op(op::NONE)?,
                op::NEWTRUE => self.scalar_op(op::NEWTRUE)?,
                op::NEWFALSE => self.scalar_op(op::NEWFALSE)?,
                op::BININT1 => self.scalar_op(op::BININT1)?,
                op::BININT2 => self.scalar_op(op::BININT2)?,
                op::BININT => self.scalar_op(op::BININT)?,
                op::LONG1 => self.scalar_op(op::LONG1)?,
                op::LONG4 => self.scalar_op(op::LONG4)?,
                op::BINFLOAT => self.scalar_op(op::BINFLOAT)?,
                op::SHORT_BINUNICODE => self.scalar_op(op::SHORT_BINUNICODE)?,
                op::BINUNICODE => self.scalar_op(op::BINUNICODE)?,
                op::BINUNICODE8 => self.scalar_op(op::BINUNICODE8)?,
                op::BINSTRING => self.scalar_op(op::BINSTRING)?,
                op::SHORT_BINSTRING => self.scalar_op(op::SHORT_BINSTRING)?,
                op::BINBYTES => self.scalar_op(op::BINBYTES)?,
                op::SHORT_BINBYTES => self.scalar_op(op::SHORT_BINBYTES)?,
                op::BINBYTES8 | op::BYTEARRAY8 => self.scalar_op(op)?,
                op::EMPTY_LIST => self.container_op(op::EMPTY_LIST)?,
                op::LIST => self.container_op(op::LIST)?,
                op::EMPTY_DICT => self.container_op(op::EMPTY_DICT)?,
                op::DICT => self.container_op(op::DICT)?,
                op::EMPTY_TUPLE => self.container_op(op::EMPTY_TUPLE)?,
                op::TUPLE => self.container_op(op::TUPLE)?,
                op::TUPLE1..=op::TUPLE3 => self.container_op(op)?,
                op::APPEND => self.container_op(op::APPEND)?,
                op::APPENDS => self.container_op(op::APPENDS)?,
                op::SETITEM => self.container_op(op::SETITEM)?,
                op::SETITEMS => self.container_op(op::SETITEMS)?,
                op::EMPTY_SET => self.container_op(op::EMPTY_SET)?,
                op::ADDITEMS => self.container_op(op::ADDITEMS)?,
                op::FROZENSET => self.container_op(op::FROZENSET)?,
                op::MEMOIZE => self.memo_op(op::MEMOIZE)?,
                op::BINPUT => self.memo_op(op::BINPUT)?,
                op::LONG_BINPUT => self.memo_op(op::LONG_BINPUT)?,
                op::BINGET | op::LONG_BINGET => self.memo_op(op)?,
                // Protocol-0 text opcodes, objects and globals (recorded, never executed),
                // refusals: rare in snapshots.
                _ => self.rare_op(op)?,
            }
        }
    }
}

// Silence "unused" for the placeholder constant in builds without debug assertions.
const _: Val = MARK;
