//! The streaming side of the VM: dicts of streamed lists (trace entries) and lists and dicts
//! inside them (frames lists, frames) go to the [`Sink`] as they are decoded, not into the tree.

use super::{MAX_SUNK_DICTS, OpenEntry, PickleErrorKind, R, SunkDict, Vm, sink_error};
use crate::pickle::sink::Sink;
use crate::pickle::value::{Node, Tree, Val};

impl<'a> Vm<'a, '_> {
    /// Whether a dict created now (pushed at the stack top) is an item of a sunk list.
    pub(super) fn in_sunk_list(&self) -> bool {
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
    pub(super) fn sink_dict(&mut self, dict: Val, items_from: usize) -> R<Val> {
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

    /// Items appended to a list inside a streamed dict go to the sink, not into the tree.
    pub(super) fn append_sunk(&mut self, seq: u32, items_from: usize) -> R<()> {
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
    pub(super) fn give_stack(
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
    pub(super) fn in_streamed_dict(&self) -> bool {
        match self.marks.last() {
            Some(&m) if m >= 1 && m <= self.stack.len() => {
                self.stack[m - 1].stream_dict_ordinal().is_some()
            }
            _ => false,
        }
    }

    /// Which streamed list (by number) the dict at stack index `di` is an item of, if any.
    pub(super) fn streamed_parent(&self, di: usize) -> Option<u32> {
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
    pub(super) fn starts_streamed_list(&self) -> bool {
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

    pub(super) fn append_streamed(&mut self, list: Val, items_from: usize) -> R<()> {
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

    pub(super) fn emit(&mut self, ordinal: u32, pairs: &[Val]) -> R<()> {
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
    pub(super) fn emit_stack(&mut self, ordinal: u32, items_from: usize) -> R<()> {
        self.give_stack(items_from, |sink, t, items| sink.entry(t, ordinal, items))
    }

    /// The value `EMPTY_LIST` creates: a streamed list (an item of the list under the sink's
    /// key), a sunk list (a value of a streamed dict), or an arena list.
    pub(super) fn new_list_val(&mut self) -> R<Val> {
        use PickleErrorKind::*;
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
        Ok(v)
    }

    /// The value `EMPTY_DICT` creates: a streamed dict (a trace entry), a pending dict of a sunk
    /// list (a frame), or an arena dict.
    pub(super) fn new_dict_val(&mut self) -> R<Val> {
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
        Ok(v)
    }
}
