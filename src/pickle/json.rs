//! The JSON form of a snapshot, decoded into the graph the VM builds and streamed to the same
//! [`Sink`] the same way, without a JSON document tree in between.
//!
//! JSON has no memo: every frame of every stack is spelled out, so the JSON of a snapshot is
//! ~30× its pickle, and a document tree (`serde_json::Value`) of it ~10× the JSON. Here
//! `serde_json`'s deserializer drives visitors that know where they are: the dicts of the lists
//! under the sink's key go to [`Sink::entry`], the lists inside them to [`Sink::sequence`] and
//! the dicts inside those to [`Sink::sequence_dict`], exactly as the VM hands them over; the
//! rest becomes arena nodes. Strings without escapes are zero-copy references into the input.
//! Duplicate keys keep the last value in the place of the first, as Python's `json.load` does.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::sink::Sink;
use super::value::{Node, Tree, Val};
use super::vm::PROGRESS_STEP;

/// Why decoding stopped.
#[derive(Debug)]
pub enum JsonError {
    /// Not JSON, or not the JSON a snapshot has, or the sink refused something (with a message).
    Syntax(serde_json::Error),
    /// The sink's [`Sink::progress`] asked to stop.
    Cancelled,
}

/// Decode `data` (UTF-8 JSON), handing the parts `sink` selects to it as they are parsed.
pub fn decode_streaming<'a>(
    data: &'a [u8],
    sink: Option<&mut dyn Sink>,
) -> Result<Tree<'a>, JsonError> {
    let key = sink.as_ref().map(|s| s.key().as_bytes().to_vec());
    let sequences = sink.as_ref().is_some_and(|s| s.takes_sequences());
    let mut ctx = Ctx {
        tree: Tree {
            data,
            ..Tree::default()
        },
        sink,
        key,
        sequences,
        streamed: 0,
        at: 0,
        next_progress: PROGRESS_STEP,
        cancelled: false,
    };
    let mut de = serde_json::Deserializer::from_slice(data);
    let root = Value {
        ctx: &mut ctx,
        place: Place::Plain,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v));
    match root {
        Ok(root) => {
            ctx.tree.root = root;
            Ok(ctx.tree)
        }
        Err(_) if ctx.cancelled => Err(JsonError::Cancelled),
        Err(e) => Err(JsonError::Syntax(e)),
    }
}

struct Ctx<'a, 's> {
    tree: Tree<'a>,
    sink: Option<&'s mut dyn Sink>,
    /// The sink's key: the lists in the list under it are streamed.
    key: Option<Vec<u8>>,
    /// The sink takes the lists inside streamed dicts.
    sequences: bool,
    /// Streamed lists so far (the next one's number).
    streamed: u32,
    /// Furthest input offset seen (of a string), for progress.
    at: usize,
    next_progress: usize,
    cancelled: bool,
}

impl Ctx<'_, '_> {
    /// A string value: a reference into the input when it was borrowed from it.
    fn string(&mut self, s: &str, borrowed: bool) -> Val {
        if borrowed {
            let off = (s.as_ptr() as usize).wrapping_sub(self.tree.data.as_ptr() as usize);
            if off
                .checked_add(s.len())
                .is_some_and(|end| end <= self.tree.data.len())
            {
                self.at = self.at.max(off);
                if let Some(v) = Val::inline_str(off, s.len()) {
                    return v;
                }
            }
        }
        self.tree.new_str(s)
    }

    fn node<E: de::Error>(&mut self, n: Node) -> Result<Val, E> {
        self.tree.push_node(n).map_err(E::custom)
    }

    /// Tell the sink how far decoding got, every few MiB; it may cancel.
    fn progress<E: de::Error>(&mut self) -> Result<(), E> {
        if self.at < self.next_progress {
            return Ok(());
        }
        self.next_progress = self.at + PROGRESS_STEP;
        if let Some(sink) = self.sink.as_deref_mut()
            && !sink.progress(self.at)
        {
            self.cancelled = true;
            return Err(E::custom("cancelled"));
        }
        Ok(())
    }

    fn is_key(&self, k: Val) -> bool {
        self.key
            .as_deref()
            .is_some_and(|key| self.tree.str(k).is_some_and(|s| s.as_bytes() == key))
    }
}

/// Where a value sits, which decides what becomes of a list or a dict there (as in the VM).
#[derive(Clone, Copy, PartialEq)]
enum Place {
    /// Anywhere else: an arena node.
    Plain,
    /// The value of the sink's key: its lists are streamed lists.
    KeyValue,
    /// An item of the list under the sink's key: a list here is streamed.
    KeyItem,
    /// An item of streamed list number `n`: a dict, handed to [`Sink::entry`].
    Entry(u32),
    /// A value of a streamed dict: a list here goes to [`Sink::sequence`].
    EntryValue,
    /// An item of such a list: a dict goes to [`Sink::sequence_dict`].
    SunkItem,
}

struct Value<'c, 'a, 's> {
    ctx: &'c mut Ctx<'a, 's>,
    place: Place,
}

impl<'de> DeserializeSeed<'de> for Value<'_, '_, '_> {
    type Value = Val;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Val, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Value<'_, '_, '_> {
    type Value = Val;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Val, E> {
        self.not_an_entry("a bool")?;
        Ok(if b { Val::TRUE } else { Val::FALSE })
    }

    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Val, E> {
        self.not_an_entry("an int")?;
        Ok(self.ctx.tree.new_int(i as i128))
    }

    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Val, E> {
        self.not_an_entry("an int")?;
        Ok(self.ctx.tree.new_int(u as i128))
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Val, E> {
        self.not_an_entry("a float")?;
        self.ctx.node(Node::Float(f))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Val, E> {
        self.not_an_entry("None")?;
        Ok(Val::NONE)
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Val, E> {
        self.not_an_entry("a str")?;
        Ok(self.ctx.string(s, true))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Val, E> {
        self.not_an_entry("a str")?;
        Ok(self.ctx.string(s, false))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Val, A::Error> {
        self.not_an_entry("a list")?;
        let ctx = self.ctx;
        match self.place {
            Place::KeyItem => {
                // A streamed list: its dicts go to the sink, the node keeps their count.
                let ordinal = ctx.streamed;
                ctx.streamed = ctx.streamed.saturating_add(1);
                let mut count = 0u32;
                while seq
                    .next_element_seed(Value {
                        ctx: &mut *ctx,
                        place: Place::Entry(ordinal),
                    })?
                    .is_some()
                {
                    count = count.saturating_add(1);
                    ctx.progress()?;
                }
                ctx.node(Node::StreamedList { count, ordinal })
            }
            Place::EntryValue if ctx.sequences => {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element_seed(Value {
                    ctx: &mut *ctx,
                    place: Place::SunkItem,
                })? {
                    items.push(v);
                }
                let Some(sink) = ctx.sink.as_deref_mut() else {
                    return Ok(Val::NONE);
                };
                let n = sink.new_sequence().map_err(de::Error::custom)?;
                if n == u32::MAX {
                    return Err(de::Error::custom("more than 2^32 - 1 sunk lists"));
                }
                if !items.is_empty() {
                    sink.sequence(&ctx.tree, n, &items)
                        .map_err(de::Error::custom)?;
                }
                Ok(Val::sunk_list(n))
            }
            place => {
                let item = if place == Place::KeyValue {
                    Place::KeyItem
                } else {
                    Place::Plain
                };
                let mut items = Vec::new();
                while let Some(v) = seq.next_element_seed(Value {
                    ctx: &mut *ctx,
                    place: item,
                })? {
                    items.push(v);
                }
                Ok(ctx.tree.new_list(items))
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Val, A::Error> {
        let ctx = self.ctx;
        match self.place {
            Place::Entry(_) | Place::SunkItem => {
                // Handed over as `[key, value, …]`; with a repeated key the sink keeps the last.
                let values = if let Place::Entry(_) = self.place {
                    Place::EntryValue
                } else {
                    Place::Plain
                };
                let first_node = ctx.tree.nodes.len();
                let mut pairs = Vec::new();
                while let Some(k) = map.next_key_seed(Value {
                    ctx: &mut *ctx,
                    place: Place::Plain,
                })? {
                    let v = map.next_value_seed(Value {
                        ctx: &mut *ctx,
                        place: values,
                    })?;
                    pairs.extend([k, v]);
                }
                let Some(sink) = ctx.sink.as_deref_mut() else {
                    return Ok(Val::NONE);
                };
                match self.place {
                    Place::Entry(ordinal) => {
                        sink.entry(&ctx.tree, ordinal, &pairs)
                            .map_err(de::Error::custom)?;
                        // JSON has no memo: nothing refers to the entry's nodes (escaped
                        // strings, nested values) any more. Their content goes; their ids stay
                        // taken, so a sink that remembers values by id never meets them again.
                        for n in &mut ctx.tree.nodes[first_node..] {
                            *n = Node::Consumed;
                        }
                        Ok(Val::CONSUMED)
                    }
                    _ => {
                        let id = sink
                            .sequence_dict(&ctx.tree, None, &pairs)
                            .map_err(de::Error::custom)?;
                        Ok(Val::sunk_dict(id))
                    }
                }
            }
            _ => {
                let mut pairs: Vec<(Val, Val)> = Vec::new();
                let mut index: Option<rustc_hash::FxHashMap<Box<str>, usize>> = None;
                while let Some(k) = map.next_key_seed(Value {
                    ctx: &mut *ctx,
                    place: Place::Plain,
                })? {
                    let place = if ctx.is_key(k) {
                        Place::KeyValue
                    } else {
                        Place::Plain
                    };
                    let v = map.next_value_seed(Value {
                        ctx: &mut *ctx,
                        place,
                    })?;
                    let name = ctx.tree.str(k).unwrap_or_default();
                    // A repeated key replaces the value where the key first stood.
                    let at = match &index {
                        Some(ix) => ix.get(name).copied(),
                        None => pairs
                            .iter()
                            .position(|(old, _)| ctx.tree.str(*old) == Some(name)),
                    };
                    match at {
                        Some(i) => pairs[i].1 = v,
                        None => {
                            if let Some(ix) = index.as_mut() {
                                ix.insert(name.into(), pairs.len());
                            }
                            pairs.push((k, v));
                            if index.is_none() && pairs.len() >= 32 {
                                let t = &ctx.tree;
                                index = Some(
                                    pairs
                                        .iter()
                                        .enumerate()
                                        .map(|(i, (k, _))| {
                                            (t.str(*k).unwrap_or_default().into(), i)
                                        })
                                        .collect(),
                                );
                            }
                        }
                    }
                }
                Ok(ctx.tree.new_dict(pairs))
            }
        }
    }
}

impl Value<'_, '_, '_> {
    /// An item of a streamed list must be a dict (the VM says the same).
    fn not_an_entry<E: de::Error>(&self, what: &str) -> Result<(), E> {
        match (self.place, &self.ctx.key) {
            (Place::Entry(_), Some(key)) => Err(E::custom(format!(
                "an item of `{}` is {what}, expected a dict",
                String::from_utf8_lossy(key)
            ))),
            _ => Ok(()),
        }
    }
}
