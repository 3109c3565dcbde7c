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
    crate::hugepages::advise_spare(&vm.memo);
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

    fn depth_of(&self, v: Val) -> u16 {
        v.node_id()
            .and_then(|i| self.depth.get(i as usize).copied())
            .unwrap_or(0)
    }

    /// Record that `parent` now contains `children`; refuse nesting beyond the limit.
    fn nest(&mut self, parent: Val, children: &[Val]) -> R<()> {
        let Some(pid) = parent.node_id() else {
            return Ok(());
        };
        let mut d = self.depth_of(parent);
        for &c in children {
            d = d.max(self.depth_of(c).saturating_add(1));
        }
        if d as u32 > self.limits.max_depth {
            return Err(self.err(
                PickleErrorKind::Limit,
                format!(
                    "containers nested more than {} levels deep",
                    self.limits.max_depth
                ),
            ));
        }
        let pid = pid as usize;
        if self.depth.len() <= pid {
            self.depth.resize(pid + 1, 0);
        }
        self.depth[pid] = d;
        Ok(())
    }

    fn pool_push(&mut self, items: &[Val]) -> R<u32> {
        let start = self.tree.pool.len();
        if start + items.len() > u32::MAX as usize {
            return Err(self.err(PickleErrorKind::Limit, "more than 2^32 container items"));
        }
        self.tree.pool.extend_from_slice(items);
        Ok(start as u32)
    }

    fn new_str(&mut self, bytes: &'a [u8]) -> R<Val> {
        let start = bytes.as_ptr() as usize - self.d.as_ptr() as usize;
        if bytes.is_ascii() || std::str::from_utf8(bytes).is_ok() {
            if let Some(v) = Val::inline_str(start, bytes.len()) {
                return Ok(v);
            }
        }
        let len = u32::try_from(bytes.len())
            .map_err(|_| self.err(PickleErrorKind::Limit, "string longer than 4 GiB"))?;
        let (lo, hi) = super::value::join_offset(start)
            .ok_or_else(|| self.err(PickleErrorKind::Limit, "input larger than 256 TiB"))?;
        let node = match std::str::from_utf8(bytes) {
            Ok(_) => Node::Str { lo, hi, len },
            // CPython writes lone surrogates with 'surrogatepass'; keep the text, lossy.
            Err(_) => Node::OwnedStr(Box::new(String::from_utf8_lossy(bytes).into_owned())),
        };
        self.new_node(node)
    }

    fn new_bytes(&mut self, bytes: &'a [u8]) -> R<Val> {
        let start = bytes.as_ptr() as usize - self.d.as_ptr() as usize;
        let len = u32::try_from(bytes.len())
            .map_err(|_| self.err(PickleErrorKind::Limit, "bytes longer than 4 GiB"))?;
        let (lo, hi) = super::value::join_offset(start)
            .ok_or_else(|| self.err(PickleErrorKind::Limit, "input larger than 256 TiB"))?;
        self.new_node(Node::Bytes { lo, hi, len })
    }

    fn new_long(&mut self, bytes: &[u8]) -> R<Val> {
        // Fast path: fits in an inline int.
        if bytes.len() <= 8 {
            let mut v: i64 = 0;
            for (i, &b) in bytes.iter().enumerate() {
                v |= (b as i64) << (8 * i);
            }
            if !bytes.is_empty() && bytes.len() < 8 && bytes[bytes.len() - 1] & 0x80 != 0 {
                v -= 1i64 << (8 * bytes.len());
            }
            if let Some(val) = Val::small_int(v) {
                return Ok(val);
            }
        }
        self.new_node(Node::BigInt(Box::new(bytes.to_vec())))
    }

    fn int_val(&mut self, v: i64) -> R<Val> {
        match Val::small_int(v) {
            Some(val) => Ok(val),
            None => self.new_node(Node::BigInt(Box::new(v.to_le_bytes().to_vec()))),
        }
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

    /// Whether a dict created now (pushed at the stack top) is an item of a sunk list.
    fn in_sunk_list(&self) -> bool {
        let len = self.stack.len();
        let sunk = |i: usize| self.stack[i].sunk_list_seq().is_some();
        match self.marks.last().copied() {
            Some(m) if m >= 1 && m <= len && sunk(m - 1) => true,
            top => len >= 1 && top.is_none_or(|m| m < len) && sunk(len - 1),
        }
    }

    /// Hand the items on the stack from `items_from` to the sink as (more of) the dict `dict` of
    /// a sunk list, and put the number the sink gives it wherever the dict is held: the stack
    /// and the memo.
    fn sink_dict(&mut self, dict: Val, items_from: usize) -> R<Val> {
        let at = self.op_at;
        let prev = dict.sunk_dict_id();
        let id = match self.sink.as_deref_mut() {
            Some(sink) => sink
                .sequence_dict(&self.tree, prev, &self.stack[items_from..])
                .map_err(|m| sink_error(at, m))?,
            None => 0,
        };
        self.stack.truncate(items_from);
        let new = Val::sunk_dict(id);
        if let Some(d) = self.sunk_dicts.iter_mut().rev().find(|d| d.val == dict) {
            d.val = new;
            for &slot in d.slot.iter().chain(&d.more_slots) {
                if let Some(m) = self.memo.get_mut(slot).filter(|m| **m == dict) {
                    *m = new;
                }
            }
            if d.slot.is_some() {
                // Memo slots changed: runs of memo references seen before may mean more now.
                self.memo_generation += 1;
            }
        }
        Ok(new)
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

    /// After a memo reference: the simple opcodes that follow (more memo references — a frames
    /// list is dozens in a row —, small ints and strings, `MEMOIZE`), run in one loop without the
    /// main loop's bookkeeping; also the keys and scalar values of a trace entry. Stops before the first opcode it does not handle, or
    /// that would fail, and leaves that one to the main loop (which reports any error).
    #[inline]
    fn fast_ops(&mut self) {
        let d = self.d;
        let mut p = self.p;
        for _ in 0..FAST_OPS_MAX {
            let Some(&op) = d.get(p) else { break };
            let arg = p + 1;
            let (v, next) = match op {
                op::BINGET | op::LONG_BINGET => {
                    let (idx, next) = if op == op::BINGET {
                        match d.get(arg) {
                            Some(&b) => (b as usize, arg + 1),
                            None => break,
                        }
                    } else {
                        match d.get(arg..arg + 4) {
                            Some(s) => (
                                u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize,
                                arg + 4,
                            ),
                            None => break,
                        }
                    };
                    match self.memo.get(idx) {
                        Some(&v) => (v, next),
                        None => break,
                    }
                }
                op::BININT1 => match d.get(arg) {
                    Some(&b) => (Val::small_int(b as i64).unwrap_or(Val::NONE), arg + 1),
                    None => break,
                },
                op::BININT2 => match d.get(arg..arg + 2) {
                    Some(s) => (
                        Val::small_int(u16::from_le_bytes([s[0], s[1]]) as i64)
                            .unwrap_or(Val::NONE),
                        arg + 2,
                    ),
                    None => break,
                },
                op::BININT => match d.get(arg..arg + 4) {
                    Some(s) => (
                        Val::small_int(i32::from_le_bytes([s[0], s[1], s[2], s[3]]) as i64)
                            .unwrap_or(Val::NONE),
                        arg + 4,
                    ),
                    None => break,
                },
                op::LONG1 => {
                    // LONG1 of 1..=7 bytes always fits an inline int. The length is copied out
                    // before it is checked: a guard on `Some(&n)` checks the input byte and then
                    // reads it again, and a mapped capture truncated in between (its page now
                    // zeros, `sigbus`) would give a length of 0 that was never checked.
                    let n = match d.get(arg).copied() {
                        Some(n) if (1..=7).contains(&n) => n as usize,
                        _ => break,
                    };
                    let Some(b) = d.get(arg + 1..arg + 1 + n) else {
                        break;
                    };
                    let mut buf = [0u8; 8];
                    buf[..n].copy_from_slice(b);
                    let mut v = i64::from_le_bytes(buf);
                    if b[n - 1] & 0x80 != 0 {
                        v -= 1i64 << (8 * n);
                    }
                    match Val::small_int(v) {
                        Some(v) => (v, arg + 1 + n),
                        None => break,
                    }
                }
                op::SHORT_BINUNICODE => {
                    let n = match d.get(arg) {
                        Some(&n) => n as usize,
                        None => break,
                    };
                    match d.get(arg + 1..arg + 1 + n) {
                        Some(b) if b.is_ascii() => match Val::inline_str(arg + 1, n) {
                            Some(v) => (v, arg + 1 + n),
                            None => break,
                        },
                        _ => break,
                    }
                }
                op::MEMOIZE => {
                    // MEMOIZE the top of the stack (not across a MARK).
                    match self.stack.last() {
                        Some(&v) if self.marks.last().is_none_or(|&m| m < self.stack.len()) => {
                            self.memo.push(v);
                            self.note_memo(v, self.memo.len() - 1);
                            p = arg;
                            continue;
                        }
                        _ => break,
                    }
                }
                _ => break,
            };
            if self.stack.len() >= self.limits.max_stack {
                break;
            }
            self.stack.push(v);
            p = next;
        }
        self.p = p;
    }

    /// At the first `BINGET` right after the `MARK` of a sunk list: offer the whole run up to
    /// its `APPENDS` to the sink ([`Sink::sequence_run`]); `true` when the sink took it.
    fn skip_known_run(&mut self) -> R<bool> {
        let n = self.stack.len();
        if self.marks.last() != Some(&n) || n == 0 {
            return Ok(false);
        }
        let Some(seq) = self.stack[n - 1].sunk_list_seq() else {
            return Ok(false);
        };
        let (d, start) = (self.d, self.op_at);
        let (mut q, mut items) = (start, 0);
        while items < 1000 {
            match d.get(q) {
                Some(&op::BINGET) => q += 2,
                Some(&op::LONG_BINGET) => q += 5,
                _ => break,
            }
            items += 1;
        }
        // A batch of 1000 may be followed by more for the same list.
        if items >= 1000 || q >= d.len() || d[q] != op::APPENDS {
            return Ok(false);
        }
        let Some(sink) = self.sink.as_deref_mut() else {
            return Ok(false);
        };
        let taken = sink
            .sequence_run(seq, &d[start..q], self.memo_generation)
            .map_err(|m| sink_error(start, m))?;
        if taken {
            self.marks.pop();
            (self.op_at, self.p) = (q, q + 1);
        }
        Ok(taken)
    }

    fn append_items(&mut self, list: Val, items_from: usize) -> R<()> {
        if let Some(seq) = list.sunk_list_seq() {
            return self.append_sunk(seq, items_from);
        }
        if let Some(Node::StreamedList { .. }) = self.tree.node_mut(list) {
            return self.append_streamed(list, items_from);
        }
        let items: Vec<Val> = self.stack.drain(items_from..).collect();
        self.nest(list, &items)?;
        let pool_len = self.tree.pool.len() as u32;
        enum Plan {
            PoolNew,
            PoolExtend,
            MakeOwned(u32, u32),
            Owned,
        }
        let plan = match self.tree.node_mut(list) {
            Some(Node::List { len: 0, .. }) => Plan::PoolNew,
            Some(Node::List { start, len }) if *start + *len == pool_len => Plan::PoolExtend,
            Some(Node::List { start, len }) => Plan::MakeOwned(*start, *len),
            Some(Node::OwnedList(_) | Node::Set(_)) => Plan::Owned,
            _ => {
                let what = self.tree.describe(list);
                return Err(self.err(
                    PickleErrorKind::Invalid,
                    format!("APPEND to {what}, not a list"),
                ));
            }
        };
        match plan {
            Plan::PoolNew | Plan::PoolExtend => {
                let start = self.pool_push(&items)?;
                if let Some(Node::List { start: s, len }) = self.tree.node_mut(list) {
                    if matches!(plan, Plan::PoolNew) {
                        *s = start;
                    }
                    *len += items.len() as u32;
                }
            }
            Plan::MakeOwned(s, l) => {
                let mut owned: Vec<Val> = self.tree.pool[s as usize..(s + l) as usize].to_vec();
                owned.extend_from_slice(&items);
                if let Some(n) = self.tree.node_mut(list) {
                    *n = Node::OwnedList(Box::new(owned));
                }
            }
            Plan::Owned => {
                if let Some(Node::OwnedList(v) | Node::Set(v)) = self.tree.node_mut(list) {
                    v.extend_from_slice(&items);
                }
            }
        }
        Ok(())
    }

    /// Items appended to a list inside a streamed dict go to the sink, not into the tree.
    fn append_sunk(&mut self, seq: u32, items_from: usize) -> R<()> {
        if items_from >= self.stack.len() {
            return Ok(()); // an empty APPENDS batch
        }
        // Dicts that never got items are empty dicts: the sink numbers them too.
        for i in items_from..self.stack.len() {
            let v = self.stack[i];
            if v.pending_dict_index().is_some() {
                // No items: the stack above its top.
                let new = self.sink_dict(v, self.stack.len())?;
                for w in &mut self.stack[items_from..] {
                    if *w == v {
                        *w = new;
                    }
                }
            }
        }
        // The dicts appended are complete: their memo slots need no more rewriting.
        self.sunk_dicts.clear();
        self.give_stack(items_from, |sink, t, items| sink.sequence(t, seq, items))
    }

    /// Hand the stack items from `items_from` to the sink with `give`, then drop them; a sink
    /// error stops decoding at the current opcode.
    fn give_stack(
        &mut self,
        items_from: usize,
        give: impl FnOnce(&mut dyn Sink, &Tree<'a>, &[Val]) -> Result<(), String>,
    ) -> R<()> {
        let at = self.op_at;
        if let Some(sink) = self.sink.as_deref_mut() {
            give(sink, &self.tree, &self.stack[items_from..]).map_err(|m| sink_error(at, m))?;
        }
        self.stack.truncate(items_from);
        Ok(())
    }

    /// Whether a list created now (pushed at the stack top) is a value of a streamed dict, i.e.
    /// is being filled by its `SETITEMS` batch. (A streamed dict is never an arena node: `}` in a
    /// streamed list makes it a [`Val::stream_dict`].)
    fn in_streamed_dict(&self) -> bool {
        match self.marks.last() {
            Some(&m) if m >= 1 && m <= self.stack.len() => {
                self.stack[m - 1].stream_dict_ordinal().is_some()
            }
            _ => false,
        }
    }

    /// Which streamed list (by number) the dict at stack index `di` is an item of, if any.
    fn streamed_parent(&self, di: usize) -> Option<u32> {
        if self.streamed == 0 {
            return None;
        }
        // The node carries its list number: O(1), however many lists a hostile file streams.
        let lookup = |v: Val| self.tree.streamed_ordinal(v);
        let top_mark = self.marks.last().copied();
        if let Some(m) = top_mark {
            if m >= 1 && m <= di {
                if let Some(k) = lookup(self.stack[m - 1]) {
                    return Some(k);
                }
            }
        }
        if di >= 1 && top_mark.is_none_or(|m| m < di) {
            return lookup(self.stack[di - 1]);
        }
        None
    }

    /// Whether a list created now (to be pushed at the stack top) is an item of the list under the
    /// sink's key.
    fn starts_streamed_list(&self) -> bool {
        let Some(key) = &self.stream_key else {
            return false;
        };
        let len = self.stack.len();
        let is_outer = |i: usize| -> bool {
            i >= 1
                && matches!(
                    self.tree
                        .nodes
                        .get(self.stack[i].node_id().unwrap_or(u32::MAX) as usize),
                    Some(Node::List { .. } | Node::OwnedList(_))
                )
                && self
                    .tree
                    .str(self.stack[i - 1])
                    .is_some_and(|k| k.as_bytes() == key.as_slice())
        };
        match self.marks.last().copied() {
            Some(m) if m >= 1 && m <= len && is_outer(m - 1) => true,
            top => len >= 1 && top.is_none_or(|m| m < len) && is_outer(len - 1),
        }
    }

    fn append_streamed(&mut self, list: Val, items_from: usize) -> R<()> {
        let ordinal = self.tree.streamed_ordinal(list).unwrap_or(0);
        let n = self.stack.len() - items_from;
        for i in items_from..self.stack.len() {
            let item = self.stack[i];
            if item.stream_dict_ordinal().is_some() {
                // A streamed dict that never got a SETITEMS: an empty entry.
                self.emit(ordinal, &[])?;
                continue;
            }
            if item == Val::READ_ENTRY {
                let key =
                    String::from_utf8_lossy(self.stream_key.as_deref().unwrap_or(b"")).into_owned();
                return Err(self.err(
                    PickleErrorKind::Invalid,
                    format!(
                        "an item of `{key}` is the same dict object as an earlier item (a memo \
                         reference); each entry is read once as it is decoded, so write a \
                         fresh dict per entry, as torch does"
                    ),
                ));
            }
            match self.tree.kind(item) {
                crate::pickle::Kind::Consumed => {}
                crate::pickle::Kind::Dict => {
                    // A dict that was not streamed when filled (built with DICT or SETITEM).
                    let pairs: Vec<Val> = self.tree.pairs(item).flat_map(|(k, v)| [k, v]).collect();
                    self.emit(ordinal, &pairs)?;
                }
                _ => {
                    let what = self.tree.describe(item);
                    let key = String::from_utf8_lossy(self.stream_key.as_deref().unwrap_or(b""))
                        .into_owned();
                    return Err(self.err(
                        PickleErrorKind::Invalid,
                        format!("an item of `{key}` is {what}, expected a dict"),
                    ));
                }
            }
        }
        self.stack.truncate(items_from);
        if let Some(Node::StreamedList { count, .. }) = self.tree.node_mut(list) {
            *count = count.saturating_add(n as u32);
        }
        Ok(())
    }

    fn emit(&mut self, ordinal: u32, pairs: &[Val]) -> R<()> {
        let at = self.op_at;
        match self.sink.as_deref_mut() {
            Some(sink) => sink
                .entry(&self.tree, ordinal, pairs)
                .map_err(|m| sink_error(at, m)),
            None => Ok(()),
        }
    }

    /// Hand the items on the stack from `items_from` to the sink as a dict of streamed list
    /// number `ordinal`.
    fn emit_stack(&mut self, ordinal: u32, items_from: usize) -> R<()> {
        self.give_stack(items_from, |sink, t, items| sink.entry(t, ordinal, items))
    }

    fn set_items(&mut self, dict: Val, items_from: usize) -> R<()> {
        let n = self.stack.len() - items_from;
        if n % 2 != 0 {
            return Err(self.err(
                PickleErrorKind::Invalid,
                "SETITEMS with an odd number of items",
            ));
        }
        // A dict inside a sunk list (a frame) goes to the sink too.
        if dict.pending_dict_index().is_some() || dict.sunk_dict_id().is_some() {
            let new = self.sink_dict(dict, items_from)?;
            if items_from >= 1 && self.stack[items_from - 1] == dict {
                self.stack[items_from - 1] = new;
            }
            return Ok(());
        }
        // A fresh dict inside a streamed list goes to the sink, not into the tree.
        if let Some(ordinal) = dict.stream_dict_ordinal() {
            let open = self.open_entry.take();
            self.emit_stack(ordinal, items_from)?;
            if items_from >= 1 && self.stack[items_from - 1] == dict {
                self.stack[items_from - 1] = Val::CONSUMED;
            }
            // Its memo slot no longer stands for an unfilled (empty) dict. Not a memo change for
            // `sequence_run`: a run that took this value as a frame was refused already.
            if let Some(slot) = open.and_then(|e| e.slot)
                && let Some(m) = self.memo.get_mut(slot).filter(|m| **m == dict)
            {
                *m = Val::READ_ENTRY;
            }
            return Ok(());
        }
        if items_from >= 1 && self.stack[items_from - 1] == dict {
            let fresh = matches!(
                self.tree.node_mut(dict),
                Some(Node::Dict {
                    shape: u32::MAX,
                    ..
                })
            );
            if fresh {
                if let Some(ordinal) = self.streamed_parent(items_from - 1) {
                    self.emit_stack(ordinal, items_from)?;
                    if let Some(node) = self.tree.node_mut(dict) {
                        *node = Node::Consumed;
                    }
                    return Ok(());
                }
            }
        }
        let items: Vec<Val> = self.stack.drain(items_from..).collect();
        self.nest(dict, &items)?;
        let fresh = match self.tree.node_mut(dict) {
            Some(Node::Dict { shape, .. }) => *shape == u32::MAX,
            Some(Node::OwnedDict(_)) => false,
            _ => {
                let what = self.tree.describe(dict);
                return Err(self.err(
                    PickleErrorKind::Invalid,
                    format!("SETITEM on {what}, not a dict"),
                ));
            }
        };
        if fresh && !items.is_empty() {
            // A fresh dict: give it a shared shape when it can have one.
            let keys: Vec<Val> = items.iter().step_by(2).copied().collect();
            if let Some(shape) = self.shape_for(&keys) {
                let values: Vec<Val> = items.iter().skip(1).step_by(2).copied().collect();
                let start = self.pool_push(&values)?;
                if let Some(node) = self.tree.node_mut(dict) {
                    *node = Node::Dict { shape, start };
                }
                return Ok(());
            }
        }
        for pair in items.chunks_exact(2) {
            self.dict_insert(dict, pair[0], pair[1]);
        }
        Ok(())
    }

    /// Insert with Python semantics: an equal key replaces the old value.
    fn dict_insert(&mut self, dict: Val, k: Val, v: Val) {
        // Convert a shaped dict to owned first.
        let shaped = match self.tree.node_mut(dict) {
            Some(Node::Dict { shape, start }) if *shape != u32::MAX => Some((*shape, *start)),
            Some(Node::Dict { .. }) => Some((u32::MAX, 0)),
            _ => None,
        };
        if let Some((shape, start)) = shaped {
            let pairs: Vec<(Val, Val)> = if shape == u32::MAX {
                Vec::new()
            } else {
                let keys = self.tree.shapes[shape as usize].clone();
                keys.iter()
                    .enumerate()
                    .map(|(i, &k)| (k, self.tree.pool[start as usize + i]))
                    .collect()
            };
            if let Some(node) = self.tree.node_mut(dict) {
                *node = Node::OwnedDict(Box::new(pairs));
            }
        }
        let Some(id) = dict.node_id() else { return };
        let Some(Node::OwnedDict(pairs)) = self.tree.nodes.get(id as usize) else {
            return;
        };
        let n = pairs.len();
        let h = key_hash(&self.tree, k);
        let pos = if n < INDEX_FROM {
            pairs
                .iter()
                .position(|(old, _)| keys_equal(&self.tree, *old, k))
        } else {
            if !self.dict_index.contains_key(&id) {
                let mut index: FxHashMap<u64, Vec<u32>> = FxHashMap::default();
                for (i, (old, _)) in pairs.iter().enumerate() {
                    index
                        .entry(key_hash(&self.tree, *old))
                        .or_default()
                        .push(i as u32);
                }
                self.dict_index.insert(id, index);
            }
            self.dict_index
                .get(&id)
                .and_then(|ix| ix.get(&h))
                .and_then(|c| {
                    c.iter()
                        .copied()
                        .find(|&i| keys_equal(&self.tree, pairs[i as usize].0, k))
                })
                .map(|i| i as usize)
        };
        if pos.is_none() {
            if let Some(ix) = self.dict_index.get_mut(&id) {
                ix.entry(h).or_default().push(n as u32);
            }
        }
        if let Some(Node::OwnedDict(p)) = self.tree.node_mut(dict) {
            match pos {
                Some(i) => p[i].1 = v,
                None => p.push((k, v)),
            }
        }
    }

    /// Shape id for a key sequence, or `None` when the dict should be stored owned (duplicate
    /// keys, too many keys, too many shapes).
    fn shape_for(&mut self, keys: &[Val]) -> Option<u32> {
        if keys.len() > MAX_SHAPE_KEYS {
            return None;
        }
        if let Some(&id) = self.shape_ids.get(keys) {
            return Some(id);
        }
        if self.tree.shapes.len() >= MAX_SHAPES {
            return None;
        }
        // A new shape: refuse duplicate keys (by value), so shaped dicts are real Python dicts.
        for i in 0..keys.len() {
            for j in 0..i {
                if keys_equal(&self.tree, keys[i], keys[j]) {
                    return None;
                }
            }
        }
        let id = self.tree.shapes.len() as u32;
        let boxed: Box<[Val]> = keys.into();
        self.tree.shapes.push(boxed.clone());
        self.shape_ids.insert(boxed, id);
        Some(id)
    }

    fn tuple_from(&mut self, from: usize) -> R<Val> {
        let items: Vec<Val> = self.stack.drain(from..).collect();
        self.tuple_of(&items)
    }

    fn tuple_of(&mut self, items: &[Val]) -> R<Val> {
        let start = self.pool_push(items)?;
        let v = self.new_node(Node::Tuple {
            start,
            len: items.len() as u32,
        })?;
        self.nest(v, items)?;
        Ok(v)
    }

    fn record_call(&mut self, callable: Val, args: Val, state: Val) -> R<Val> {
        let v = self.new_node(Node::Call(Box::new((callable, args, state))))?;
        self.nest(v, &[callable, args, state])?;
        Ok(v)
    }

    fn text_str(&mut self, s: &'a [u8]) -> R<Val> {
        match std::str::from_utf8(s) {
            Ok(_) => self.new_str(s),
            Err(_) => self.new_node(Node::OwnedStr(Box::new(
                String::from_utf8_lossy(s).into_owned(),
            ))),
        }
    }

    fn run(&mut self) -> R<()> {
        use PickleErrorKind::*;
        loop {
            self.op_at = self.p;
            if self.p >= self.next_progress {
                self.next_progress = self.p + PROGRESS_STEP;
                if let Some(sink) = self.sink.as_deref_mut() {
                    if !sink.progress(self.p) {
                        return Err(PickleError {
                            offset: self.p as u64,
                            kind: Cancelled,
                            message: "decoding was cancelled".into(),
                        });
                    }
                }
            }
            let op = match self.d.get(self.p) {
                Some(&b) => b,
                None => {
                    return Err(PickleError {
                        offset: self.p as u64,
                        kind: Truncated,
                        message: if self.p == 0 {
                            "the file is empty".into()
                        } else {
                            "file ends before the STOP opcode (still being written, or cut short)"
                                .into()
                        },
                    });
                }
            };
            self.p += 1;
            match op {
                // ---- framing / control ----
                op::PROTO => {
                    let proto = self.byte()?;
                    if proto > 5 {
                        return Err(
                            self.err(Invalid, format!("unsupported pickle protocol {proto}"))
                        );
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
                op::STOP => {
                    let root = self.pop()?;
                    self.tree.root = root;
                    return Ok(());
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
                // ---- constants and numbers ----
                op::NONE => self.push(Val::NONE)?,
                op::NEWTRUE => self.push(Val::TRUE)?,
                op::NEWFALSE => self.push(Val::FALSE)?,
                op::BININT1 => {
                    let b = self.byte()?;
                    self.push(Val::small_int(b as i64).unwrap_or(Val::NONE))?;
                }
                op::BININT2 => {
                    let v = self.u16()?;
                    self.push(Val::small_int(v as i64).unwrap_or(Val::NONE))?;
                }
                op::BININT => {
                    let v = self.u32()? as i32 as i64;
                    self.push(Val::small_int(v).unwrap_or(Val::NONE))?;
                }
                op::LONG1 => {
                    let n = self.byte()? as usize;
                    let b = self.take(n)?;
                    let v = self.new_long(b)?;
                    self.push(v)?;
                }
                op::LONG4 => {
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err(Invalid, "LONG4 with a negative length"));
                    }
                    let n = self.len_of(n as u64)?;
                    let b = self.take(n)?;
                    let v = self.new_long(b)?;
                    self.push(v)?;
                }
                op::BINFLOAT => {
                    let b = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    let v = self.new_node(Node::Float(f64::from_be_bytes(a)))?;
                    self.push(v)?;
                }
                // ---- strings and bytes ----
                op::SHORT_BINUNICODE => {
                    let n = self.byte()? as usize;
                    let b = self.take(n)?;
                    let v = self.new_str(b)?;
                    self.push(v)?;
                }
                op::BINUNICODE => {
                    let n = self.u32()? as u64;
                    let n = self.len_of(n)?;
                    let b = self.take(n)?;
                    let v = self.new_str(b)?;
                    self.push(v)?;
                }
                op::BINUNICODE8 => {
                    let n = self.u64()?;
                    let n = self.len_of(n)?;
                    let b = self.take(n)?;
                    let v = self.new_str(b)?;
                    self.push(v)?;
                }
                op::BINSTRING => {
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err(Invalid, "BINSTRING with a negative length"));
                    }
                    let n = self.len_of(n as u64)?;
                    let b = self.take(n)?;
                    let v = self.text_str(b)?;
                    self.push(v)?;
                }
                op::SHORT_BINSTRING => {
                    let n = self.byte()? as usize;
                    let b = self.take(n)?;
                    let v = self.text_str(b)?;
                    self.push(v)?;
                }
                op::BINBYTES => {
                    let n = self.u32()? as u64;
                    let n = self.len_of(n)?;
                    let b = self.take(n)?;
                    let v = self.new_bytes(b)?;
                    self.push(v)?;
                }
                op::SHORT_BINBYTES => {
                    let n = self.byte()? as usize;
                    let b = self.take(n)?;
                    let v = self.new_bytes(b)?;
                    self.push(v)?;
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = self.u64()?;
                    let n = self.len_of(n)?;
                    let b = self.take(n)?;
                    let v = self.new_bytes(b)?;
                    self.push(v)?;
                }
                // ---- containers ----
                op::EMPTY_LIST => {
                    let streamed = self.starts_streamed_list();
                    let v = if streamed {
                        let ordinal = self.streamed;
                        let v = self.new_node(Node::StreamedList { count: 0, ordinal })?;
                        self.streamed = self.streamed.saturating_add(1);
                        v
                    } else if self.sink_sequences && self.in_streamed_dict() {
                        let seq = match self.sink.as_deref_mut() {
                            Some(sink) => sink.new_sequence(),
                            None => Err("no sink".into()),
                        };
                        match seq {
                            Ok(seq) if seq != u32::MAX => Val::sunk_list(seq),
                            Ok(_) => return Err(self.err(Limit, "more than 2^32 - 1 sunk lists")),
                            Err(m) => return Err(self.err(Invalid, m)),
                        }
                    } else {
                        self.new_node(Node::List { start: 0, len: 0 })?
                    };
                    self.push(v)?;
                }
                op::LIST => {
                    let m = self.pop_mark()?;
                    let v = self.new_node(Node::List { start: 0, len: 0 })?;
                    self.append_items(v, m)?;
                    self.push(v)?;
                }
                op::EMPTY_DICT => {
                    let v = match self.streamed_parent(self.stack.len()) {
                        Some(ordinal) => {
                            // The entry before, never filled, was `{}`: it goes first.
                            if let Some(e) = self.open_entry.take()
                                && self.stack.get(e.at) == Some(&e.val)
                                && let Some(o) = e.val.stream_dict_ordinal()
                            {
                                self.emit(o, &[])?;
                                self.stack[e.at] = Val::CONSUMED;
                            }
                            let v = Val::stream_dict(ordinal);
                            self.open_entry = Some(OpenEntry {
                                at: self.stack.len(),
                                val: v,
                                slot: None,
                            });
                            v
                        }
                        None if self.sink_sequences
                            && self.sunk_dicts.len() < MAX_SUNK_DICTS
                            && self.in_sunk_list() =>
                        {
                            let v = Val::pending_dict(self.pending_next);
                            self.pending_next = self.pending_next.wrapping_add(1);
                            self.sunk_dicts.push(SunkDict {
                                val: v,
                                slot: None,
                                more_slots: Vec::new(),
                            });
                            v
                        }
                        None => self.new_node(Node::Dict {
                            shape: u32::MAX,
                            start: 0,
                        })?,
                    };
                    self.push(v)?;
                }
                op::DICT => {
                    let m = self.pop_mark()?;
                    let v = self.new_node(Node::Dict {
                        shape: u32::MAX,
                        start: 0,
                    })?;
                    self.set_items(v, m)?;
                    self.push(v)?;
                }
                op::EMPTY_TUPLE => {
                    let v = self.tuple_of(&[])?;
                    self.push(v)?;
                }
                op::TUPLE => {
                    let m = self.pop_mark()?;
                    let v = self.tuple_from(m)?;
                    self.push(v)?;
                }
                op::TUPLE1..=op::TUPLE3 => {
                    let n = (op - op::TUPLE1 + 1) as usize;
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(self.err(Invalid, "stack underflow building a tuple"));
                    }
                    let from = self.stack.len() - n;
                    let v = self.tuple_from(from)?;
                    self.push(v)?;
                }
                op::APPEND => {
                    let item = self.pop()?;
                    let list = self.top()?;
                    self.push(item)?;
                    let from = self.stack.len() - 1;
                    self.append_items(list, from)?;
                }
                op::APPENDS => {
                    let m = self.pop_mark()?;
                    let list = self.top_below(m)?;
                    self.append_items(list, m)?;
                }
                op::SETITEM => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let dict = self.top()?;
                    self.push(k)?;
                    self.push(v)?;
                    let from = self.stack.len() - 2;
                    self.set_items(dict, from)?;
                }
                op::SETITEMS => {
                    let m = self.pop_mark()?;
                    let dict = self.top_below(m)?;
                    self.set_items(dict, m)?;
                }
                op::EMPTY_SET => {
                    let v = self.new_node(Node::Set(Box::default()))?;
                    self.push(v)?;
                }
                op::ADDITEMS => {
                    let m = self.pop_mark()?;
                    let set = self.top_below(m)?;
                    if !matches!(self.tree.node_mut(set), Some(Node::Set(_))) {
                        return Err(self.err(Invalid, "ADDITEMS on something that is not a set"));
                    }
                    self.append_items(set, m)?;
                }
                op::FROZENSET => {
                    let m = self.pop_mark()?;
                    let items: Vec<Val> = self.stack.drain(m..).collect();
                    let v = self.new_node(Node::Set(Box::new(items.clone())))?;
                    self.nest(v, &items)?;
                    self.push(v)?;
                }
                // ---- memo ----
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
                // ---- code: recorded, never executed ----
                // Protocol-0 text opcodes, objects and globals: rare in snapshots.
                _ => self.rare_op(op)?,
            }
        }
    }

    fn refuse_code(&self, what: &str) -> PickleError {
        self.err(
            PickleErrorKind::Refused,
            format!("the pickle references code (`{what}`); memory snapshots contain only data, so the file is refused and nothing was imported or run"),
        )
    }

    /// The object below the items that start at `mark` (the list/dict being extended).
    fn top_below(&self, mark: usize) -> R<Val> {
        if mark == 0 {
            return Err(self.err(PickleErrorKind::Invalid, "no object below the MARK"));
        }
        if self.marks.last().is_some_and(|&m| m >= mark) {
            return Err(self.err(PickleErrorKind::Invalid, "no object below the MARK"));
        }
        Ok(self.stack[mark - 1])
    }

    /// The opcodes a snapshot rarely or never uses: protocol-0 text forms, memo text forms,
    /// globals and object construction (recorded as inert nodes, never executed), extensions,
    /// out-of-band buffers, and unknown opcodes.
    fn rare_op(&mut self, op: u8) -> R<()> {
        use PickleErrorKind::*;
        match op {
            op::INT => {
                let line = self.line()?;
                let v = match line {
                    b"01" => Val::TRUE,
                    b"00" => Val::FALSE,
                    _ => {
                        let s = std::str::from_utf8(line)
                            .ok()
                            .and_then(|s| s.trim().parse::<i64>().ok());
                        match s {
                            Some(i) => self.int_val(i)?,
                            None => {
                                return Err(self.err(Invalid, "INT with a malformed number"));
                            }
                        }
                    }
                };
                self.push(v)?;
            }
            op::LONG => {
                let line = self.line()?;
                let text = std::str::from_utf8(line)
                    .unwrap_or("")
                    .trim()
                    .trim_end_matches('L');
                let v = match text.parse::<i128>() {
                    // Protocols 0 and 1 write every int past 2^31 this way (a CUDA address, a
                    // time in µs): inline when it fits, as LONG1 gets it.
                    Ok(i) if i64::try_from(i).is_ok() => self.int_val(i as i64)?,
                    Ok(i) => {
                        let bytes = i.to_le_bytes();
                        self.new_long(&bytes)?
                    }
                    Err(_) => {
                        return Err(
                            self.err(Invalid, "LONG with a malformed or over-128-bit number")
                        );
                    }
                };
                self.push(v)?;
            }
            op::FLOAT => {
                let line = self.line()?;
                let f = std::str::from_utf8(line)
                    .ok()
                    .and_then(|s| s.trim().parse::<f64>().ok());
                let Some(f) = f else {
                    return Err(self.err(Invalid, "FLOAT with a malformed number"));
                };
                let v = self.new_node(Node::Float(f))?;
                self.push(v)?;
            }
            op::UNICODE => {
                let line = self.line()?;
                let s = raw_unicode_unescape(line);
                let v = self.new_node(Node::OwnedStr(Box::new(s)))?;
                self.push(v)?;
            }
            op::STRING => {
                let line = self.line()?;
                let Some(s) = py_repr_unquote(line) else {
                    return Err(self.err(Invalid, "STRING argument is not a quoted string"));
                };
                let v = self.new_node(Node::OwnedStr(Box::new(
                    String::from_utf8_lossy(&s).into_owned(),
                )))?;
                self.push(v)?;
            }
            op::PUT => {
                let i = self.text_index("PUT")?;
                self.memo_put(i)?;
            }
            op::GET => {
                let i = self.text_index("GET")?;
                self.memo_get(i)?;
            }
            op::GLOBAL => {
                let module = self.line()?;
                let name = self.line()?;
                if self.limits.refuse_globals {
                    let (m, n) = (
                        String::from_utf8_lossy(module),
                        String::from_utf8_lossy(name),
                    );
                    return Err(self.refuse_code(&format!("{m}.{n}")));
                }
                let m = self.text_str(module)?;
                let n = self.text_str(name)?;
                let v = self.new_node(Node::Global(Box::new((m, n))))?;
                self.push(v)?;
            }
            op::STACK_GLOBAL => {
                let name = self.pop()?;
                let module = self.pop()?;
                if self.limits.refuse_globals {
                    let what = format!(
                        "{}.{}",
                        self.tree.str(module).unwrap_or("?"),
                        self.tree.str(name).unwrap_or("?")
                    );
                    return Err(self.refuse_code(&what));
                }
                let v = self.new_node(Node::Global(Box::new((module, name))))?;
                self.push(v)?;
            }
            op::REDUCE => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = self.record_call(callable, args, Val::NONE)?;
                self.push(v)?;
            }
            op::NEWOBJ => {
                let args = self.pop()?;
                let cls = self.pop()?;
                let v = self.record_call(cls, args, Val::NONE)?;
                self.push(v)?;
            }
            op::NEWOBJ_EX => {
                let kwargs = self.pop()?;
                let args = self.pop()?;
                let cls = self.pop()?;
                let both = self.tuple_of(&[args, kwargs])?;
                let v = self.record_call(cls, both, Val::NONE)?;
                self.push(v)?;
            }
            op::BUILD => {
                let state = self.pop()?;
                let obj = self.pop()?;
                let v = self.record_call(obj, Val::NONE, state)?;
                self.push(v)?;
            }
            op::INST => {
                let module = self.line()?;
                let name = self.line()?;
                if self.limits.refuse_globals {
                    let (m, n) = (
                        String::from_utf8_lossy(module),
                        String::from_utf8_lossy(name),
                    );
                    return Err(self.refuse_code(&format!("{m}.{n}")));
                }
                let m = self.pop_mark()?;
                let args = self.tuple_from(m)?;
                let mv = self.text_str(module)?;
                let nv = self.text_str(name)?;
                let g = self.new_node(Node::Global(Box::new((mv, nv))))?;
                let v = self.record_call(g, args, Val::NONE)?;
                self.push(v)?;
            }
            op::OBJ => {
                let m = self.pop_mark()?;
                if self.stack.len() <= m {
                    return Err(self.err(Invalid, "OBJ without a class"));
                }
                let cls = self.stack[m];
                let args = self.tuple_from(m + 1)?;
                self.stack.truncate(m);
                let v = self.record_call(cls, args, Val::NONE)?;
                self.push(v)?;
            }
            op::PERSID | op::BINPERSID => {
                return Err(self.err(
                    Refused,
                    "persistent ids (PERSID) are not supported: this is not a memory snapshot",
                ));
            }
            op::EXT1..=op::EXT4 => {
                return Err(self.err(
                    Refused,
                    "extension-registry opcodes (EXT1/2/4) are not supported",
                ));
            }
            op::NEXT_BUFFER | op::READONLY_BUFFER => {
                return Err(self.err(
                    Refused,
                    "out-of-band buffers (pickle protocol 5 NEXT_BUFFER) are not supported",
                ));
            }
            _ => {
                return Err(self.err(Invalid, format!("unknown pickle opcode 0x{op:02x}")));
            }
        }
        Ok(())
    }
}

// Silence "unused" for the placeholder constant in builds without debug assertions.
const _: Val = MARK;

/// Dict-key equality: identical values, or equal strings / ints.
fn keys_equal(t: &Tree<'_>, a: Val, b: Val) -> bool {
    if a == b {
        return true;
    }
    if let (Some(x), Some(y)) = (t.str(a), t.str(b)) {
        return x == y;
    }
    if let (Some(x), Some(y)) = (t.int128(a), t.int128(b)) {
        return x == y;
    }
    false
}

/// A hash consistent with [`keys_equal`]: equal strs and equal ints hash alike.
fn key_hash(t: &Tree<'_>, k: Val) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    if let Some(s) = t.str(k) {
        (0u8, s).hash(&mut h);
    } else if let Some(i) = t.int128(k) {
        (1u8, i).hash(&mut h);
    } else {
        (2u8, k).hash(&mut h);
    }
    h.finish()
}

/// Python `repr()` string literal (protocol 0 `STRING`) → bytes.
fn py_repr_unquote(line: &[u8]) -> Option<Vec<u8>> {
    let q = *line.first()?;
    if !(q == b'\'' || q == b'"') || line.len() < 2 || *line.last()? != q {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        if c != b'\\' || i + 1 >= body.len() {
            out.push(c);
            i += 1;
            continue;
        }
        let e = body[i + 1];
        i += 2;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'0' => out.push(0),
            b'\\' | b'\'' | b'"' => out.push(e),
            b'x' if i + 2 <= body.len() => {
                let hex = std::str::from_utf8(&body[i..i + 2]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            _ => {
                out.push(b'\\');
                out.push(e);
            }
        }
    }
    Some(out)
}

/// `raw-unicode-escape` (protocol 0 `UNICODE`): `\uXXXX` and `\UXXXXXXXX` escapes, bytes as latin-1.
fn raw_unicode_unescape(line: &[u8]) -> String {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        let c = line[i];
        if c == b'\\' && i + 1 < line.len() && (line[i + 1] == b'u' || line[i + 1] == b'U') {
            let n = if line[i + 1] == b'u' { 4 } else { 8 };
            if let Some(hex) = line.get(i + 2..i + 2 + n) {
                if let Some(ch) = std::str::from_utf8(hex)
                    .ok()
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .and_then(char::from_u32)
                {
                    out.push(ch);
                    i += 2 + n;
                    continue;
                }
            }
        }
        out.push(c as char);
        i += 1;
    }
    out
}
