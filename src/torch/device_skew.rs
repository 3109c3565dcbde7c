//! PT014: one process drives several GPUs (DataParallel) and one of them does far more work.
//!
//! `nn.DataParallel` (and torch_geometric's `DataParallel`) replicate the module on every device
//! of one process and split the input; the snapshot then holds one trace per device. The same
//! line allocating tensors of very different sizes on the devices means the split is uneven:
//! the device with the largest share runs out of memory first while the others have room.

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};
use crate::torch::Analysis;
use crate::torch::model::{Action, Snapshot, StackId};
use crate::torch::stacks::culprit;
use crate::torch::stacks::{SiteKey, site_string};

/// Largest allocation, allocation count and the largest one's stack, of a line on a device.
type PerDevice = (u64, u64, Option<StackId>);

/// The largest device must allocate at least this many times the median device's size…
const RATIO: u64 = 3;
/// …and at least this much in one allocation.
const MIN_BYTES: u64 = 256 << 20;

/// One device's allocations at the skewed line.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceShare {
    pub device: i64,
    /// Largest single allocation of the line on this device (measured, from the trace).
    pub largest_alloc_bytes: u64,
    pub allocs: u64,
}

/// The line whose largest allocation differs most across one process's devices.
#[derive(Clone, Debug, Serialize)]
pub struct Skew {
    pub site: String,
    /// Largest first.
    pub devices: Vec<DeviceShare>,
    /// Lower median of the devices' largest allocations.
    pub median_bytes: u64,
    /// The stacks pass through `nn/parallel` or a `data_parallel` module.
    pub data_parallel: bool,
    #[serde(skip)]
    pub key: SiteKey,
    #[serde(skip)]
    pub stack: Option<StackId>,
}

/// The skewed line, if one process's devices allocate very different sizes at one line.
pub fn skew(snap: &Snapshot, a: &Analysis) -> Option<Skew> {
    let traces = snap.device_traces.as_ref()?;
    if traces.iter().filter(|t| !t.is_empty()).count() < 2 {
        return None;
    }
    // site → device → (largest allocation, allocations, its stack)
    let mut by: FxHashMap<SiteKey, FxHashMap<i64, PerDevice>> = FxHashMap::default();
    for (d, list) in traces.iter().enumerate() {
        for e in list.iter().filter(|e| e.action == Action::Alloc) {
            let (key, _) = a.stacks.site(e.stack());
            if key.is_none() {
                continue;
            }
            let v = by
                .entry(key)
                .or_default()
                .entry(d as i64)
                .or_insert((0, 0, e.stack()));
            if e.size > v.0 {
                *v = (e.size, v.1, e.stack());
            }
            v.1 += 1;
        }
    }
    let mut best: Option<Skew> = None;
    for (key, devs) in &by {
        if devs.len() < 2 {
            continue;
        }
        let mut shares: Vec<DeviceShare> = devs
            .iter()
            .map(|(d, v)| DeviceShare {
                device: *d,
                largest_alloc_bytes: v.0,
                allocs: v.1,
            })
            .collect();
        shares.sort_by(|x, y| {
            y.largest_alloc_bytes
                .cmp(&x.largest_alloc_bytes)
                .then(x.device.cmp(&y.device))
        });
        let mut sizes: Vec<u64> = shares.iter().map(|s| s.largest_alloc_bytes).collect();
        sizes.sort_unstable();
        let median = sizes[(sizes.len() - 1) / 2];
        let max = shares[0].largest_alloc_bytes;
        if max < MIN_BYTES || max < median.saturating_mul(RATIO) {
            continue;
        }
        let better = best.as_ref().is_none_or(|b| {
            let bm = b.devices[0].largest_alloc_bytes;
            max > bm || max == bm && *key < b.key
        });
        if better {
            let stack = devs.get(&shares[0].device).and_then(|v| v.2);
            let data_parallel = snap.stack_frames(stack).any(|f| {
                let file = f.filename.replace('\\', "/");
                file.contains("nn/parallel/") || file.contains("data_parallel")
            });
            best = Some(Skew {
                site: site_string(snap, *key),
                devices: shares,
                median_bytes: median,
                data_parallel,
                key: *key,
                stack,
            });
        }
    }
    best
}

/// PT014 where [`skew`] finds a line.
pub fn detect(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    let Some(s) = skew(snap, a) else {
        return;
    };
    let top = &s.devices[0];
    let (loc, st) = culprit(snap, s.key, s.stack);
    let per_device = s
        .devices
        .iter()
        .map(|d| {
            format!(
                "{} on device {}",
                fmt_bytes(d.largest_alloc_bytes),
                d.device
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let who = if s.data_parallel {
        "DataParallel splits the work unevenly"
    } else {
        "One process's devices do uneven work"
    };
    let mut f = Finding::new(
        Code::PT014,
        Severity::Warning,
        format!(
            "{who}: one call at {} allocates {per_device} ({:.1}× the median device).",
            s.site,
            top.largest_alloc_bytes as f64 / s.median_bytes.max(1) as f64,
        ),
    )
    .at(loc, st)
    .bytes(top.largest_alloc_bytes, None, Label::Measured)
    .evidence(Evidence::measured(format!(
        "largest single allocation of this line per device (allocations in the trace): {}",
        s.devices
            .iter()
            .map(|d| format!(
                "device {}: {} ({})",
                d.device,
                fmt_bytes(d.largest_alloc_bytes),
                d.allocs
            ))
            .collect::<Vec<_>>()
            .join(" · ")
    )));
    if s.data_parallel {
        f = f.evidence(Evidence::measured(
            "the allocation stack passes through nn/parallel (parallel_apply / DataParallel): one \
             process replicates the module on every device",
        ));
    }
    if let Some(o) = a.totals.oom_events().find(|o| o.device == top.device) {
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
