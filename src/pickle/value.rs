//! The decoded object graph: an arena of nodes, compact 8-byte values, shared by id.
//!
//! Sharing is preserved, never cloned: a `BINGET` of a memoized dict yields the same [`Val`] as the
//! original, so a frame dict referenced from 10,000 stacks exists once. Small integers, `None` and
//! booleans live inside the `Val` itself; everything else is a [`Node`] in the arena.
//!
//! Container items live in one shared pool (`Tree::pool`). Dicts built by a single `SETITEMS`
//! (every dict `pickle.dumps` writes with ≤ 1000 items) store only their values in the pool; their
//! keys are a *shape* shared by all dicts with the same key sequence — a snapshot's millions of
//! trace-entry dicts share a handful of shapes, which keeps the graph smaller than the file.

use std::borrow::Cow;

/// A value: an inline small int / constant, or a node id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Val(u64);

const TAG_BITS: u32 = 3;
const TAG_MASK: u64 = 0b111;
const TAG_INT: u64 = 0;
const TAG_NODE: u64 = 1;
const TAG_CONST: u64 = 2;
/// A zero-copy UTF-8 string: 40-bit input offset, 21-bit length, no arena node.
const TAG_STR: u64 = 3;
const STR_LEN_BITS: u32 = 21;
/// Payloads of constant values from here on are [`Val::stream_dict`]s.
const STREAM_DICT_BASE: u64 = 1 << 32;
/// …from here on [`Val::sunk_list`]s…
const SUNK_LIST_BASE: u64 = 1 << 33;
/// …from here on [`Val::pending_dict`]s…
const PENDING_DICT_BASE: u64 = 1 << 34;
/// …and from here to `SUNK_DICT_END` [`Val::sunk_dict`]s.
const SUNK_DICT_BASE: u64 = 1 << 35;
const SUNK_DICT_END: u64 = 1 << 36;

/// Largest magnitude an inline int holds (±2^60).
const INLINE_MAX: i64 = (1 << 60) - 1;
const INLINE_MIN: i64 = -(1 << 60);

impl Val {
    pub const NONE: Val = Val(TAG_CONST);
    pub const TRUE: Val = Val(TAG_CONST | (1 << TAG_BITS));
    pub const FALSE: Val = Val(TAG_CONST | (2 << TAG_BITS));
    /// A streamed dict already handed to the sink.
    pub(crate) const CONSUMED: Val = Val(TAG_CONST | (3 << TAG_BITS));
    /// What the memo holds for a streamed dict once the sink read it: a later reference to the
    /// same dict (a trace entry written twice as one object) cannot be read again.
    pub(crate) const READ_ENTRY: Val = Val(TAG_CONST | (4 << TAG_BITS));

    /// A fresh dict that is an item of streamed list number `ordinal`: no arena node, its items
    /// go to the sink when its `SETITEMS` runs.
    pub(crate) fn stream_dict(ordinal: u32) -> Val {
        Val(TAG_CONST | ((STREAM_DICT_BASE + ordinal as u64) << TAG_BITS))
    }
    /// A list inside a streamed dict whose items go to the sink as sequence number `seq`: no
    /// arena node either.
    pub(crate) fn sunk_list(seq: u32) -> Val {
        Val(TAG_CONST | ((SUNK_LIST_BASE + seq as u64) << TAG_BITS))
    }
    /// The sequence number of a [`Val::sunk_list`].
    pub(crate) fn sunk_list_seq(self) -> Option<u32> {
        self.const_in(SUNK_LIST_BASE, PENDING_DICT_BASE)
    }
    /// A fresh dict that is an item of a sunk list, before its items arrived: no arena node.
    /// `n` tells it from the other dicts being filled.
    pub(crate) fn pending_dict(n: u32) -> Val {
        Val(TAG_CONST | ((PENDING_DICT_BASE + n as u64) << TAG_BITS))
    }
    pub(crate) fn pending_dict_index(self) -> Option<u32> {
        self.const_in(PENDING_DICT_BASE, SUNK_DICT_BASE)
    }
    /// A dict that was an item of a sunk list, after the sink turned its items into number `id`
    /// ([`crate::pickle::Sink::sequence_dict`]): what every reference to it holds from then on.
    pub(crate) fn sunk_dict(id: u32) -> Val {
        Val(TAG_CONST | ((SUNK_DICT_BASE + id as u64) << TAG_BITS))
    }
    /// The sink's number of a [`Val::sunk_dict`].
    pub(crate) fn sunk_dict_id(self) -> Option<u32> {
        self.const_in(SUNK_DICT_BASE, SUNK_DICT_END)
    }
    /// The offset in `[lo, hi)` of a constant's payload.
    #[inline]
    fn const_in(self, lo: u64, hi: u64) -> Option<u32> {
        let payload = self.0 >> TAG_BITS;
        (self.0 & TAG_MASK == TAG_CONST && (lo..hi).contains(&payload))
            .then(|| (payload - lo) as u32)
    }
    /// The list number of a [`Val::stream_dict`].
    pub(crate) fn stream_dict_ordinal(self) -> Option<u32> {
        self.const_in(STREAM_DICT_BASE, SUNK_LIST_BASE)
    }

    /// An inline int, or `None` if it does not fit in 61 bits.
    pub(crate) fn small_int(v: i64) -> Option<Val> {
        (INLINE_MIN..=INLINE_MAX)
            .contains(&v)
            .then_some(Val(((v << TAG_BITS) as u64) | TAG_INT))
    }
    /// An inline string reference to `data[offset .. offset + len]`, if it fits.
    pub(crate) fn inline_str(offset: usize, len: usize) -> Option<Val> {
        (offset < (1 << 40) && len < (1 << STR_LEN_BITS))
            .then_some(Val(((offset as u64) << (TAG_BITS + STR_LEN_BITS))
                | ((len as u64) << TAG_BITS)
                | TAG_STR))
    }
    fn str_range(self) -> Option<(usize, usize)> {
        (self.0 & TAG_MASK == TAG_STR).then(|| {
            let len = ((self.0 >> TAG_BITS) & ((1 << STR_LEN_BITS) - 1)) as usize;
            let off = (self.0 >> (TAG_BITS + STR_LEN_BITS)) as usize;
            (off, len)
        })
    }
    pub(crate) fn node(id: u32) -> Val {
        Val(((id as u64) << TAG_BITS) | TAG_NODE)
    }
    pub(crate) fn node_id(self) -> Option<u32> {
        (self.0 & TAG_MASK == TAG_NODE).then_some((self.0 >> TAG_BITS) as u32)
    }
    #[inline]
    fn inline_int(self) -> Option<i64> {
        (self.0 & TAG_MASK == TAG_INT).then_some((self.0 as i64) >> TAG_BITS)
    }
}

/// An arena node. Kept at 16 bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// UTF-8 text, zero-copy: `data[start .. start + len]` with `start = hi << 32 | lo`.
    Str {
        lo: u32,
        hi: u16,
        len: u32,
    },
    /// Text that had to be decoded (escapes, invalid UTF-8, JSON input).
    OwnedStr(Box<String>),
    /// Bytes / bytearray, zero-copy (offset split like `Str`).
    Bytes {
        lo: u32,
        hi: u16,
        len: u32,
    },
    /// An int too large for an inline `Val`: little-endian two's complement bytes.
    BigInt(Box<Vec<u8>>),
    Float(f64),
    /// List items in `pool[start .. start + len]`.
    List {
        start: u32,
        len: u32,
    },
    /// A list that grew in several batches after other containers were built.
    OwnedList(Box<Vec<Val>>),
    /// Tuple items in `pool[start .. start + len]`.
    Tuple {
        start: u32,
        len: u32,
    },
    /// Set / frozenset items (kept as a sequence).
    Set(Box<Vec<Val>>),
    /// A dict with a shared key shape: values in `pool[start .. start + shape.len()]`.
    Dict {
        shape: u32,
        start: u32,
    },
    /// A dict filled by several `SETITEM(S)` or with too many distinct shapes.
    OwnedDict(Box<Vec<(Val, Val)>>),
    /// A list whose items were handed to a [`crate::pickle::vm::Sink`] as they were decoded.
    StreamedList {
        count: u32,
        ordinal: u32,
    },
    /// A dict that was handed to a sink and not kept.
    Consumed,
    /// `GLOBAL` / `STACK_GLOBAL`: recorded, never imported.
    Global(Box<(Val, Val)>),
    /// `REDUCE` / `NEWOBJ` / `OBJ` / `INST` / `BUILD`: recorded, never called. `(callable, args, state)`.
    Call(Box<(Val, Val, Val)>),
}

/// What a [`Val`] is, for matching.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind<'t> {
    None,
    Bool(bool),
    Int(i64),
    BigInt(&'t [u8]),
    Float(f64),
    Str,
    Bytes,
    List,
    Tuple,
    Set,
    Dict,
    Global,
    Call,
    /// A value already handed to a streaming sink (its content is not in the tree).
    Consumed,
}

/// The decoded pickle: arena, container pool, dict shapes, and the root value.
#[derive(Debug, Default)]
pub struct Tree<'a> {
    /// The input the zero-copy nodes point into.
    pub(crate) data: &'a [u8],
    pub(crate) nodes: Vec<Node>,
    pub(crate) pool: Vec<Val>,
    pub(crate) shapes: Vec<Box<[Val]>>,
    pub root: Val,
    /// Pickle protocol from the PROTO opcode, if present.
    pub protocol: Option<u8>,
}

impl Default for Val {
    fn default() -> Self {
        Val::NONE
    }
}

impl<'a> Tree<'a> {
    /// A tree built by hand (JSON input, tests): strings are owned.
    pub fn empty() -> Tree<'static> {
        Tree {
            data: &[],
            nodes: Vec::new(),
            pool: Vec::new(),
            shapes: Vec::new(),
            root: Val::NONE,
            protocol: None,
        }
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn node(&self, v: Val) -> Option<&Node> {
        self.nodes.get(v.node_id()? as usize)
    }

    pub fn kind(&self, v: Val) -> Kind<'_> {
        if let Some(i) = v.inline_int() {
            return Kind::Int(i);
        }
        if v.str_range().is_some() {
            return Kind::Str;
        }
        match v {
            Val::NONE => return Kind::None,
            Val::TRUE => return Kind::Bool(true),
            Val::FALSE => return Kind::Bool(false),
            _ if v.0 & TAG_MASK == TAG_CONST => return Kind::Consumed,
            _ => {}
        }
        match self.node(v) {
            Some(Node::Str { .. } | Node::OwnedStr(_)) => Kind::Str,
            Some(Node::Bytes { .. }) => Kind::Bytes,
            Some(Node::BigInt(b)) => Kind::BigInt(b),
            Some(Node::Float(f)) => Kind::Float(*f),
            Some(Node::List { .. } | Node::OwnedList(_) | Node::StreamedList { .. }) => Kind::List,
            Some(Node::Consumed) => Kind::Consumed,
            Some(Node::Tuple { .. }) => Kind::Tuple,
            Some(Node::Set(_)) => Kind::Set,
            Some(Node::Dict { .. } | Node::OwnedDict(_)) => Kind::Dict,
            Some(Node::Global(_)) => Kind::Global,
            Some(Node::Call(_)) => Kind::Call,
            None => Kind::None,
        }
    }

    /// The text of a str value.
    pub fn str(&self, v: Val) -> Option<&str> {
        if let Some((off, len)) = v.str_range() {
            // Validated as UTF-8 when decoded.
            return std::str::from_utf8(self.data.get(off..off + len)?).ok();
        }
        match self.node(v)? {
            Node::Str { lo, hi, len } => {
                let start = split_offset(*lo, *hi);
                let bytes = self.data.get(start..start.checked_add(*len as usize)?)?;
                // Validated when decoded.
                std::str::from_utf8(bytes).ok()
            }
            Node::OwnedStr(s) => Some(s),
            _ => None,
        }
    }

    pub fn bytes(&self, v: Val) -> Option<&[u8]> {
        match self.node(v)? {
            Node::Bytes { lo, hi, len } => {
                let start = split_offset(*lo, *hi);
                self.data.get(start..start.checked_add(*len as usize)?)
            }
            _ => None,
        }
    }

    /// An int that fits in i64 (bools count as 0/1, like Python).
    pub fn int(&self, v: Val) -> Option<i64> {
        match self.kind(v) {
            Kind::Int(i) => Some(i),
            Kind::Bool(b) => Some(b as i64),
            Kind::BigInt(b) => bigint_to_i128(b).and_then(|x| i64::try_from(x).ok()),
            _ => None,
        }
    }

    /// An int as u64: negative → `None`; beyond 2^64 → `None`.
    pub fn uint(&self, v: Val) -> Option<u64> {
        match self.kind(v) {
            Kind::Int(i) => u64::try_from(i).ok(),
            Kind::Bool(b) => Some(b as u64),
            Kind::BigInt(b) => bigint_to_i128(b).and_then(|x| u64::try_from(x).ok()),
            _ => None,
        }
    }

    /// Any int as i128 (`None` beyond 128 bits).
    #[inline]
    pub fn int128(&self, v: Val) -> Option<i128> {
        if let Some(i) = v.inline_int() {
            return Some(i as i128);
        }
        self.int128_node(v)
    }

    fn int128_node(&self, v: Val) -> Option<i128> {
        match self.kind(v) {
            Kind::Int(i) => Some(i as i128),
            Kind::Bool(b) => Some(b as i128),
            Kind::BigInt(b) => bigint_to_i128(b),
            _ => None,
        }
    }

    pub fn float(&self, v: Val) -> Option<f64> {
        match self.kind(v) {
            Kind::Float(f) => Some(f),
            Kind::Int(i) => Some(i as f64),
            _ => None,
        }
    }

    pub fn bool(&self, v: Val) -> Option<bool> {
        match self.kind(v) {
            Kind::Bool(b) => Some(b),
            Kind::Int(i) => Some(i != 0),
            _ => None,
        }
    }

    /// Items of a list, tuple or set (empty for anything else).
    pub fn items(&self, v: Val) -> &[Val] {
        match self.node(v) {
            Some(Node::List { start, len } | Node::Tuple { start, len }) => {
                self.pool_slice(*start, *len)
            }
            Some(Node::OwnedList(items) | Node::Set(items)) => items,
            _ => &[],
        }
    }

    /// For a list whose items went to a streaming sink: its list number (the sink's `list`).
    pub fn streamed_ordinal(&self, v: Val) -> Option<u32> {
        match self.node(v) {
            Some(Node::StreamedList { ordinal, .. }) => Some(*ordinal),
            _ => None,
        }
    }

    /// For a list whose items went to the sink's [`crate::pickle::Sink::sequence`]: its sequence
    /// number; `None` for anything else.
    pub fn sunk(&self, v: Val) -> Option<u32> {
        v.sunk_list_seq()
    }

    /// For a dict that was an item of a sunk list: the number the sink gave it
    /// ([`crate::pickle::Sink::sequence_dict`]); `None` for anything else.
    pub fn sunk_dict(&self, v: Val) -> Option<u32> {
        v.sunk_dict_id()
    }

    /// Whether `v` is a list or tuple.
    pub fn is_seq(&self, v: Val) -> bool {
        matches!(self.kind(v), Kind::List | Kind::Tuple)
    }

    /// Whether `v` is a dict.
    pub fn is_dict(&self, v: Val) -> bool {
        self.kind(v) == Kind::Dict
    }

    /// `(key, value)` pairs of a dict in insertion order (empty for anything else).
    pub fn pairs(&self, v: Val) -> DictIter<'_> {
        match self.node(v) {
            Some(Node::Dict { shape, start }) => {
                let keys: &[Val] = self
                    .shapes
                    .get(*shape as usize)
                    .map(|k| &k[..])
                    .unwrap_or(&[]);
                DictIter::Shaped {
                    keys,
                    values: self.pool_slice(*start, keys.len() as u32),
                    i: 0,
                }
            }
            Some(Node::OwnedDict(pairs)) => DictIter::Owned(pairs.iter()),
            _ => DictIter::Owned([].iter()),
        }
    }

    /// Values of a shaped dict in key order (empty for anything else); see [`Tree::shape_of`].
    pub fn shaped_values(&self, v: Val) -> &[Val] {
        match self.node(v) {
            Some(Node::Dict { shape, start }) => {
                let n = self.shapes.get(*shape as usize).map_or(0, |k| k.len());
                self.pool_slice(*start, n as u32)
            }
            _ => &[],
        }
    }

    /// Number of entries of a dict, list, tuple or set.
    pub fn len(&self, v: Val) -> usize {
        match self.node(v) {
            Some(Node::Dict { shape, .. }) => {
                self.shapes.get(*shape as usize).map_or(0, |k| k.len())
            }
            Some(Node::OwnedDict(p)) => p.len(),
            _ => self.items(v).len(),
        }
    }

    /// Dict shape id (dicts with the same key sequence share one), for callers that cache key
    /// positions. `None` for dicts without a shape.
    pub fn shape_of(&self, v: Val) -> Option<u32> {
        match self.node(v) {
            Some(Node::Dict { shape, .. }) => Some(*shape),
            _ => None,
        }
    }

    /// Value for the str key `key` (linear scan; dicts here are small).
    pub fn get(&self, dict: Val, key: &str) -> Option<Val> {
        self.pairs(dict)
            .find(|(k, _)| self.str(*k) == Some(key))
            .map(|(_, v)| v)
    }

    /// `(module, name)` of a recorded global.
    pub fn global(&self, v: Val) -> Option<(Cow<'_, str>, Cow<'_, str>)> {
        match self.node(v)? {
            Node::Global(g) => Some((
                Cow::Borrowed(self.str(g.0).unwrap_or("?")),
                Cow::Borrowed(self.str(g.1).unwrap_or("?")),
            )),
            _ => None,
        }
    }

    /// `(callable, args, state)` of a recorded call / object construction.
    pub fn call(&self, v: Val) -> Option<(Val, Val, Val)> {
        match self.node(v)? {
            Node::Call(c) => Some(**c),
            _ => None,
        }
    }

    /// A short description of a value for error messages: `a dict`, `an int`, `a call to os.system`.
    pub fn describe(&self, v: Val) -> String {
        match self.kind(v) {
            Kind::None => "None".into(),
            Kind::Bool(_) => "a bool".into(),
            Kind::Int(_) | Kind::BigInt(_) => "an int".into(),
            Kind::Float(_) => "a float".into(),
            Kind::Str => "a str".into(),
            Kind::Bytes => "a bytes object".into(),
            Kind::List => "a list".into(),
            Kind::Tuple => "a tuple".into(),
            Kind::Set => "a set".into(),
            Kind::Dict => "a dict".into(),
            Kind::Consumed if self.sunk(v).is_some() => {
                "a list of a streamed trace entry, referenced outside it".into()
            }
            Kind::Consumed if v == Val::READ_ENTRY => {
                "a trace entry referenced a second time (the same dict as an earlier entry)".into()
            }
            Kind::Consumed if v.pending_dict_index().is_some() => {
                "a dict referenced while it was being filled".into()
            }
            Kind::Consumed if v.sunk_dict_id().is_some() => {
                "an item of a list of a streamed trace entry, referenced outside it".into()
            }
            Kind::Consumed => "a streamed trace entry referenced a second time".into(),
            Kind::Global => match self.global(v) {
                Some((m, n)) => format!("a reference to {m}.{n}"),
                None => "a global".into(),
            },
            Kind::Call => match self.call(v).and_then(|(c, _, _)| self.global(c)) {
                Some((m, n)) => format!("a call to {m}.{n}"),
                None => "an object construction".into(),
            },
        }
    }

    fn pool_slice(&self, start: u32, len: u32) -> &[Val] {
        self.pool
            .get(start as usize..start as usize + len as usize)
            .unwrap_or(&[])
    }

    // ---- construction (used by the VM and by JSON input) ----

    pub(crate) fn push_node(&mut self, n: Node) -> Result<Val, &'static str> {
        let id = u32::try_from(self.nodes.len()).map_err(|_| "more than 2^32 objects")?;
        if id >= (1 << 31) {
            return Err("more than 2^31 objects");
        }
        self.nodes.push(n);
        Ok(Val::node(id))
    }

    /// Build an owned string node.
    pub fn new_str(&mut self, s: &str) -> Val {
        self.push_node(Node::OwnedStr(Box::new(s.into())))
            .unwrap_or(Val::NONE)
    }

    /// Build an int (inline when small).
    pub fn new_int(&mut self, i: i128) -> Val {
        if let Some(v) = i64::try_from(i).ok().and_then(Val::small_int) {
            return v;
        }
        let bytes = i.to_le_bytes();
        self.push_node(Node::BigInt(Box::new(bytes.to_vec())))
            .unwrap_or(Val::NONE)
    }

    pub fn new_float(&mut self, f: f64) -> Val {
        self.push_node(Node::Float(f)).unwrap_or(Val::NONE)
    }

    pub fn new_list(&mut self, items: Vec<Val>) -> Val {
        self.push_node(Node::OwnedList(Box::new(items)))
            .unwrap_or(Val::NONE)
    }

    pub fn new_dict(&mut self, pairs: Vec<(Val, Val)>) -> Val {
        self.push_node(Node::OwnedDict(Box::new(pairs)))
            .unwrap_or(Val::NONE)
    }

    pub(crate) fn node_mut(&mut self, v: Val) -> Option<&mut Node> {
        let id = v.node_id()? as usize;
        self.nodes.get_mut(id)
    }
}

/// Iterator over a dict's pairs.
pub enum DictIter<'t> {
    Shaped {
        keys: &'t [Val],
        values: &'t [Val],
        i: usize,
    },
    Owned(std::slice::Iter<'t, (Val, Val)>),
}

impl Iterator for DictIter<'_> {
    type Item = (Val, Val);
    fn next(&mut self) -> Option<(Val, Val)> {
        match self {
            DictIter::Shaped { keys, values, i } => {
                let k = *keys.get(*i)?;
                let v = *values.get(*i)?;
                *i += 1;
                Some((k, v))
            }
            DictIter::Owned(it) => it.next().copied(),
        }
    }
}

fn split_offset(lo: u32, hi: u16) -> usize {
    ((hi as u64) << 32 | lo as u64) as usize
}

/// Split a byte offset for `Node::Str` / `Node::Bytes`; `None` beyond 2^48.
pub(crate) fn join_offset(offset: usize) -> Option<(u32, u16)> {
    let o = offset as u64;
    (o < 1 << 48).then_some((o as u32, (o >> 32) as u16))
}

/// Little-endian two's complement → i128, `None` when it needs more than 128 bits.
pub fn bigint_to_i128(b: &[u8]) -> Option<i128> {
    if b.is_empty() {
        return Some(0);
    }
    let neg = b[b.len() - 1] & 0x80 != 0;
    let fill = if neg { 0xff } else { 0 };
    // Strip redundant sign bytes.
    let mut n = b.len();
    while n > 1 && b[n - 1] == fill && (b[n - 2] & 0x80 != 0) == neg {
        n -= 1;
    }
    if n > 16 {
        return None;
    }
    let mut buf = [fill; 16];
    buf[..n].copy_from_slice(&b[..n]);
    Some(i128::from_le_bytes(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_ints_round_trip_at_the_edges() {
        for i in [0, 1, -1, INLINE_MAX, INLINE_MIN, 1 << 47, -(1 << 40)] {
            let v = Val::small_int(i).unwrap();
            assert_eq!(v.inline_int(), Some(i));
        }
        assert!(Val::small_int(INLINE_MAX + 1).is_none());
        assert!(Val::small_int(i64::MIN).is_none());
    }

    #[test]
    fn bigints_decode_twos_complement() {
        assert_eq!(bigint_to_i128(&[0xff]), Some(-1));
        assert_eq!(bigint_to_i128(&[0xff, 0x00]), Some(255));
        // 2^64 - 1 as Python writes it with LONG1: 9 bytes.
        assert_eq!(
            bigint_to_i128(&[0xff; 8].iter().copied().chain([0]).collect::<Vec<_>>()),
            Some(u64::MAX as i128)
        );
        let mut big = vec![0u8; 20];
        big[18] = 1;
        assert_eq!(bigint_to_i128(&big), None);
    }

    #[test]
    fn node_stays_small() {
        assert!(
            std::mem::size_of::<Node>() <= 16,
            "Node is {} bytes",
            std::mem::size_of::<Node>()
        );
        assert_eq!(std::mem::size_of::<Val>(), 8);
    }
}
