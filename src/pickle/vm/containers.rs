//! Container opcodes: lists, dicts, tuples and sets in the arena, with nesting and dict-key
//! semantics as in Python.

use rustc_hash::FxHashMap;

use super::{INDEX_FROM, MAX_SHAPE_KEYS, MAX_SHAPES, PickleErrorKind, R, Vm};
use crate::pickle::opcodes as op;
use crate::pickle::value::{Node, Tree, Val};

impl<'a> Vm<'a, '_> {
    /// `EMPTY_LIST` … `FROZENSET`: build and fill containers.
    #[inline(always)]
    pub(super) fn container_op(&mut self, op: u8) -> R<()> {
        use PickleErrorKind::*;
        match op {
            op::EMPTY_LIST => {
                let v = self.new_list_val()?;
                self.push(v)?;
            }
            op::LIST => {
                let m = self.pop_mark()?;
                let v = self.new_node(Node::List { start: 0, len: 0 })?;
                self.append_items(v, m)?;
                self.push(v)?;
            }
            op::EMPTY_DICT => {
                let v = self.new_dict_val()?;
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
            _ => unreachable!("container_op called with opcode 0x{op:02x}"),
        }
        Ok(())
    }

    pub(super) fn depth_of(&self, v: Val) -> u16 {
        v.node_id()
            .and_then(|i| self.depth.get(i as usize).copied())
            .unwrap_or(0)
    }

    /// Record that `parent` now contains `children`; refuse nesting beyond the limit.
    pub(super) fn nest(&mut self, parent: Val, children: &[Val]) -> R<()> {
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

    pub(super) fn pool_push(&mut self, items: &[Val]) -> R<u32> {
        let start = self.tree.pool.len();
        if start + items.len() > u32::MAX as usize {
            return Err(self.err(PickleErrorKind::Limit, "more than 2^32 container items"));
        }
        self.tree.pool.extend_from_slice(items);
        Ok(start as u32)
    }

    pub(super) fn append_items(&mut self, list: Val, items_from: usize) -> R<()> {
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

    pub(super) fn set_items(&mut self, dict: Val, items_from: usize) -> R<()> {
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
    pub(super) fn dict_insert(&mut self, dict: Val, k: Val, v: Val) {
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
    pub(super) fn shape_for(&mut self, keys: &[Val]) -> Option<u32> {
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

    pub(super) fn tuple_from(&mut self, from: usize) -> R<Val> {
        let items: Vec<Val> = self.stack.drain(from..).collect();
        self.tuple_of(&items)
    }

    pub(super) fn tuple_of(&mut self, items: &[Val]) -> R<Val> {
        let start = self.pool_push(items)?;
        let v = self.new_node(Node::Tuple {
            start,
            len: items.len() as u32,
        })?;
        self.nest(v, items)?;
        Ok(v)
    }

    pub(super) fn record_call(&mut self, callable: Val, args: Val, state: Val) -> R<Val> {
        let v = self.new_node(Node::Call(Box::new((callable, args, state))))?;
        self.nest(v, &[callable, args, state])?;
        Ok(v)
    }

    /// The object below the items that start at `mark` (the list/dict being extended).
    pub(super) fn top_below(&self, mark: usize) -> R<Val> {
        if mark == 0 {
            return Err(self.err(PickleErrorKind::Invalid, "no object below the MARK"));
        }
        if self.marks.last().is_some_and(|&m| m >= mark) {
            return Err(self.err(PickleErrorKind::Invalid, "no object below the MARK"));
        }
        Ok(self.stack[mark - 1])
    }
}

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
