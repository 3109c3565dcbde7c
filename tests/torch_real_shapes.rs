//! PT002, PT003 and PT008 on real traces changed the way the bug would change them.
//!
//! The synthetic fixtures' stacks were written to land on the detectors; here the stacks are
//! those of real programs (`../shared/torch_snapshots/real/`), and only what the bug changes is
//! changed: which blocks are freed, how often the step runs, how large the device is. The
//! snapshots are built in memory at test time and never written anywhere (the stacks are third
//! parties'); `tests/support/real_shapes.rs` says how.

mod common;
#[path = "support/real_shapes.rs"]
mod real_shapes;

use std::collections::HashSet;

use memlsp::findings::{Code, Finding, FixKind, fmt_bytes};
use memlsp::options::AnalysisOptions;
use memlsp::torch::model::Snapshot;
use memlsp::torch::stacks::Role;
use real_shapes::{Stacks, assert_consistent, repeat, step};

/// Steps in a repeated trace: one per part of the timeline's window.
const STEPS: usize = 8;

fn load(name: &str) -> Option<Snapshot> {
    let dir = common::shared("torch_snapshots/real")?;
    let path = dir.join(name);
    Some(memlsp::torch::load::load_snapshot(&path, &Default::default()).unwrap())
}

fn findings(snap: &Snapshot) -> Vec<Finding> {
    memlsp::torch::analyse(snap, &AnalysisOptions::default()).findings
}

fn codes(f: &[Finding]) -> Vec<&'static str> {
    f.iter().map(|f| f.code.as_str()).collect()
}

fn find(f: &[Finding], code: Code) -> &Finding {
    f.iter()
        .find(|x| x.code == code)
        .unwrap_or_else(|| panic!("no {} in {:?}", code.as_str(), codes(f)))
}

fn at(f: &Finding) -> (&str, u32) {
    let l = f.location.as_ref().expect("a location");
    (l.file.rsplit(['/', '\\']).next().unwrap_or(""), l.line)
}

fn assert_no_leak(f: &[Finding], what: &str) {
    assert!(
        !codes(f).iter().any(|c| matches!(*c, "PT002" | "PT003")),
        "{what}: {:?}",
        codes(f)
    );
}

/// Hyperion-shuo's capture is one real step of a loop that runs the model's forward with grad
/// and computes the loss (`basic_lm_memory_profile.py:101`, `F.cross_entropy`, which also
/// allocates log-softmax outputs on that line), then drops the previous iteration's graph: the
/// trace frees 1,234 blocks allocated before it began, and leaves 1,234 of the same sizes live —
/// this step's graph. An eval loop without `no_grad` that does `total_loss += loss` keeps every
/// step's graph: the saved activations (the step's end-live blocks allocated inside `forward`)
/// and the loss are never freed.
#[test]
fn pt002_names_the_loss_line_when_every_steps_graph_is_kept() {
    let Some(snap) =
        load("Hyperion-shuo__7fe70b1d_memory_snapshot_large_cl512_fw_with_grad_bf16.pickle")
    else {
        return;
    };
    assert_no_leak(&findings(&snap), "the capture as recorded");
    let st = step(&snap, 0);
    assert!(st.steady(), "one step of a steady loop");
    assert_eq!(st.end_live.len(), 1234);
    let stacks = Stacks::new(&snap);
    let trace = st.trace;
    let saved: Vec<usize> = st
        .end_live
        .iter()
        .copied()
        .filter(|&j| stacks.role(&trace[j]) == Role::Activation)
        .collect();
    let saved_bytes: u64 = saved.iter().map(|&j| trace[j].size).sum();
    let loss = *st
        .end_live
        .iter()
        .find(|&&j| trace[j].size <= 64)
        .expect("the loss is live at the end of the step");
    let loss_site = stacks.site(&trace[loss]);
    assert!(
        loss_site.ends_with("/basic_lm_memory_profile.py:101:run_lm"),
        "{loss_site}"
    );
    let mut keep: HashSet<usize> = saved.iter().copied().collect();
    keep.insert(loss);

    let control = repeat(&snap, 0, STEPS, &HashSet::new());
    assert_consistent(&control);
    assert_no_leak(&findings(&control), "the loop without the bug");

    let bug = repeat(&snap, 0, STEPS, &keep);
    assert_consistent(&bug);
    let f = findings(&bug);
    let pt002 = find(&f, Code::PT002);
    assert_eq!(
        at(pt002),
        ("basic_lm_memory_profile.py", 101),
        "{}",
        pt002.message
    );
    let kept = STEPS as u64 * saved_bytes;
    assert!(
        pt002.message.contains(&format!(
            "{} of forward activations allocated in 8 of 8 parts of the trace are never freed",
            fmt_bytes(kept)
        )),
        "{}",
        pt002.message
    );
    // Every step's loss, and the last step's second 4-byte tensor of that line (the loss
    // function's total weight, which a next step would free).
    assert_eq!(
        pt002.bytes,
        Some(kept + (STEPS as u64 + 1) * trace[loss].size)
    );
    let text: Vec<&str> = pt002.evidence.iter().map(|e| e.text.as_str()).collect();
    assert!(
        text.iter().any(|t| t.contains(&format!(
            "(≤ 4 B requested) is made at {loss_site} once per step: {} allocations over",
            2 * STEPS
        ))),
        "{text:?}"
    );
    assert!(
        text.iter()
            .any(|t| t.starts_with("the floor of live memory rose")),
        "{text:?}"
    );
    assert_eq!(
        pt002.fixes[0].kind,
        FixKind::DetachAccumulated { item: false }
    );
    assert!(!codes(&f).contains(&"PT003"), "{:?}", codes(&f));
}

/// notHanmin's capture is one real training step (forward, loss, backward, the optimizer's
/// step) of a steady loop: it frees the previous step's output (`adapters.py:36`, the LM head's
/// logits, 40,960,000 B) and gradients, and leaves this step's live. `history.append(out)` keeps
/// every step's output: the same allocation, at its real line, never freed.
#[test]
fn pt003_names_the_output_line_when_every_steps_output_is_appended() {
    let Some(snap) = load("notHanmin__memory_snapshot.pickle") else {
        return;
    };
    assert_no_leak(&findings(&snap), "the capture as recorded");
    let st = step(&snap, 0);
    assert!(st.steady(), "one step of a steady loop");
    let stacks = Stacks::new(&snap);
    let trace = st.trace;
    // The step's output: the one block made inside `forward` that outlives the step.
    let outputs: Vec<usize> = st
        .end_live
        .iter()
        .copied()
        .filter(|&j| stacks.role(&trace[j]) == Role::Activation)
        .collect();
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    let out = outputs[0];
    let site = stacks.site(&trace[out]);
    assert!(site.ends_with("/adapters.py:36:forward"), "{site}");

    let control = repeat(&snap, 0, STEPS, &HashSet::new());
    assert_consistent(&control);
    assert_no_leak(&findings(&control), "the loop without the bug");

    let bug = repeat(&snap, 0, STEPS, &HashSet::from([out]));
    assert_consistent(&bug);
    let f = findings(&bug);
    let pt003 = find(&f, Code::PT003);
    assert_eq!(at(pt003), ("adapters.py", 36), "{}", pt003.message);
    let kept = STEPS as u64 * trace[out].size;
    assert!(
        pt003.message.contains(&format!(
            "keeps allocating tensors that are never freed: 8 blocks ({}) in 8 of 8 parts",
            fmt_bytes(kept)
        )),
        "{}",
        pt003.message
    );
    assert_eq!(pt003.bytes, Some(kept));
    assert!(
        pt003
            .evidence
            .iter()
            .any(|e| e.text.contains("the trace spans about 8 steps")),
        "{:?}",
        pt003.evidence
    );
    assert_eq!(pt003.fixes[0].kind, FixKind::DetachCpuAppend);
    assert!(!codes(&f).contains(&"PT002"), "{:?}", codes(&f));
}

/// What the allocator state of a built OOM snapshot shows: (rounded request, largest inactive
/// block, inactive bytes, device_free).
fn oom_state(snap: &Snapshot) -> (u64, u64, u64, u64) {
    let t = &snap.device_traces.as_ref().expect("a trace")[0];
    let oom = t.last().expect("an oom entry");
    assert_eq!(oom.action, memlsp::torch::model::Action::Oom);
    let inactive: Vec<u64> = snap
        .segments
        .iter()
        .filter(|s| s.device == 0)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == memlsp::torch::model::BlockState::Inactive)
        .map(|b| b.size)
        .collect();
    (
        oom.size,
        inactive.iter().copied().max().unwrap_or(0),
        inactive.iter().sum(),
        oom.device_free().expect("device_free"),
    )
}

const FULLSTEP: &str = "kkaitlyn111__memory_ctx128_fullstep.pickle";

/// kkaitlyn111's capture is one real training step whose replay validates (494 segment
/// events matched). On a device exactly as large as its peak of live memory, a perfect allocator
/// would fit; the caching allocator, holding freed memory in pieces of its segments, fails
/// first. The snapshot is the model's state at that request, as an OOM observer would dump it.
#[test]
fn pt008_on_a_real_step_replayed_on_a_device_as_large_as_its_peak() {
    let Some(snap) = load(FULLSTEP) else {
        return;
    };
    let r = memlsp::torch::replay::replay_device(&snap, 0);
    assert!(r.validated, "{r:?}");
    let capacity = r.peak_allocated_bytes;
    let oom = memlsp::torch::replay::state_at_capacity(&snap, 0, capacity).expect("an OOM");
    assert_consistent(&oom);
    let (request, largest, inactive, free) = oom_state(&oom);
    // Enough bytes cached in pieces, none large enough.
    assert!(
        largest < request && request <= inactive + free,
        "{request} {largest} {inactive} {free}"
    );
    let f = findings(&oom);
    assert_eq!(&codes(&f)[..2], &["PT008", "PT009"], "{:?}", codes(&f));
    let pt008 = &f[0];
    assert!(
        pt008.message.starts_with(&format!(
            "Fragmentation caused the OOM on device 0: {} requested, but the largest inactive \
             block is {} while {} sit inactive",
            fmt_bytes(request),
            fmt_bytes(largest),
            fmt_bytes(inactive)
        )),
        "{}",
        pt008.message
    );
    // AdamW's update of a 100 MiB parameter, in the user's optimizer: the failed request's line.
    let t = &oom.device_traces.as_ref().expect("a trace")[0];
    let site = Stacks::new(&oom).site(t.last().expect("the oom entry"));
    assert!(site.ends_with("/optimizers.py:100:step"), "{site}");
    assert_eq!(at(pt008), ("optimizers.py", 100), "{}", pt008.message);
    assert_eq!(pt008.bytes, Some(request));
    assert_eq!(
        pt008.fixes[0].kind,
        FixKind::AllocConf {
            value: "expandable_segments:True".into()
        }
    );
    assert_eq!(at(pt008), at(&f[1]), "both at the failed request's line");
}

/// The same step on a device too small for what is live: the first request that fails is larger
/// than everything cached plus what the device has left. Not fragmentation, and PT009 says so.
#[test]
fn pt009_not_fragmentation_when_the_live_tensors_fill_a_smaller_device() {
    let Some(snap) = load(FULLSTEP) else {
        return;
    };
    let peak = memlsp::torch::replay::replay_device(&snap, 0).peak_allocated_bytes;
    // The largest device, in steps of 1/16 of the peak, on which the first failing request does
    // not fit in all the free memory there is.
    let (capacity, oom) = (1..16u64)
        .map(|k| peak - peak / 16 * k)
        .find_map(|c| {
            let s = memlsp::torch::replay::state_at_capacity(&snap, 0, c)?;
            let (request, _, inactive, free) = oom_state(&s);
            (request > inactive + free).then_some((c, s))
        })
        .expect("a capacity the live tensors fill");
    assert_consistent(&oom);
    let (request, _, inactive, free) = oom_state(&oom);
    let f = findings(&oom);
    assert!(capacity < peak);
    assert!(!codes(&f).contains(&"PT008"), "{:?}", codes(&f));
    let pt009 = find(&f, Code::PT009);
    assert!(
        pt009.message.starts_with(&format!(
            "Out of memory on device 0: a request of {} with {} free on the device failed at",
            fmt_bytes(request),
            fmt_bytes(free)
        )),
        "{}",
        pt009.message
    );
    assert!(
        pt009.evidence.iter().any(|e| e.text.starts_with(&format!(
            "not fragmentation: the request of {} exceeds all cached free memory ({}) plus the \
             device's free {}",
            fmt_bytes(request),
            fmt_bytes(inactive),
            fmt_bytes(free)
        ))),
        "{:?}",
        pt009.evidence
    );
    assert_eq!(at(pt009), ("optimizers.py", 84), "{}", pt009.message);
    assert!(
        pt009.fixes[0].title.starts_with("Reduce live memory"),
        "{:?}",
        pt009.fixes
    );
}

/// cranberrii's capture, replayed on smaller and smaller devices (steps of 1/64 of its peak of
/// live memory): the first device on which the failing request is a small-pool one (≤ 1 MiB,
/// served from 2 MiB segments). The cache holds pieces of the large pool that such a request
/// cannot use, and the device has no 2 MiB left: fragmentation across pools, PT008.
#[test]
fn pt008_when_a_small_request_finds_only_large_pool_pieces() {
    let Some(snap) = load("cranberrii__memory_snapshot.pickle") else {
        return;
    };
    let peak = memlsp::torch::replay::replay_device(&snap, 0).peak_allocated_bytes;
    let oom = (1..64u64)
        .map(|k| peak - peak / 64 * k)
        .find_map(|c| {
            let s = memlsp::torch::replay::state_at_capacity(&snap, 0, c)?;
            (oom_state(&s).0 <= 1 << 20).then_some(s)
        })
        .expect("a small request that fails");
    assert_consistent(&oom);
    let (request, largest_any, inactive, free) = oom_state(&oom);
    let small_largest = oom
        .segments
        .iter()
        .filter(|s| s.segment_type.as_deref() == Some("small"))
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == memlsp::torch::model::BlockState::Inactive)
        .map(|b| b.size)
        .max()
        .unwrap_or(0);
    assert!(
        small_largest < request && request < largest_any && free < 2 << 20,
        "{request} {small_largest} {largest_any} {free}"
    );
    let f = findings(&oom);
    assert_eq!(&codes(&f)[..2], &["PT008", "PT009"], "{:?}", codes(&f));
    let pt008 = &f[0];
    assert!(
        pt008.message.starts_with(&format!(
            "Fragmentation caused the OOM on device 0: {} requested, but the largest inactive \
             block is {} while {} sit inactive",
            fmt_bytes(request),
            fmt_bytes(small_largest),
            fmt_bytes(inactive)
        )),
        "{}",
        pt008.message
    );
    assert!(
        pt008.evidence.iter().any(|e| e.text.ends_with(&format!(
            "a larger inactive block ({}) belongs to the other pool or another stream, which \
             this request cannot use",
            fmt_bytes(largest_any)
        ))),
        "{:?}",
        pt008.evidence
    );
    // A notebook cell's line (ipykernel names cells by a hash).
    assert_eq!(at(pt008), ("3105878423.py", 21), "{}", pt008.message);
}
