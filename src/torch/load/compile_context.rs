//! `compile_context` of trace entries (torch 2.8+: `trace_entry.insert("compile_context",
//! te.compile_context_)`, `"N/A"` outside a `torch.compile` region). Collected beside the
//! streamed trace with one call per entry, kept only for entries with a context, and attached
//! to the model's [`CompileContexts`] once the tree says which streamed list is which device.

use rustc_hash::FxHashMap;

use crate::pickle::{Tree, Val};
use crate::torch::model::{CompileContexts, Snapshot};

const KEY: &str = "compile_context";
const NONE: &str = "N/A";
/// Distinct contexts kept; the rest are counted under [`MORE`].
const MAX_NAMES: usize = 4096;
const MORE: &str = "<other compile contexts>";
/// Characters of a context's name kept.
const MAX_LEN: usize = 256;

/// What the sink saw, by streamed list.
#[derive(Default)]
pub(super) struct Contexts {
    /// Key objects of the previous entry and the position of `compile_context` among them.
    last_keys: Vec<Val>,
    slot: Option<usize>,
    /// The last value object known to be `"N/A"` (torch memoizes it).
    last_none: Option<Val>,
    recorded: bool,
    /// Entries seen per list.
    counts: Vec<u64>,
    names: Vec<String>,
    by_name: FxHashMap<String, u32>,
    /// Per list: (entry number within the list, name).
    by_list: Vec<Vec<(u64, u32)>>,
}

impl Contexts {
    /// One streamed trace entry of list `list` (its key/value pairs).
    /// `same_keys`: its key objects are those of the entry before, in order (the sink checks
    /// that for itself on the same entries, so it is not checked twice).
    pub(super) fn note(&mut self, t: &Tree<'_>, list: u32, pairs: &[Val], same_keys: bool) {
        let l = list as usize;
        if self.counts.len() <= l {
            self.counts.resize(l + 1, 0);
        }
        let n = self.counts[l];
        self.counts[l] += 1;
        if let Some(id) = self.context_of(t, pairs, same_keys) {
            if self.by_list.len() <= l {
                self.by_list.resize_with(l + 1, Vec::new);
            }
            self.by_list[l].push((n, id));
        }
    }

    /// The entry's context (its name's number), if it has one other than `"N/A"`.
    fn context(&mut self, t: &Tree<'_>, pairs: &[Val]) -> Option<u32> {
        let same = same_keys(pairs, &self.last_keys);
        self.context_of(t, pairs, same)
    }

    /// [`Contexts::context`], whether the keys are the previous entry's already known.
    fn context_of(&mut self, t: &Tree<'_>, pairs: &[Val], same: bool) -> Option<u32> {
        if !same {
            self.last_keys = pairs.chunks_exact(2).map(|p| p[0]).collect();
            self.slot = pairs.chunks_exact(2).position(|p| t.str(p[0]) == Some(KEY));
        }
        let v = self.slot.and_then(|s| pairs.get(2 * s + 1)).copied()?;
        self.recorded = true;
        if Some(v) == self.last_none {
            return None;
        }
        let name = t.str(v)?;
        if name == NONE || name.is_empty() {
            self.last_none = Some(v);
            return None;
        }
        // Bounded whatever the file holds: long names cut, past MAX_NAMES distinct ones pooled.
        let name = match name.char_indices().nth(MAX_LEN) {
            Some((at, _)) => &name[..at],
            None => name,
        };
        let name = if self.names.len() >= MAX_NAMES && !self.by_name.contains_key(name) {
            MORE
        } else {
            name
        };
        Some(match self.by_name.get(name) {
            Some(&id) => id,
            None => {
                let id = self.names.len() as u32;
                self.names.push(name.to_string());
                self.by_name.insert(name.to_string(), id);
                id
            }
        })
    }

    /// Attach what was seen to `snap`, whose traces are built: streamed list → device from the
    /// tree's `device_traces`; entries dropped from the front (`--max-trace-events`) shift the
    /// numbers. Traces that were not streamed are read from the tree.
    pub(super) fn attach(mut self, t: &Tree<'_>, snap: &mut Snapshot) {
        let Some(traces) = snap.device_traces.as_ref() else {
            return;
        };
        let Some(list) = t
            .pairs(t.root)
            .find(|(k, _)| t.str(*k) == Some("device_traces"))
            .map(|(_, v)| v)
        else {
            return;
        };
        let mut out = CompileContexts::default();
        for (d, &dev) in t.items(list).iter().enumerate() {
            let kept = traces.get(d).map_or(0, Vec::len) as u64;
            let mut per = Vec::new();
            match t.streamed_ordinal(dev) {
                Some(o) => {
                    let seen = self.counts.get(o as usize).copied().unwrap_or(0);
                    let skip = seen.saturating_sub(kept);
                    for &(n, id) in self.by_list.get(o as usize).map_or(&[][..], Vec::as_slice) {
                        if n >= skip {
                            per.push(((n - skip) as u32, id));
                        }
                    }
                }
                None if t.is_seq(dev) => {
                    let items = t.items(dev);
                    let skip = (items.len() as u64).saturating_sub(kept) as usize;
                    for (i, &e) in items.iter().enumerate().skip(skip) {
                        if !t.is_dict(e) {
                            continue;
                        }
                        let pairs: Vec<Val> = t.pairs(e).flat_map(|(k, v)| [k, v]).collect();
                        if let Some(id) = self.context(t, &pairs) {
                            per.push(((i - skip) as u32, id));
                        }
                    }
                }
                None => {}
            }
            out.entries.push(per);
        }
        out.recorded = self.recorded;
        out.names = self.names;
        snap.compile_contexts = out;
    }
}

/// Whether an entry's key objects (`pairs`: key, value, …) are `keys`, in order.
#[inline]
pub(super) fn same_keys(pairs: &[Val], keys: &[Val]) -> bool {
    pairs.len() == 2 * keys.len() && pairs.chunks_exact(2).zip(keys).all(|(p, k)| p[0] == *k)
}
