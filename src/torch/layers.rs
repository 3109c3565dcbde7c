//! How many layers a model's forward repeated, from the call structure the trace recorded.
//!
//! Each layer runs the same Python lines, so at the peak every line inside a layer holds one
//! activation per layer: the blocks live at the peak, grouped by the innermost Python frame of
//! their allocation stack (framework lines included: `modeling_llama.py:87`, `linear.py:125`),
//! have a median count equal to the number of layers. Grouping by the first *user* frame instead
//! counts every block of a model whose layers live in a library at the one line that called it
//! (a notebook cell: 556 "layers" for a 22-layer model).

use rustc_hash::FxHashMap;

use crate::torch::Analysis;
use crate::torch::model::{Action, FrameId, Snapshot};
use crate::torch::stacks::Role;

/// The median number of activation blocks per innermost Python line among the blocks allocated
/// in `device`'s trace and live just before entry `index`; `None` without such blocks.
pub fn at(snap: &Snapshot, a: &Analysis, device: i64, index: u64) -> Option<u64> {
    let list = snap.trace(device);
    let end = (index as usize).min(list.len());
    let mut live: FxHashMap<u64, FrameId> = FxHashMap::default();
    for e in &list[..end] {
        match e.action {
            Action::Alloc => {
                if a.stacks.role(e.stack()) != Role::Activation {
                    live.remove(&e.addr);
                    continue;
                }
                let inner = e.stack().and_then(|s| {
                    snap.stacks.get(s as usize)?.iter().copied().find(|&f| {
                        snap.frames
                            .get(f as usize)
                            .is_some_and(|fr| fr.filename.ends_with(".py"))
                    })
                });
                match inner {
                    Some(f) => {
                        live.insert(e.addr, f);
                    }
                    None => {
                        live.remove(&e.addr);
                    }
                }
            }
            Action::FreeRequested | Action::FreeCompleted => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    // Frames with equal content are one line even when the loader kept two ids.
    let mut per_line: FxHashMap<(&str, u64), u64> = FxHashMap::default();
    for f in live.values() {
        if let Some(fr) = snap.frames.get(*f as usize) {
            *per_line.entry((fr.filename.as_str(), fr.line)).or_default() += 1;
        }
    }
    let mut counts: Vec<u64> = per_line.into_values().collect();
    if counts.is_empty() {
        return None;
    }
    counts.sort_unstable();
    Some(counts[(counts.len() - 1) / 2].max(1))
}
