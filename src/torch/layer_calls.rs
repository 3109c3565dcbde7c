//! The layers of one forward pass, from its repeated call structure.
//!
//! A model's layers run the same function (`Block.forward`, `update_nodes`) once per layer, and
//! each call allocates the same sequence of tensors from the same lines. Among the activation
//! allocations of the forward that holds the peak (from the first allocation still live at the
//! peak up to the peak), every Python function on their stacks is a candidate, keyed by the
//! function and the line that called it (the `torch.nn` module wrappers skipped, so a
//! `for block in self.blocks: x = block(x)` loop is one candidate). A candidate's allocations,
//! in trace order, each carry the part of their stack from the function inwards (file and
//! line of every frame): its calls are the period of that sequence. The layer function is the
//! repeated candidate (≥ 2 calls) covering the most bytes live at the peak; ties go to the
//! outermost (fewest calls). A count of blocks per line (the old rule) counts a notebook cell
//! that calls a library model 556 times for a 22-layer model; a call count does not.

use std::hash::{Hash, Hasher};

use rustc_hash::{FxHashMap, FxHasher};

use crate::torch::Analysis;
use crate::torch::model::{Action, Snapshot};
use crate::torch::stacks::Role;

/// One call of the layer function: trace entries `first..end` hold its allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// The entry of its first allocation.
    pub first: usize,
    /// One past the entry of its last allocation.
    pub end: usize,
}

/// The repeated layer function of a forward and its calls, in trace order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layers {
    pub device: i64,
    /// `file.py:function`, as recorded.
    pub function: String,
    /// The line that calls it (`models.py:231`).
    pub caller: Option<String>,
    pub calls: Vec<Call>,
    /// Bytes live at the peak allocated inside the calls.
    pub bytes_at_peak: u64,
    /// The activation allocations live at the peak (entry indices).
    pub live: Vec<usize>,
    /// What finds the same calls in the other steps of the trace ([`every_call`]).
    key: Key,
    first_token: u64,
    period: usize,
}

/// A tensor-producing frame key: the function and the line calling it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key(u64);

fn hash_of(v: impl Hash) -> u64 {
    let mut h = FxHasher::default();
    v.hash(&mut h);
    h.finish()
}

/// Frames that only forward a call (`Module._call_impl`): not a function of the model.
/// Frames that only forward a call (`Module._call_impl`, accelerate's `new_forward` hook,
/// a thread's `run`): not a function of the model. Windows paths too.
fn wrapper(filename: &str) -> bool {
    let f = filename.replace('\\', "/");
    f.ends_with("torch/nn/modules/module.py")
        || f.ends_with("accelerate/hooks.py")
        || f.ends_with("threading.py")
}

/// Per stack: (candidate key, token, Python frames inside it) for every Python function on it,
/// innermost first.
fn candidates(snap: &Snapshot, stack: u32) -> Vec<(Key, u64, usize)> {
    let Some(frames) = snap.stacks.get(stack as usize) else {
        return Vec::new();
    };
    let py: Vec<&crate::torch::model::Frame> = frames
        .iter()
        .filter_map(|&f| snap.frames.get(f as usize))
        .filter(|f| f.filename.ends_with(".py"))
        .collect();
    let mut out = Vec::new();
    let mut token = FxHasher::default();
    for (i, f) in py.iter().enumerate() {
        (f.filename.as_str(), f.line).hash(&mut token);
        if wrapper(&f.filename) {
            continue;
        }
        let caller = py[i + 1..].iter().find(|c| !wrapper(&c.filename));
        let key = hash_of((
            f.filename.as_str(),
            f.name.as_str(),
            caller.map(|c| (c.filename.as_str(), c.line)),
        ));
        out.push((Key(key), token.finish(), i));
    }
    out
}

/// The smallest period of `tokens` with at least 90 % of its comparisons equal (the first call
/// may differ a little: caches filled once); the whole length when none repeats.
fn period(tokens: &[u64]) -> usize {
    let n = tokens.len();
    for p in 1..=n / 2 {
        if tokens[p] != tokens[0] {
            continue;
        }
        // Stop at the first mismatch past the 10 % allowed.
        let allowed = (n - p) / 10;
        let mut differ = 0;
        let fits = (0..n - p).all(|i| {
            differ += usize::from(tokens[i] != tokens[i + p]);
            differ <= allowed
        });
        if fits {
            return p;
        }
    }
    n.max(1)
}

/// How many calls of period `p` the sequence holds: starts where the first token comes back at
/// least `p` after the previous start.
fn count_calls(tokens: &[u64], p: usize) -> usize {
    let mut last = 0;
    let mut n = usize::from(!tokens.is_empty());
    for (j, t) in tokens.iter().enumerate().skip(1) {
        if *t == tokens[0] && j - last >= p {
            last = j;
            n += 1;
        }
    }
    n
}

/// The layer calls of the forward holding `device`'s set live just before entry `index`.
pub fn at(snap: &Snapshot, a: &Analysis, device: i64, index: u64) -> Option<Layers> {
    let list = snap.trace(device);
    let end = (index as usize).min(list.len());
    // The activation allocations live at the peak.
    let mut open: FxHashMap<u64, usize> = FxHashMap::default();
    for (i, e) in list[..end].iter().enumerate() {
        match e.action {
            Action::Alloc => {
                if a.stacks.role(e.stack()) == Role::Activation {
                    open.insert(e.addr, i);
                } else {
                    open.remove(&e.addr);
                }
            }
            Action::FreeRequested | Action::FreeCompleted => {
                open.remove(&e.addr);
            }
            _ => {}
        }
    }
    let mut live: Vec<usize> = open.into_values().collect();
    live.sort_unstable();
    // This step's forward: after the previous optimizer step or zero_grad when the release
    // stacks show one (a tensor kept from an earlier step is not part of its layers).
    let step = a
        .releases
        .native_frames
        .then(|| crate::torch::release::step_start_before(snap, &a.releases, device, index))
        .flatten()
        .map(|(s, _)| s as usize);
    live.retain(|&i| step.is_none_or(|s| i >= s));
    let start = *live.first()?;
    let is_live: rustc_hash::FxHashSet<usize> = live.iter().copied().collect();
    // Every candidate's allocations in order: (entry, token, bytes if live at the peak).
    let mut memo: FxHashMap<u32, Vec<(Key, u64, usize)>> = FxHashMap::default();
    let mut seqs: FxHashMap<Key, Vec<(usize, u64, usize)>> = FxHashMap::default();
    let mut covered: FxHashMap<Key, u64> = FxHashMap::default();
    for (i, e) in list.iter().enumerate().take(end).skip(start) {
        if e.action != Action::Alloc || a.stacks.role(e.stack()) != Role::Activation {
            continue;
        }
        let Some(s) = e.stack() else { continue };
        let c = memo.entry(s).or_insert_with(|| candidates(snap, s));
        for &(k, tok, depth) in c.iter() {
            seqs.entry(k).or_default().push((i, tok, depth));
            if is_live.contains(&i) {
                *covered.entry(k).or_default() += e.size;
            }
        }
    }
    let live_bytes: u64 = live.iter().map(|&i| list[i].size).sum();
    // (bytes, calls, frames inside, key, period): most bytes, then fewest calls, then the
    // innermost of equal ones (`Block.forward` rather than the hook that forwards to it).
    let mut best: Option<(u64, usize, usize, Key, usize)> = None;
    for (k, seq) in &seqs {
        let bytes = covered.get(k).copied().unwrap_or(0);
        if bytes.saturating_mul(2) < live_bytes {
            continue;
        }
        let tokens: Vec<u64> = seq.iter().map(|x| x.1).collect();
        let p = period(&tokens);
        let calls = count_calls(&tokens, p);
        if calls < 2 {
            continue;
        }
        let depth = seq[0].2;
        let better = match best {
            None => true,
            Some((b, c, d, _, _)) => {
                (bytes, std::cmp::Reverse(calls), std::cmp::Reverse(depth))
                    > (b, std::cmp::Reverse(c), std::cmp::Reverse(d))
            }
        };
        if better {
            best = Some((bytes, calls, depth, *k, p));
        }
    }
    let (bytes, _, _, key, p) = best?;
    let seq = &seqs[&key];
    // A call starts where the first token comes back at least a period after the last start.
    let mut starts = vec![0];
    for (j, x) in seq.iter().enumerate().skip(1) {
        if x.1 == seq[0].1 && j - starts[starts.len() - 1] >= p {
            starts.push(j);
        }
    }
    let calls = starts
        .iter()
        .enumerate()
        .map(|(n, &s)| {
            let last = starts.get(n + 1).map_or(seq.len(), |&e| e) - 1;
            Call {
                first: seq[s].0,
                end: seq[last].0 + 1,
            }
        })
        .collect();
    // Name the function from one of its allocations' stacks.
    let (function, caller) = describe(snap, list[seq[0].0].stack(), key);
    Some(Layers {
        device,
        function,
        caller,
        calls,
        bytes_at_peak: bytes,
        live,
        key,
        first_token: seq[0].1,
        period: p,
    })
}

/// Every call of the layer function in the whole trace (each step's forward), in order.
pub fn every_call(snap: &Snapshot, a: &Analysis, device: i64, layers: &Layers) -> Vec<Call> {
    let list = snap.trace(device);
    let mut memo: FxHashMap<u32, Option<u64>> = FxHashMap::default();
    let mut calls: Vec<Call> = Vec::new();
    let mut since = 0usize;
    for (i, e) in list.iter().enumerate() {
        if e.action != Action::Alloc || a.stacks.role(e.stack()) != Role::Activation {
            continue;
        }
        let Some(s) = e.stack() else { continue };
        let tok = *memo.entry(s).or_insert_with(|| {
            candidates(snap, s)
                .into_iter()
                .find(|c| c.0 == layers.key)
                .map(|c| c.1)
        });
        let Some(tok) = tok else { continue };
        match calls.last_mut() {
            Some(c) if !(tok == layers.first_token && since >= layers.period) => {
                c.end = i + 1;
                since += 1;
            }
            _ if tok == layers.first_token => {
                calls.push(Call {
                    first: i,
                    end: i + 1,
                });
                since = 1;
            }
            _ => {}
        }
    }
    calls
}

fn describe(snap: &Snapshot, stack: Option<u32>, key: Key) -> (String, Option<String>) {
    let Some(frames) = stack.and_then(|s| snap.stacks.get(s as usize)) else {
        return (String::new(), None);
    };
    let py: Vec<&crate::torch::model::Frame> = frames
        .iter()
        .filter_map(|&f| snap.frames.get(f as usize))
        .filter(|f| f.filename.ends_with(".py"))
        .collect();
    for (i, f) in py.iter().enumerate() {
        if wrapper(&f.filename) {
            continue;
        }
        let caller = py[i + 1..].iter().find(|c| !wrapper(&c.filename));
        let k = hash_of((
            f.filename.as_str(),
            f.name.as_str(),
            caller.map(|c| (c.filename.as_str(), c.line)),
        ));
        if k == key.0 {
            let base = |p: &str| p.rsplit(['/', '\\']).next().unwrap_or(p).to_string();
            return (
                format!("{}:{}", base(&f.filename), f.name),
                caller.map(|c| format!("{}:{}", base(&c.filename), c.line)),
            );
        }
    }
    (String::new(), None)
}

#[cfg(test)]
mod tests {
    use super::period;

    #[test]
    fn a_repeated_sequence_has_its_call_length_as_period() {
        let one = [1, 2, 3, 2, 4];
        let mut six: Vec<u64> = one.iter().cycle().take(5 * 5).copied().collect();
        six.extend([1, 2, 3]); // the sixth call, cut short by an OOM
        assert_eq!(period(&six), 5);
        assert_eq!(super::count_calls(&six, period(&six)), 6);
        assert_eq!(period(&[1, 2, 3, 4]), 4, "no repetition: one call");
    }
}
