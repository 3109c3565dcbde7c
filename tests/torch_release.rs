//! Why memory was released, read from the release stacks of real snapshots: each expectation
//! below was checked by hand against the trace (frames of the `free_requested` /
//! `segment_free` entries) before it was written.

mod common;

use memlsp::options::DecodeOptions;
use memlsp::torch::load::load_snapshot;
use memlsp::torch::release::{Cause, GraphSeen, Releases};

fn releases(name: &str) -> Option<Releases> {
    let path = common::shared(&format!("torch_snapshots/real/{name}"))?;
    let snap = load_snapshot(&path, &DecodeOptions::default()).unwrap();
    Some(Releases::compute(&snap))
}

const MIB: u64 = 1 << 20;

#[test]
fn a_forward_with_no_backward_releases_its_graph_by_dropping_the_output() {
    // bolongcheng: an xl forward benchmark with grad on; `benchmark_base.py:115` drops the output
    // and 708 frees go through SavedVariable::reset_data / deleteNode, none through the engine.
    let Some(r) =
        releases("bolongcheng__0df6e0e9_memory_snapshot_xl_fwd_cl512_dtypetorch.float32.pickle")
    else {
        return;
    };
    let b = r.blocks();
    assert_eq!(b.get(Cause::GraphDropped).count, 708);
    assert_eq!(
        b.get(Cause::GraphInBackward).count + b.get(Cause::Backward).count,
        0
    );
    assert_eq!(r.graph(), GraphSeen::DroppedWithoutBackward);
    assert!(b.get(Cause::UserLine).count >= 964);
}

#[test]
fn a_training_step_shows_backward_zero_grad_and_the_optimizer() {
    // notHanmin: one step with the engine freeing saved tensors (940 via release_variables /
    // reset_data), zero_grad dropping 327 gradients (3.61 GiB), the optimizer's temporaries.
    let Some(r) = releases("notHanmin__memory_snapshot.pickle") else {
        return;
    };
    let b = r.blocks();
    assert_eq!(b.get(Cause::GraphInBackward).count, 940);
    assert_eq!(b.get(Cause::ZeroGrad).count, 327);
    assert_eq!(b.get(Cause::ZeroGrad).bytes, 3_877_647_360);
    assert!(b.get(Cause::OptimizerStep).count >= 327);
    assert_eq!(
        b.get(Cause::Collector).count,
        0,
        "no collector frame anywhere"
    );
    assert_eq!(r.graph(), GraphSeen::Backward);
}

#[test]
fn passes_without_a_graph_have_no_graph_release() {
    // HugePandaCoder 1e496ac8 (an eval forward under decorate_context) and MercuryB1 (a
    // calibration loop under no_grad): native frames are recorded, no free releases a graph.
    for name in [
        "HugePandaCoder__1e496ac8_my_snapshot.pickle",
        "MercuryB1__cuda_memory_snapshot.pickle",
    ] {
        let Some(r) = releases(name) else { return };
        assert!(r.native_frames, "{name}");
        assert_eq!(r.graph(), GraphSeen::None, "{name}");
    }
    // Grad mode from the allocation stacks: the eval forward runs under a decorator
    // (`decorate_context`) for 96 % of its allocated bytes, the calibration loop for all of them.
    let r = releases("HugePandaCoder__1e496ac8_my_snapshot.pickle").unwrap();
    assert!(r.decorated_alloc_bytes * 100 >= r.alloc_bytes * 95);
    // MercuryB1 calls empty_cache: 420 segment releases.
    let r = releases("MercuryB1__cuda_memory_snapshot.pickle").unwrap();
    assert_eq!(r.decorated_alloc_bytes, r.alloc_bytes);
    assert_eq!(r.devices[0].segments.get(Cause::EmptyCache).count, 420);
    assert!(r.devices[0].oom_retries.is_empty());
}

#[test]
fn the_allocator_oom_retry_path_is_seen_on_segment_frees() {
    // HugePandaCoder e024498d: 17 segment_free from DeviceCachingAllocator::malloc released
    // 9.30 GiB of cache to serve one 6.85 GiB request (inference2_peso_oct.py:200).
    let Some(r) = releases("HugePandaCoder__e024498d_inference2_peso_oct.pickle") else {
        return;
    };
    let retries: Vec<_> = r.devices.iter().flat_map(|d| &d.oom_retries).collect();
    let segs: u64 = retries.iter().map(|x| x.segments).sum();
    let bytes: u64 = retries.iter().map(|x| x.bytes).sum();
    assert_eq!(segs, 17);
    assert_eq!(bytes, 9520 * MIB);
    let big = retries.iter().max_by_key(|x| x.bytes).unwrap();
    let (_, size, _) = big.request.unwrap();
    assert!(
        (6.8..6.9).contains(&(size as f64 / (1u64 << 30) as f64)),
        "{size}"
    );
}

#[test]
fn the_autocast_cache_is_its_own_cause_and_python_only_captures_cannot_see_graphs() {
    let Some(r) = releases("silmont2000__memory_forward_bf16_128.pickle") else {
        return;
    };
    assert_eq!(r.blocks().get(Cause::AutocastCache).count, 85);
    // Python-only stacks still show the cache cleared: the frees run inside autocast's __exit__.
    let Some(r) = releases("LilySu__332ffce2_memory_snapshot_large_forward_ctx128_mp.pickle")
    else {
        return;
    };
    assert_eq!(r.blocks().get(Cause::AutocastCache).count, 1352);
    let Some(r) = releases("MAGMA27__memory_snapshot.pickle") else {
        return;
    };
    assert!(!r.native_frames);
    assert_eq!(r.graph(), GraphSeen::Unknown);
}

#[test]
fn a_forward_loop_that_keeps_the_previous_output_holds_two_graphs_at_the_peak() {
    // series/xiaolin2004_forward_only_fp32: `out = model(x)` each iteration with grad on; the
    // previous output's graph is released only when `out` is rebound, after the next forward
    // built its own: at the peak two graph drops of equal size hold the memory. bolongcheng's
    // single forward holds one.
    let Some(path) =
        common::shared("torch_snapshots/series/xiaolin2004_forward_only_fp32/ctx512.pickle")
    else {
        return;
    };
    let snap = load_snapshot(&path, &DecodeOptions::default()).unwrap();
    let opts = memlsp::options::AnalysisOptions::default();
    let a = memlsp::torch::analyse(&snap, &opts);
    let peak = a.timeline.devices[0].peak_set.as_ref().unwrap().index;
    let drops = memlsp::torch::release::graph_drops_held_at(&snap, &a.releases, &a.stacks, 0, peak);
    assert_eq!(drops.len(), 2, "{drops:?}");
    assert_eq!(drops[0], drops[1], "two iterations of one model");
    let f = a
        .findings
        .iter()
        .find(|f| f.code == memlsp::findings::Code::PT005)
        .unwrap();
    assert!(f.fixes[0].title.contains("inference_mode"));
    assert!(f.fixes[1].title.contains("del out"), "{:?}", f.fixes);
    assert_eq!(f.fixes[1].saving_bytes, Some(drops[0]));

    let Some(path) = common::shared(
        "torch_snapshots/real/bolongcheng__0df6e0e9_memory_snapshot_xl_fwd_cl512_dtypetorch.float32.pickle",
    ) else {
        return;
    };
    let snap = load_snapshot(&path, &DecodeOptions::default()).unwrap();
    let a = memlsp::torch::analyse(&snap, &opts);
    let peak = a.timeline.devices[0].peak_set.as_ref().unwrap().index;
    let drops = memlsp::torch::release::graph_drops_held_at(&snap, &a.releases, &a.stacks, 0, peak);
    assert_eq!(drops.len(), 1, "{drops:?}");
}

#[test]
fn the_forward_cost_is_timed_from_the_previous_optimizer_step() {
    // NiuHuangxiaozi: the trace starts 923.5 ms before the peak; the step that peaks begins
    // after the previous step's optimizer frees (entry 3980) and its forward reaches the peak in
    // 27.6 ms.
    let Some(path) = common::shared(
        "torch_snapshots/real/NiuHuangxiaozi__16edf316_forward_and_backward_memory_snapshot_150.pickle",
    ) else {
        return;
    };
    let r = memlsp::analyze::run_file(&path, &memlsp::options::Options::default()).unwrap();
    let f = r
        .findings
        .iter()
        .find(|f| f.code == memlsp::findings::Code::PT005)
        .unwrap();
    let cost = f.fixes[0].cost.as_deref().unwrap();
    assert!(cost.contains("took 27.6 ms"), "{cost}");
}
