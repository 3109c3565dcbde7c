use super::*;
use crate::options::AnalysisOptions;
use crate::torch::analyse;
use crate::torch::model::{Action, TraceEntry};
use crate::torch::stacks::tests::intern;
use crate::torch::totals::tests::{block, entry, segment};

fn codes(f: &[Finding]) -> Vec<&'static str> {
    f.iter().map(|f| f.code.as_str()).collect()
}

/// The stack of an `nn.Linear` forward called from the user's `model.py:30`.
fn activation_stack(snap: &mut Snapshot) -> crate::torch::model::StackId {
    intern(
        snap,
        &[
            (
                "/v/site-packages/torch/nn/modules/linear.py",
                125,
                "forward",
            ),
            (
                "/v/site-packages/torch/nn/modules/module.py",
                1747,
                "_call_impl",
            ),
            ("/u/model.py", 30, "forward"),
        ],
    )
}

/// A training loop of `steps` steps: forward activations freed in backward, plus `extra`.
fn training(
    snap: &mut Snapshot,
    steps: u64,
    mut extra: impl FnMut(&mut Snapshot, u64, &mut Vec<TraceEntry>),
) -> Vec<TraceEntry> {
    let act = activation_stack(snap);
    let mut list = Vec::new();
    for step in 0..steps {
        for k in 0..4u64 {
            let mut e = entry(Action::Alloc, 0x10_0000 + step * 0x1000 + k, 1 << 20);
            e.set_stack(Some(act));
            list.push(e);
        }
        extra(snap, step, &mut list);
        for k in 0..4u64 {
            let addr = 0x10_0000 + step * 0x1000 + k;
            list.push(entry(Action::FreeRequested, addr, 1 << 20));
            list.push(entry(Action::FreeCompleted, addr, 1 << 20));
        }
    }
    list
}

#[test]
fn healthy_training_loop_raises_no_warning() {
    let mut snap = Snapshot::default();
    let list = training(&mut snap, 8, |_, _, _| {});
    snap.device_traces = Some(vec![list]);
    snap.segments = vec![segment(
        0,
        1 << 30,
        vec![block(8 << 20, 8 << 20, BlockState::Inactive)],
    )];
    let a = analyse(&snap, &AnalysisOptions::default());
    assert!(
        a.findings.iter().all(|f| f.severity < Severity::Warning),
        "{:?}",
        codes(&a.findings)
    );
}

/// `x`-sized activation allocations that are never freed, `layers` per step.
fn forward_without_backward(
    snap: &mut Snapshot,
    steps: u64,
    layers: u64,
    mut per_step: impl FnMut(&mut Snapshot, u64, &mut Vec<TraceEntry>),
) -> Vec<TraceEntry> {
    let act = activation_stack(snap);
    let mut list = Vec::new();
    for step in 0..steps {
        for k in 0..layers {
            let mut e = entry(Action::Alloc, 0x10_0000 + step * 0x1000 + k, 1 << 20);
            e.set_stack(Some(act));
            list.push(e);
        }
        per_step(snap, step, &mut list);
    }
    list
}

#[test]
fn a_layer_loop_inside_one_forward_is_not_a_retained_graph() {
    // One forward over 32 layers, dumped before backward (e.g. at an OOM): the activation
    // site repeats across the whole window, but nothing marks separate steps.
    let mut snap = Snapshot::default();
    let list = forward_without_backward(&mut snap, 1, 32, |_, _, _| {});
    snap.device_traces = Some(vec![list]);
    let a = analyse(&snap, &AnalysisOptions::default());
    assert!(
        !codes(&a.findings).contains(&"PT002"),
        "{:?}",
        codes(&a.findings)
    );
}

#[test]
fn a_cache_filled_in_forward_while_backward_frees_the_rest_is_not_a_retained_graph() {
    // Each step: 4 activations freed by backward, one cached mask kept, and a loss scalar.
    let mut snap = Snapshot::default();
    let mask = intern(
        &mut snap,
        &[
            (
                "/v/site-packages/torch/nn/modules/module.py",
                1747,
                "_call_impl",
            ),
            ("/u/model.py", 88, "forward"),
        ],
    );
    let loss = intern(&mut snap, &[("/u/train.py", 50, "main")]);
    let list = training(&mut snap, 8, |_, step, list| {
        let mut m = entry(Action::Alloc, 0x70_0000 + step, 1 << 20);
        m.set_stack(Some(mask));
        list.push(m);
        let mut l = entry(Action::Alloc, 0x50_0000 + step, 4);
        l.set_stack(Some(loss));
        list.push(l);
        list.push(entry(Action::FreeRequested, 0x50_0000 + step, 4));
        list.push(entry(Action::FreeCompleted, 0x50_0000 + step, 4));
    });
    snap.device_traces = Some(vec![list]);
    let a = analyse(&snap, &AnalysisOptions::default());
    assert!(
        !codes(&a.findings).contains(&"PT002"),
        "{:?}",
        codes(&a.findings)
    );
}

#[test]
fn a_running_total_replaced_each_step_pins_pt002_to_the_total() {
    // `total = total + loss`: the new total is made after the loss, the old one freed; the
    // graph behind it keeps every step's activations.
    let mut snap = Snapshot::default();
    let loss = intern(&mut snap, &[("/u/train.py", 50, "main")]);
    let total = intern(&mut snap, &[("/u/train.py", 51, "main")]);
    let list = forward_without_backward(&mut snap, 8, 4, |_, step, list| {
        let mut l = entry(Action::Alloc, 0x50_0000 + step, 4);
        l.set_stack(Some(loss));
        list.push(l);
        let mut t = entry(Action::Alloc, 0x60_0000 + step, 4);
        t.set_stack(Some(total));
        list.push(t);
        if step > 0 {
            for addr in [0x50_0000 + step - 1, 0x60_0000 + step - 1] {
                list.push(entry(Action::FreeRequested, addr, 4));
                list.push(entry(Action::FreeCompleted, addr, 4));
            }
        }
    });
    snap.device_traces = Some(vec![list]);
    let a = analyse(&snap, &AnalysisOptions::default());
    let f = a.findings.iter().find(|f| f.code == Code::PT002);
    let f = f.unwrap_or_else(|| panic!("no PT002 in {:?}", codes(&a.findings)));
    assert_eq!(f.location.as_ref().map(|l| l.line), Some(51));
    assert!(!codes(&a.findings).contains(&"PT003"));
}

#[test]
fn a_loss_line_that_also_allocates_the_loss_functions_temporaries_marks_steps() {
    // `loss = F.cross_entropy(out, y)` allocates log-softmax outputs (freed) and the loss
    // itself on one line; every step's graph is kept behind the loss.
    let mut snap = Snapshot::default();
    let loss = intern(&mut snap, &[("/u/train.py", 50, "main")]);
    let list = forward_without_backward(&mut snap, 8, 4, |_, step, list| {
        let tmp = 0x40_0000 + step * 0x100;
        let mut t = entry(Action::Alloc, tmp, 8 << 20);
        t.set_stack(Some(loss));
        list.push(t);
        let mut l = entry(Action::Alloc, 0x50_0000 + step, 4);
        l.set_stack(Some(loss));
        list.push(l);
        list.push(entry(Action::FreeRequested, tmp, 8 << 20));
        list.push(entry(Action::FreeCompleted, tmp, 8 << 20));
    });
    snap.device_traces = Some(vec![list]);
    let a = analyse(&snap, &AnalysisOptions::default());
    let f = a.findings.iter().find(|f| f.code == Code::PT002);
    let f = f.unwrap_or_else(|| panic!("no PT002 in {:?}", codes(&a.findings)));
    assert_eq!(f.location.as_ref().map(|l| l.line), Some(50));
    assert_eq!(
        f.bytes,
        Some(8 * 4 * (1 << 20) + 8 * 4),
        "activations + kept losses"
    );
    assert!(
        f.evidence.iter().any(|e| e.text.contains(
            "(≤ 4 B requested) is made at /u/train.py:50:main once per step: 8 allocations"
        )),
        "{:?}",
        f.evidence
    );
}

#[test]
fn a_model_output_kept_every_step_is_pt003_at_its_forward_line() {
    // `history.append(model(x))` in a training loop: the output is made inside `forward`
    // (an activation by its stack) while backward frees the rest of each step's forward.
    let mut snap = Snapshot::default();
    let head = intern(
        &mut snap,
        &[
            (
                "/v/site-packages/torch/nn/modules/linear.py",
                125,
                "forward",
            ),
            ("/u/model.py", 60, "forward"),
            ("/u/train.py", 44, "main"),
        ],
    );
    let list = training(&mut snap, 8, |_, step, list| {
        let mut e = entry(Action::Alloc, 0x900_0000 + step * 0x1000, 4096);
        e.set_stack(Some(head));
        list.push(e);
    });
    snap.device_traces = Some(vec![list]);
    let a = analyse(&snap, &AnalysisOptions::default());
    let f = a.findings.iter().find(|f| f.code == Code::PT003);
    let f = f.unwrap_or_else(|| panic!("no PT003 in {:?}", codes(&a.findings)));
    assert_eq!(
        f.location.as_ref().map(|l| (l.file.as_str(), l.line)),
        Some(("/u/model.py", 60))
    );
    assert_eq!(f.bytes, Some(8 * 4096));
    assert!(!codes(&a.findings).contains(&"PT002"));
}

#[test]
fn growing_container_is_pt003_at_the_appending_line() {
    let mut snap = Snapshot::default();
    let grow = intern(&mut snap, &[("/u/train.py", 44, "main")]);
    let mut live = Vec::new();
    let list = training(&mut snap, 8, |_, step, list| {
        let mut e = entry(Action::Alloc, 0x900_0000 + step * 0x1000, 4096);
        e.set_stack(Some(grow));
        list.push(e);
    });
    for step in 0..8u64 {
        let mut b = block(4096, 4096, BlockState::ActiveAllocated);
        b.stack = Some(grow);
        live.push(b);
        let _ = step;
    }
    snap.segments = vec![segment(0, 0x900_0000, live)];
    snap.device_traces = Some(vec![list]);
    let a = analyse(&snap, &AnalysisOptions::default());
    let f = a.findings.iter().find(|f| f.code == Code::PT003);
    let f = f.unwrap_or_else(|| panic!("no PT003 in {:?}", codes(&a.findings)));
    assert_eq!(f.location.as_ref().map(|l| l.line), Some(44));
    assert_eq!(f.fixes[0].kind, FixKind::DetachCpuAppend);
    assert!(!codes(&a.findings).contains(&"PT002"));
}

#[test]
fn oom_with_split_cache_is_pt008_and_pt009() {
    let mut snap = Snapshot::default();
    let st = intern(&mut snap, &[("/u/train.py", 12, "main")]);
    snap.segments = (0..4u64)
        .map(|i| {
            segment(
                0,
                (i + 1) << 32,
                vec![
                    block(40 << 20, 40 << 20, BlockState::ActiveAllocated),
                    block(24 << 20, 0, BlockState::Inactive),
                ],
            )
        })
        .collect();
    let mut oom = entry(Action::Oom, 0, 64 << 20);
    oom.set_device_free(Some(1 << 20));
    oom.set_stack(Some(st));
    snap.device_traces = Some(vec![vec![oom]]);
    let a = analyse(&snap, &AnalysisOptions::default());
    assert_eq!(&codes(&a.findings)[..2], &["PT008", "PT009"]);
    let pt8 = &a.findings[0];
    assert_eq!(
        pt8.fixes[0].kind,
        FixKind::AllocConf {
            value: "expandable_segments:True".into()
        }
    );
    // The trace holds only the OOM: the replay serves nothing, so no max_split_size_mb helps
    // and the fix says so (simulated) instead of offering `max_split_size_mb:64`.
    assert_eq!(pt8.fixes[1].kind, FixKind::Advice);
    assert_eq!(
        pt8.fixes[1].simulated.as_ref().and_then(|s| s.oom_avoided),
        Some(false)
    );
    assert_eq!(pt8.location.as_ref().map(|l| l.line), Some(12));
}
