//! PT014: one process drives several GPUs (DataParallel) and one of them does far more work.
//!
//! `nn.DataParallel` (and torch_geometric's `DataParallel`) replicate the module on every device
//! of one process and split the input; the snapshot then holds one trace per device. The same
//! line allocating tensors of very different sizes on the devices means the split is uneven:
//! the device with the largest share runs out of memory first while the others have room.

use rustc_hash::FxHashMap;

use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};
use crate::torch::Analysis;
use crate::torch::model::{Action, Snapshot, StackId};
use crate::torch::patterns::culprit;
use crate::torch::stacks::{SiteKey, site_string};

/// The largest device must allocate at least this many times the median device's size…
const RATIO: u64 = 3;
/// …and at least this much in one allocation.
const MIN_BYTES: u64 = 256 << 20;

/// PT014: the site whose largest single allocation differs most across the devices.
pub fn detect(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    let Some(traces) = &snap.device_traces else {
        return;
    };
    if traces.iter().filter(|t| !t.is_empty()).count() < 2 {
        return;
    }
    // site → device → (largest allocation, allocations, a stack)
    let mut by: FxHashMap<SiteKey, FxHashMap<i64, (u64, u64, Option<StackId>)>> =
        FxHashMap::default();
    let mut parallel = false;
    for (d, list) in traces.iter().enumerate() {
        for e in list.iter().filter(|e| e.action == Action::Alloc) {
            let (key, _) = a.stacks.site(e.stack());
            if key.is_none() {
                continue;
            }
            let v = by.entry(key).or_default().entry(d as i64).or_insert((0, 0, e.stack()));
            if e.size > v.0 {
                *v = (e.size, v.1, e.stack());
            }
            v.1 += 1;
        }
    }
    let mut best: Option<(SiteKey, Vec<(i64, u64, u64)>, u64, Option<StackId>)> = None;
    for (key, devs) in &by {
        if devs.len() < 2 {
            continue;
        }
        let mut sizes: Vec<(i64, u64, u64)> = devs.iter().map(|(d, v)| (*d, v.0, v.1)).collect();
        sizes.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
        let mut only: Vec<u64> = sizes.iter().map(|s| s.1).collect();
        only.sort_unstable();
        let median = only[(only.len() - 1) / 2];
        let max = sizes[0].1;
        if max < MIN_BYTES || max < median.saturating_mul(RATIO) {
            continue;
        }
        if best.as_ref().is_none_or(|b| (max, std::cmp::Reverse(*key)) > (b.2, std::cmp::Reverse(b.0))) {
            let stack = devs.get(&sizes[0].0).and_then(|v| v.2);
            best = Some((*key, sizes, max, stack));
        }
    }
    let Some((key, sizes, max, stack)) = best else {
        return;
    };
    parallel |= snap.stack_frames(stack).any(|f| {
        let file = f.filename.replace('\\', "/");
        file.contains("nn/parallel/") || file.contains("data_parallel")
    });
    let mut only: Vec<u64> = sizes.iter().map(|s| s.1).collect();
    only.sort_unstable();
    let median = only[(only.len() - 1) / 2].max(1);
    let (loc, st) = culprit(snap, key, stack);
    let per_device = sizes
        .iter()
        .map(|(d, s, _)| format!("{} on device {d}", fmt_bytes(*s)))
        .collect::<Vec<_>>()
        .join(", ");
    let who = if parallel {
        "DataParallel splits the work unevenly"
    } else {
        "One process's devices do uneven work"
    };
    let mut f = Finding::new(
        Code::PT014,
        Severity::Warning,
        format!(
            "{who}: one call at {} allocates {per_device} ({:.1}× the median device).",
            site_string(snap, key),
            max as f64 / median as f64,
        ),
    )
    .at(loc, st)
    .bytes(max, None, Label::Measured)
    .evidence(Evidence::measured(format!(
        "largest single allocation of this line per device (allocations in the trace): {}",
        sizes
            .iter()
            .map(|(d, s, n)| format!("device {d}: {} ({n})", fmt_bytes(*s)))
            .collect::<Vec<_>>()
            .join(" · ")
    )));
    if parallel {
        f = f.evidence(Evidence::measured(
            "the allocation stack passes through nn/parallel (parallel_apply / DataParallel): one \
             process replicates the module on every device",
        ));
    }
    if let Some(o) = a.totals.oom_events().find(|o| o.device == sizes[0].0) {
        f = f.evidence(Evidence::measured(format!(
            "device {} — the one with the largest share — ran out of memory (entry #{})",
            o.device, o.index
        )));
    }
    f = f
        .evidence(Evidence::inferred(
            "the input split gives one device far more work (e.g. graph batches with uneven node \
             or edge counts): that device bounds the batch size for all",
        ))
        .fix(Fix::advice(
            "Balance the split: bucket or sort samples by size so each device gets a similar \
             amount of work, or use DistributedDataParallel (one process per GPU) with a \
             size-aware sampler; lowering the batch only helps the overloaded device",
        ));
    out.push(f);
}
