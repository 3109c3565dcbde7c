//! PT013: the allocator's OOM-retry path fired — a near out-of-memory.
//!
//! When `cudaMalloc` fails, PyTorch's `DeviceCachingAllocator::malloc` releases cached segments
//! (`release_cached_blocks`) and tries again. Those `segment_free` entries carry `malloc` on their
//! own stack (`torch::release`, cause `OomRetry`); an explicit `empty_cache()` does not. A retry
//! that succeeded is an OOM that did not happen this time: the device was full, the cache held
//! memory in pieces that could not serve the request, and every retry pays a synchronizing
//! `cudaFree`.

use crate::findings::{Code, Evidence, Finding, Fix, Label, Severity, fmt_bytes};
use crate::torch::Analysis;
use crate::torch::model::Snapshot;
use crate::torch::release::OomRetry;
use crate::torch::stacks::culprit;
use crate::torch::stacks::site_string;

/// The fix's first advice.
const LOWER_LIVE: &str = "Lower what is live when this line runs (a smaller batch or chunk, \
                              free large tensors before it)";
/// Its second, unless a replay shows the setting does not avoid the OOM path.
const EXPANDABLE: &str = "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` lets the cache grow \
                          and be reused across sizes instead of being released and re-made (each \
                          retry's cudaFree synchronizes the device)";

/// The fix's advice where a replay of `expandable_segments:True` takes the OOM path as often or
/// more: the first advice alone, saying why the setting is not offered.
pub fn advice_without_the_setting() -> String {
    format!(
        "{LOWER_LIVE}; `expandable_segments:True` does not avoid the OOM path here (replayed: see \
         the evidence)"
    )
}

/// PT013 for each device whose trace shows the OOM-retry path and no OOM event.
pub fn detect(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    for d in &a.releases.devices {
        if a.totals.oom_events().any(|o| o.device == d.device) {
            continue;
        }
        out.extend(retry_finding(snap, a, d.device, &d.oom_retries, None));
    }
}

/// PT013 from the allocator replay, on a device whose releases carry no stack: the validation
/// replay ran these mallocs through the OOM path (no cached block could serve them), and the
/// device's grants and refusals fit one capacity, `low` to `high` (see
/// `DeviceReplay::capacity_read`).
pub fn from_replay(
    snap: &Snapshot,
    a: &Analysis,
    device: i64,
    retries: &[OomRetry],
    (low, high): (u64, u64),
) -> Option<Finding> {
    retry_finding(snap, a, device, retries, Some((low, high)))
}

/// The finding of one device's retries; `replayed`: read from the replay (with the capacity
/// range), not from the releases' own stacks.
fn retry_finding(
    snap: &Snapshot,
    a: &Analysis,
    device: i64,
    retries: &[OomRetry],
    replayed: Option<(u64, u64)>,
) -> Option<Finding> {
    let segments: u64 = retries.iter().map(|r| r.segments).sum();
    let bytes: u64 = retries.iter().map(|r| r.bytes).sum();
    let big = retries
        .iter()
        .max_by_key(|r| (r.bytes, std::cmp::Reverse(r.index)))?;
    let request = big.request.map(|(index, size, stack)| {
        let (key, _) = a.stacks.site(stack);
        (index, size, key, stack)
    });
    let (key, stack) = request.map_or((None, None), |(_, _, k, s)| (k, s));
    let (loc, st) = culprit(snap, key, stack);
    let what = match request {
        Some((_, size, k, _)) => format!(
            "to serve a request of {} at {}",
            fmt_bytes(size),
            site_string(snap, k)
        ),
        None => "to serve a request the trace does not show".to_string(),
    };
    // Episodes the replay read are its reasoning about which recorded releases were retries.
    let label = if replayed.is_some() {
        Label::Inferred
    } else {
        Label::Measured
    };
    let mut f = Finding::new(
        Code::PT013,
        Severity::Warning,
        format!(
            "Near out of memory on device {}: cudaMalloc failed and the allocator released {} \
                 of cached segments {what}, then succeeded.",
            device,
            fmt_bytes(big.bytes),
        ),
    )
    .at(loc, st)
    .bytes(big.bytes, None, label);
    f = f.evidence(match replayed {
        None => Evidence::measured(format!(
            "{segments} segment releases ({}) in {} episode(s) carry \
                 DeviceCachingAllocator::malloc on their stack: the allocator's OOM-retry path, \
                 not empty_cache()",
            fmt_bytes(bytes),
            retries.len()
        )),
        Some((low, high)) => Evidence::inferred(format!(
            "{segments} segment releases ({}) in {} episode(s), with no stack: each came just \
                 before a request no cached block could serve (the validated allocator replay), \
                 whose new segment would have taken reserved memory above the most the device \
                 ever granted; one capacity between {} and {} explains them all, so they are \
                 the allocator's OOM-retry path, not empty_cache()",
            fmt_bytes(bytes),
            retries.len(),
            fmt_bytes(low),
            fmt_bytes(high)
        )),
    });
    if let Some((index, size, _, _)) = request {
        f = f.evidence(Evidence::new(
            label,
            format!(
                "the largest episode starts at entry #{} of device {}: {} segments ({}) released, \
                 then the {} allocation at entry #{index}",
                big.index,
                device,
                big.segments,
                fmt_bytes(big.bytes),
                fmt_bytes(size),
            ),
        ));
    }
    f = f
        .evidence(Evidence::inferred(
            "the device was full when the request came: a slightly larger input, batch or \
                 another process on the GPU turns this into an OOM",
        ))
        .fix(Fix::advice(format!("{LOWER_LIVE}; {EXPANDABLE}")));
    f.scope = Some(format!("device {device}"));
    Some(f)
}
