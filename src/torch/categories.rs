//! Live memory at each device's peak broken down by category: by role (parameter, optimizer
//! state, activation, gradient / backward buffer, communication buffer, unknown — inferred from
//! the stacks, `stacks::Role`) and by the user's `--category NAME=REGEX` (a regex over each
//! frame's `filename:function`; the first category that matches a frame of a block's stack takes
//! the block). Bytes are measured: the live blocks at the trace's peak (reconstructed backwards
//! from the snapshot, `timeline::live_at`), or the snapshot's live blocks when there is no trace.

use serde::Serialize;

use crate::options::Category;
use crate::torch::model::{BlockState, Snapshot, StackId};
use crate::torch::stacks::{Role, StackIndex};
use crate::torch::timeline::Timeline;

/// One device's breakdown (`captures[].torch.categories[]`).
#[derive(Clone, Debug, Serialize)]
pub struct DeviceCategories {
    pub device: i64,
    /// `peak` (the trace's live peak) or `snapshot` (no trace: the state at the dump).
    pub at: &'static str,
    /// Trace entry after which the peak is reached (`peak` only).
    pub index: Option<u64>,
    pub total_bytes: u64,
    pub total_blocks: u64,
    /// By role, bytes descending; the role is inferred from the stack, the bytes measured.
    pub by_role: Vec<Part>,
    /// The user's categories in the order given, then `uncategorized` (empty without any).
    pub custom: Vec<Part>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Part {
    pub name: String,
    /// The regex (custom categories only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub bytes: u64,
    pub blocks: u64,
    pub percent: f64,
}

fn part(name: &str, pattern: Option<&str>, (bytes, blocks): (u64, u64), total: u64) -> Part {
    Part {
        name: name.to_string(),
        pattern: pattern.map(str::to_string),
        bytes,
        blocks,
        percent: if total == 0 {
            0.0
        } else {
            (bytes as f64 * 1000.0 / total as f64).round() / 10.0
        },
    }
}

/// Live bytes and blocks of one stack.
type Live = (Option<StackId>, u64, u64);

/// The breakdown of every device with live memory or a trace.
pub fn compute(
    snap: &Snapshot,
    stacks: &StackIndex,
    timeline: &Timeline,
    categories: &[Category],
) -> Vec<DeviceCategories> {
    let mut out = Vec::new();
    for device in snap.devices() {
        let (at, index, live): (&'static str, Option<u64>, Vec<Live>) =
            match timeline.device(device).and_then(|t| t.peak_set.as_ref()) {
                Some(set) => (
                    "peak",
                    Some(set.index.saturating_sub(1)),
                    set.by_stack.clone(),
                ),
                None => ("snapshot", None, snapshot_live(snap, device)),
            };
        if live.is_empty() {
            continue;
        }
        out.push(breakdown(
            snap, stacks, device, at, index, &live, categories,
        ));
    }
    out
}

/// The snapshot's live blocks of a device by stack.
fn snapshot_live(snap: &Snapshot, device: i64) -> Vec<(Option<StackId>, u64, u64)> {
    let mut by: rustc_hash::FxHashMap<Option<StackId>, (u64, u64)> = Default::default();
    for seg in snap.segments.iter().filter(|s| s.device == device) {
        for b in &seg.blocks {
            if matches!(
                b.state,
                BlockState::ActiveAllocated | BlockState::ActivePendingFree
            ) {
                let e = by.entry(b.stack).or_default();
                e.0 = e.0.saturating_add(b.size);
                e.1 += 1;
            }
        }
    }
    let mut v: Vec<_> = by.into_iter().map(|(k, (a, b))| (k, a, b)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

fn breakdown(
    snap: &Snapshot,
    stacks: &StackIndex,
    device: i64,
    at: &'static str,
    index: Option<u64>,
    live: &[(Option<StackId>, u64, u64)],
    categories: &[Category],
) -> DeviceCategories {
    let mut roles = [(0u64, 0u64); Role::ALL.len()];
    let mut custom = vec![(0u64, 0u64); categories.len() + 1];
    let (mut total, mut blocks) = (0u64, 0u64);
    for &(stack, bytes, n) in live {
        total = total.saturating_add(bytes);
        blocks += n;
        let r = stacks.role(stack).slot();
        roles[r].0 = roles[r].0.saturating_add(bytes);
        roles[r].1 += n;
        if categories.is_empty() {
            continue;
        }
        let c = snap
            .stack_frames(stack)
            .find_map(|f| {
                categories
                    .iter()
                    .position(|c| c.matches(&f.filename, &f.name))
            })
            .unwrap_or(categories.len());
        custom[c].0 = custom[c].0.saturating_add(bytes);
        custom[c].1 += n;
    }
    let mut by_role: Vec<Part> = Role::ALL
        .iter()
        .zip(roles)
        .filter(|(_, v)| v.1 > 0)
        .map(|(r, v)| part(r.as_str(), None, v, total))
        .collect();
    by_role.sort_by_key(|p| std::cmp::Reverse(p.bytes));
    let custom = if categories.is_empty() {
        Vec::new()
    } else {
        categories
            .iter()
            .map(|c| (c.name.as_str(), Some(c.regex.as_str())))
            .chain(std::iter::once(("uncategorized", None)))
            .zip(custom)
            .map(|((name, pat), v)| part(name, pat, v, total))
            .collect()
    };
    DeviceCategories {
        device,
        at,
        index,
        total_bytes: total,
        total_blocks: blocks,
        by_role,
        custom,
    }
}
