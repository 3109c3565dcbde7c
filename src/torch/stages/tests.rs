use super::*;
use crate::frames::FrameFilter;
use crate::torch::model::{Annotation, Snapshot, StackId, TraceEntry};
use crate::torch::stacks::tests::intern;

fn alloc(addr: u64, size: u64, t: i64, stack: Option<u32>) -> TraceEntry {
    TraceEntry::new(Action::Alloc, addr, size, 0)
        .with_time_us(Some(t))
        .with_stack(stack)
}
fn free(addr: u64, size: u64, t: i64) -> TraceEntry {
    TraceEntry::new(Action::FreeCompleted, addr, size, 0).with_time_us(Some(t))
}
fn ann(name: &str, start: bool, t: i64) -> Annotation {
    Annotation {
        name: name.into(),
        stage: if start {
            AnnotationStage::Start
        } else {
            AnnotationStage::End
        },
        device: 0,
        time_us: Some(t),
    }
}

/// Stacks of a training step: forward, autograd's backward, an AdamW step.
fn step_stacks(snap: &mut Snapshot) -> (StackId, StackId, StackId) {
    let fwd = intern(snap, &[("/w/model.py", 10, "forward")]);
    let bwd = intern(
        snap,
        &[
            ("/w/train.py", 20, "main"),
            ("torch/autograd/graph.py", 1, "_engine_run_backward"),
        ],
    );
    let opt = intern(snap, &[("torch/optim/adamw.py", 5, "step")]);
    (fwd, bwd, opt)
}

/// One step at addresses and times from `at`: a forward and a backward allocation, both
/// freed, then an optimizer allocation freed (times `at + 1..=at + 6`).
fn step(at: u64, [fwd, bwd, opt]: [StackId; 3]) -> [TraceEntry; 6] {
    let t = at as i64;
    [
        alloc(at + 1, 1000, t + 1, Some(fwd)),
        alloc(at + 2, 500, t + 2, Some(bwd)),
        free(at + 1, 1000, t + 3),
        free(at + 2, 500, t + 4),
        alloc(at + 3, 4000, t + 5, Some(opt)),
        free(at + 3, 4000, t + 6),
    ]
}

/// The stages of `snap`, with its stacks, timeline and releases.
fn stages_of(snap: &Snapshot) -> Stages {
    let stacks = StackIndex::new(snap, &FrameFilter::default());
    let timeline = crate::torch::timeline::compute(snap, &stacks);
    compute(snap, &stacks, &timeline, &Releases::compute(snap))
}

#[test]
fn span_maxima_match_a_plain_walk() {
    let list: Vec<TraceEntry> = (0..(3 * BLOCK as u64 + 17))
        .map(|i| {
            if i % 3 == 2 {
                free(i - 1, (i * 7) % 1000, i as i64)
            } else {
                alloc(i, (i * 13) % 997, i as i64, None)
            }
        })
        .collect();
    let live = Live::new(&list, 100);
    let after: Vec<i64> = list
        .iter()
        .scan(100i64, |r, e| {
            *r += delta(e);
            Some(*r)
        })
        .collect();
    let n = list.len() as u64;
    for (a, b) in [
        (0, n),
        (5, 9),
        (0, BLOCK as u64),
        (BLOCK as u64, 2 * BLOCK as u64 + 3),
        (17, 3 * BLOCK as u64),
        (n - 1, n),
        (4, 4),
    ] {
        let mut want = (if a == 0 { 100 } else { after[a as usize - 1] }, a);
        for i in a..b {
            if after[i as usize] > want.0 {
                want = (after[i as usize], i);
            }
        }
        assert_eq!(live.max(a, b), want, "{a}..{b}");
        let before = if b == 0 { 100 } else { after[b as usize - 1] };
        assert_eq!(live.before(b), before, "before {b}");
    }
}

/// A step: forward allocations, autograd's backward, an AdamW step recorded as an annotation.
#[test]
fn recorded_spans_hold_the_peak_and_gaps_are_inferred() {
    let mut snap = Snapshot::default();
    let (fwd, bwd, opt) = step_stacks(&mut snap);
    let mut tr = vec![
        alloc(1, 1000, 10, Some(fwd)),
        alloc(2, 1000, 11, Some(fwd)),
        alloc(3, 500, 20, Some(bwd)),
        free(1, 1000, 21),
        free(2, 1000, 22),
        alloc(4, 4000, 31, Some(opt)),
        free(4, 4000, 32),
    ];
    tr.push(alloc(5, 10, 40, Some(fwd)));
    snap.device_traces = Some(vec![tr]);
    snap.annotations = vec![
        ann("Optimizer.step#AdamW.step", true, 30),
        ann("Optimizer.step#AdamW.step", false, 33),
    ];
    let st = stages_of(&snap);
    let names: Vec<(&str, StageSource, u64, u64, u32)> = st
        .stages
        .iter()
        .map(|s| (s.name.as_str(), s.source, s.start, s.end, s.step))
        .collect();
    assert_eq!(
        names,
        vec![
            ("forward", StageSource::Inferred, 0, 2, 1),
            ("backward", StageSource::Inferred, 2, 5, 1),
            ("Optimizer.step#AdamW.step", StageSource::Recorded, 5, 7, 1),
            ("forward", StageSource::Inferred, 7, 8, 2),
        ]
    );
    let step = &st.stages[2];
    assert_eq!(
        (step.peak_bytes - step.start_bytes, step.growth()),
        (4000, 0)
    );
    assert_eq!(
        st.at_peak,
        vec![(0, 2)],
        "the optimizer step holds the peak"
    );
    assert_eq!(
        step.top_sites.first().map(|s| s.1),
        Some(4000),
        "live at the peak"
    );
    let bwd_stage = &st.stages[1];
    assert_eq!(bwd_stage.growth(), -1500);
}

#[test]
fn unmatched_ends_are_counted_and_open_starts_run_to_the_end() {
    let mut snap = Snapshot {
        device_traces: Some(vec![vec![alloc(1, 10, 5, None), alloc(2, 10, 6, None)]]),
        ..Snapshot::default()
    };
    snap.annotations = vec![ann("x", false, 1), ann("y", true, 6)];
    let st = stages_of(&snap);
    assert_eq!(st.unplaced, 1);
    let y = st.stages.iter().find(|s| s.name == "y").unwrap();
    assert_eq!((y.start, y.end, y.end_us), (1, 2, Some(6)));
}

/// A trace of more steps than inferred stages are kept: the first `MAX_INFERRED` stay, in
/// order, with every step's optimizer run among them (the count of inferred stages goes along
/// as they are made; counted too high, optimizer runs would go missing before the cap).
#[test]
fn inferred_stages_stop_at_the_cap_with_every_optimizer_run_before_it() {
    let mut snap = Snapshot::default();
    let (fwd, bwd, opt) = step_stacks(&mut snap);
    let steps = MAX_INFERRED as u64; // three stages a step: three times the cap
    let tr: Vec<TraceEntry> = (0..steps)
        .flat_map(|i| step(100 * i, [fwd, bwd, opt]))
        .collect();
    snap.device_traces = Some(vec![tr]);
    let st = stages_of(&snap);
    let names: Vec<&str> = st.stages.iter().map(|s| s.name.as_str()).collect();
    let want: Vec<&str> = ["forward", "backward", "optimizer"]
        .iter()
        .copied()
        .cycle()
        .take(MAX_INFERRED)
        .collect();
    assert_eq!(names, want);
    assert_eq!(
        st.stages[MAX_INFERRED - 1].start,
        6 * (MAX_INFERRED as u64 / 3 - 1) + 4
    );
}

/// Recorded optimizer steps leave a part between each two, inferred one by one: past the cap,
/// the latest inferred stages go and every recorded one stays.
#[test]
fn inferred_stages_of_many_parts_stop_at_the_cap_and_recorded_ones_stay() {
    let mut snap = Snapshot::default();
    let (fwd, bwd, opt) = step_stacks(&mut snap);
    let steps = MAX_INFERRED as u64; // two inferred stages a part: twice the cap
    let tr: Vec<TraceEntry> = (0..steps)
        .flat_map(|i| step(100 * i, [fwd, bwd, opt]))
        .collect();
    for i in 0..steps {
        let t = 100 * i as i64;
        snap.annotations
            .push(ann("Optimizer.step#AdamW.step", true, t + 5));
        snap.annotations
            .push(ann("Optimizer.step#AdamW.step", false, t + 7));
    }
    snap.device_traces = Some(vec![tr]);
    let st = stages_of(&snap);
    let inferred: Vec<(&str, u64)> = st
        .stages
        .iter()
        .filter(|s| s.source == StageSource::Inferred)
        .map(|s| (s.name.as_str(), s.start))
        .collect();
    let want: Vec<(&str, u64)> = (0..MAX_INFERRED as u64 / 2)
        .flat_map(|i| [("forward", 6 * i), ("backward", 6 * i + 1)])
        .collect();
    assert_eq!(inferred, want);
    let recorded = st
        .stages
        .iter()
        .filter(|s| s.source == StageSource::Recorded)
        .count();
    assert_eq!(recorded, steps as usize);
}
