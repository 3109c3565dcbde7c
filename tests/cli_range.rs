//! `report --range A..B` on a real snapshot: only that part of the trace is analysed, its
//! entries counted in `totals.trace_entries`, the allocator state at B rebuilt backwards from the dump.

mod common;

use std::path::Path;

const NIU: &str =
    "torch_snapshots/real/NiuHuangxiaozi__16edf316_forward_and_backward_memory_snapshot_150.pickle";

fn json(args: &[&str]) -> serde_json::Value {
    let r = common::memlsp(args, Path::new(env!("CARGO_MANIFEST_DIR")));
    assert_eq!(r.code, 0, "{}", r.stderr);
    r.json()
}

/// Step 2 of NiuHuangxiaozi's three training steps (its zero_grad to its optimizer step).
#[test]
fn the_second_step_alone() {
    let Some(p) = common::shared(NIU) else { return };
    let whole = json(&["report", common::arg(&p), "--format", "json"]);
    let part = json(&[
        "report",
        common::arg(&p),
        "--range",
        "3904..7691",
        "--format",
        "json",
    ]);
    let t = &part["captures"][0]["torch"];
    assert_eq!(t["totals"]["trace_entries"], 7691 - 3904);
    assert_eq!(
        t["range"],
        serde_json::json!([{"device": 0, "start_index": 3904, "end_index": 7691, "of_entries": 11477}])
    );
    // The state at entry 7691 (after the step) is not the dump's: it was rebuilt.
    let w = &whole["captures"][0]["torch"];
    assert_ne!(
        t["totals"]["allocated_bytes"],
        w["totals"]["allocated_bytes"]
    );
    // The part's stages: its recorded optimizer step (indices within the part), holding less
    // than the whole run's peak, which falls in this step's backward.
    let step = t["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "Optimizer.step#NIUAdam.step")
        .unwrap();
    assert_eq!(
        (&step["span"]["start_index"], &step["span"]["end_index"]),
        (&(6053 - 3904).into(), &(7691 - 3904).into())
    );
    let peak = t["timeline"][0]["live_bytes_reconstructed"]["peak_index"]
        .as_u64()
        .unwrap();
    let whole_peak = w["timeline"][0]["live_bytes_reconstructed"]["peak_index"]
        .as_u64()
        .unwrap();
    assert_eq!(peak + 3904, whole_peak, "the run's peak is in step 2");
}

#[test]
fn seconds_and_open_ends() {
    let Some(p) = common::shared(NIU) else { return };
    // The trace spans ~1.01 s; from 0.5 s to the end keeps the dump's own state.
    let part = json(&[
        "report",
        common::arg(&p),
        "--range",
        "0.5s..",
        "--format",
        "json",
    ]);
    let c = &part["captures"][0]["torch"]["range"][0];
    assert_eq!(c["end_index"], 11477);
    let a = c["start_index"].as_u64().unwrap();
    assert!(a > 0 && a < 11477, "{c}");
    assert_eq!(
        part["captures"][0]["torch"]["totals"]["trace_entries"],
        11477 - a
    );
    let head = json(&[
        "report",
        common::arg(&p),
        "--range",
        "..100",
        "--format",
        "json",
    ]);
    assert_eq!(head["captures"][0]["torch"]["totals"]["trace_entries"], 100);
}

#[test]
fn bad_ranges_are_one_line() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    common::memlsp(&["report", "x.pickle", "--range", "5..2"], dir)
        .assert_one_line_error("the range is empty");
    common::memlsp(&["report", "x.pickle", "--range", "abc"], dir)
        .assert_one_line_error("is not A..B");
    let Some(p) = common::shared(NIU) else { return };
    common::memlsp(&["report", common::arg(&p), "--range", "20000.."], dir)
        .assert_one_line_error("the range holds no entry");
}

/// The state at B is rebuilt backwards from the dump (one pass over the entries after B, no
/// replay). On NiuHuangxiaozi's run, whose replay validates, it is the replay's own state at
/// B: the same segments, the same live blocks (address, state, requested bytes), at ten points.
#[test]
fn the_state_at_b_rebuilt_backwards_is_the_replays() {
    use memlsp::options::DecodeOptions;
    use memlsp::torch::model::BlockState;
    let Some(p) = common::shared(NIU) else { return };
    let snap = memlsp::torch::load::load_snapshot(&p, &DecodeOptions::default()).unwrap();
    let n = snap.trace(0).len();
    for b in (1..10).map(|k| k * n / 10).chain([7691]) {
        let ours = memlsp::torch::range::segments_at(&snap, 0, b);
        let replayed = memlsp::torch::replay::state_after(&snap, 0, b - 1).expect("validates");
        let segs = |v: &[memlsp::torch::model::Segment]| -> Vec<(u64, u64)> {
            v.iter().map(|s| (s.address, s.total_size)).collect()
        };
        assert_eq!(segs(&ours), segs(&replayed), "segments at {b}");
        let live = |v: &[memlsp::torch::model::Segment]| -> Vec<(u64, u64, BlockState)> {
            let mut l: Vec<_> = v
                .iter()
                .flat_map(|s| &s.blocks)
                .filter(|b| b.state != BlockState::Inactive)
                .map(|b| (b.address, b.requested_size, b.state.clone()))
                .collect();
            l.sort_by_key(|x| x.0);
            l
        };
        let (o, r) = (live(&ours), live(&replayed));
        assert!(o.len() > 100, "{} live blocks at {b}", o.len());
        assert_eq!(o, r, "live blocks at {b}");
    }
}

/// 10 % of the trace: `totals.trace_entries` is the range, and the state at its end is rebuilt
/// (not the dump's).
#[test]
fn a_tenth_of_the_trace_counts_a_tenth() {
    let Some(p) = common::shared(NIU) else { return };
    let part = json(&[
        "report",
        common::arg(&p),
        "--range",
        "5000..6148",
        "--format",
        "json",
    ]);
    let t = &part["captures"][0]["torch"];
    assert_eq!(t["totals"]["trace_entries"], 1148);
    assert_eq!(t["range"][0]["start_index"], 5000);
    assert_eq!(t["range"][0]["end_index"], 6148);
}
