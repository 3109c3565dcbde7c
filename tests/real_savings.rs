//! Savings that a fix reaches (issue 25, items 3 and 5), on the real snapshots: every
//! `[simulated]` figure replays the fix as the user writes it — per-layer checkpointing over
//! the layer calls the trace repeats, `inference_mode` for a forward with no backward — and is
//! never below what that fix reaches; a bound is said as "at most" and labelled inferred; a
//! finding shows one after-number; the headline is the finding whose fix saves the most.
//!
//! What each trace holds was read from the pickles before writing the assertions (Python's
//! `pickle`, the `device_traces` entries and their frames); the expectations are in the
//! comments.

mod common;

use memlsp::findings::{Code, Finding, FixKind, Label, Severity, finding_saving, lead};
use memlsp::options::Options;
use memlsp::report::CaptureReport;

const GIB: u64 = 1 << 30;

fn report(rel: &str) -> Option<CaptureReport> {
    let path = common::shared(&format!("torch_snapshots/{rel}"))?;
    Some(memlsp::analyze::run_file(&path, &Options::default()).unwrap())
}

fn pt005(r: &CaptureReport) -> Option<&Finding> {
    r.findings.iter().find(|f| f.code == Code::PT005)
}

/// Every number the finding states about its fix is the replay's: the saving is peak before −
/// after (no inferred estimate shown beside it), and no "at most" bound is left.
fn one_after_number(f: &Finding) {
    for x in &f.fixes {
        let Some(s) = &x.simulated else { continue };
        // The replay is the saving: no inferred estimate beside it.
        assert_eq!(x.saving_bytes, None, "{}", x.title);
        assert_eq!(
            memlsp::findings::fix_saving(x),
            Some(s.peak_allocated_before - s.peak_allocated_after)
        );
        assert!(!x.title.contains("at most"), "{}", x.title);
    }
    if f.fixes.iter().any(|x| x.simulated.is_some()) {
        assert!(
            f.evidence.iter().all(|e| !e.text.contains("saves at most")),
            "{:?}",
            f.evidence
        );
    }
}

#[test]
fn constructor_sun_checkpointing_replays_six_update_nodes_calls_and_keeps_one_call_live() {
    // Device 1 of this DataParallel GNN ran out of memory at entry #421 asking for 4.94 GiB.
    // The trace shows `update_nodes` (models.py:174–195) called from models.py:231 six times:
    // entries 156, 190, 217, 245, 382 and 410 (the sixth cut short by the OOM). Each complete
    // call keeps 174 (4.94 GiB), 176 (1.24), linear at 176 (1.24), relu at 181 (4.94), 194
    // (0.62) and relu at 195 (0.12, the node state it returns) for a backward; 178, 186 and the
    // scatter at 189 are freed when it returns. The graph is released after the OOM (frees
    // with SavedVariable::reset_data, no engine frame): no backward in the trace.
    // Checkpointing each call keeps only the node state between calls, so the forward's peak is
    // one call's working set: the live bytes inside the first call reach 24.00 GiB (entry 176,
    // counted from the trace), which no per-layer checkpoint goes below. The old simulation
    // (every tensor dropped and re-made one at a time) said 5.32 GiB; the estimate said 4
    // layers.
    let Some(r) = report("real/Constructor-Sun__memory_snapshot.pickle") else {
        return;
    };
    let f = pt005(&r).expect("PT005");
    assert!(
        f.evidence.iter().any(|e| e.label == Label::Inferred
            && e.text.contains("calls models.py:update_nodes 6×")
            && e.text.contains("from models.py:231")),
        "{:?}",
        f.evidence
    );
    let fix = &f.fixes[0];
    assert!(
        fix.title.contains("6 calls of `update_nodes`"),
        "{}",
        fix.title
    );
    let sim = fix.simulated.as_ref().expect("the checkpoint is replayed");
    assert_eq!(sim.device, 1);
    assert_eq!(sim.oom_avoided, Some(true));
    // The recorded run took the OOM path twice: at models.py:178 (entries 413-420: six
    // segments unmapped, 3.79 GiB, then the 4.94 GiB request mapped and served) and at the relu
    // that ended in the OOM (entry 421, told by `oom_avoided`). Checkpointed, one call's working
    // set never reaches the device's edge: the served retry goes too.
    assert_eq!(
        sim.oom_retries,
        Some(memlsp::findings::OomRetries {
            before: 1,
            after: 0
        })
    );
    assert!(
        sim.outcome().ends_with("; OOM-path retries 1 → 0"),
        "{}",
        sim.outcome()
    );
    assert!(
        sim.change.contains("the trace ends at the OOM"),
        "{}",
        sim.change
    );
    let after = sim.peak_allocated_after;
    assert!(
        (24 * GIB - GIB / 100..25 * GIB).contains(&after),
        "peak after {after} B: one update_nodes call holds 24.00 GiB"
    );
    one_after_number(f);
    // The fix that saves the most leads the headline (the OOM is in its message).
    assert_eq!(lead(&r.findings).map(|f| f.code), Some(Code::PT005));
    assert!(
        r.headline().contains("ran out of memory"),
        "{}",
        r.headline()
    );
    assert!(r.headline().contains("[PT005]"), "{}", r.headline());
}

#[test]
fn passes_without_a_graph_get_no_checkpoint_and_no_simulated_figure() {
    // HugePandaCoder 1e496ac8: an eval forward under `decorate_context`, 1129 frees and none
    // releases a graph (C++ frames recorded). MercuryB1: a calibration loop under `no_grad`, no
    // graph frees, 420 segment frees from empty_cache. Nothing holds activations for a
    // backward: no PT005, no checkpoint advice, no simulated figure of any fix.
    for rel in [
        "real/HugePandaCoder__1e496ac8_my_snapshot.pickle",
        "real/MercuryB1__cuda_memory_snapshot.pickle",
    ] {
        let Some(r) = report(rel) else {
            return;
        };
        assert!(pt005(&r).is_none(), "{rel}: {:?}", pt005(&r));
        for f in &r.findings {
            for x in &f.fixes {
                assert!(
                    x.simulated.is_none() && !x.title.contains("checkpoint"),
                    "{rel}: {} {}",
                    f.code,
                    x.title
                );
            }
        }
        assert!(
            r.headline().contains("no problem pattern found"),
            "{rel}: {}",
            r.headline()
        );
    }
}

#[test]
fn cranberrii_counts_the_22_decoder_layers_not_556_blocks() {
    // A notebook fine-tuning a 22-layer Llama (TinyLlama) through accelerate's hooks: every
    // block of the model is allocated from the one notebook line 21, which the old count read
    // as 556 "layers". The decoder layer's forward is called 22 times from
    // modeling_llama.py:968 (the hook `accelerate/hooks.py:new_forward` in between is skipped).
    let Some(r) = report("real/cranberrii__memory_snapshot.pickle") else {
        return;
    };
    let f = pt005(&r).expect("PT005");
    assert!(
        f.evidence
            .iter()
            .any(|e| e.text.contains("22× (from modeling_llama.py:968")),
        "{:?}",
        f.evidence
    );
    let sim = f.fixes[0].simulated.as_ref().expect("replayed");
    // Training: the backward frees 466 graph tensors; each layer is re-made at its backward.
    assert!(sim.peak_allocated_after < sim.peak_allocated_before);
    assert!(!sim.change.contains("ends at the OOM"));
    one_after_number(f);
}

#[test]
fn a_forward_without_backward_replays_inference_mode_or_states_a_bound() {
    // bolongcheng: an xl forward benchmark with grad on, 708 graph frees when
    // benchmark_base.py:115 drops the output, no engine frame. The graph's tensors are freed
    // when their layer call returns under the fix (inference_mode frees them at their last use,
    // which is no later): the replayed peak is at or above what the fix reaches. It cannot go
    // below the live memory the graph did not hold (39.62 − 26.84 = 12.78 GiB).
    let Some(r) =
        report("real/bolongcheng__0df6e0e9_memory_snapshot_xl_fwd_cl512_dtypetorch.float32.pickle")
    else {
        return;
    };
    let f = pt005(&r).expect("PT005");
    let fix = &f.fixes[0];
    assert_eq!(fix.kind, FixKind::InferenceMode);
    let sim = fix.simulated.as_ref().expect("inference_mode replayed");
    assert!(sim.peak_allocated_after >= 12 * GIB + 78 * GIB / 100);
    assert!(sim.peak_allocated_after < sim.peak_allocated_before);
    one_after_number(f);

    // Hyperion-shuo: the same shape, but all 1232 graph frees (4.52 GiB) release blocks
    // allocated before the trace began (the previous iteration's graph, freed when line 101
    // rebinds the output), and the 36 layer calls in the trace leave 1230 activation blocks
    // (4.50 GiB) live at the peak that are never freed in it: this forward's own graph, alive
    // when the trace ends. Two graphs at the peak, so the released one's 4.52 GiB is the least
    // inference_mode saves, not the most; dropping the previous output saves it alone. Nothing
    // in the trace can be replayed as freed earlier: inferred, never simulated.
    let Some(r) =
        report("real/Hyperion-shuo__7fe70b1d_memory_snapshot_large_cl512_fw_with_grad_bf16.pickle")
    else {
        return;
    };
    let f = pt005(&r).expect("PT005");
    let fix = &f.fixes[0];
    assert!(fix.simulated.is_none(), "{:?}", fix.simulated);
    assert!(
        fix.title.contains(
            "saves 4.52 GiB and up to 4.50 GiB more (this forward's activations still alive)"
        ),
        "{}",
        fix.title
    );
    assert!(!fix.title.contains("at most"), "{}", fix.title);
    assert_eq!(f.fixes[1].kind, FixKind::DropOutput);
    assert_eq!(f.fixes[1].saving_bytes, Some(4_852_099_076));
    assert!(
        f.evidence.iter().any(|e| e.label == Label::Inferred
            && e.text.starts_with("two graphs were alive at the peak")),
        "{:?}",
        f.evidence
    );
}

#[test]
fn the_headline_is_the_finding_whose_fix_saves_most_then_the_more_severe() {
    use memlsp::findings::Fix;
    let f = |code, sev, saving: Option<u64>| {
        let mut x = Finding::new(code, sev, format!("{code}"));
        if let Some(b) = saving {
            x = x.fix(Fix::advice("do it").saving(b));
        }
        x
    };
    // Sorted most severe first, as the pipeline hands them over.
    let findings = vec![
        f(Code::PT009, Severity::Error, None),
        f(Code::PT014, Severity::Warning, Some(GIB)),
        f(Code::PT005, Severity::Information, Some(10 * GIB)),
    ];
    assert_eq!(lead(&findings).map(|x| x.code), Some(Code::PT005));
    assert_eq!(finding_saving(&findings[2]), 10 * GIB);
    // No saving anywhere: the most severe leads.
    let findings = vec![
        f(Code::PT009, Severity::Error, None),
        f(Code::PT014, Severity::Warning, None),
    ];
    assert_eq!(lead(&findings).map(|x| x.code), Some(Code::PT009));
    // Equal savings: the more severe.
    let findings = vec![
        f(Code::PT014, Severity::Information, Some(GIB)),
        f(Code::PT005, Severity::Warning, Some(GIB)),
    ];
    assert_eq!(lead(&findings).map(|x| x.code), Some(Code::PT005));
}

#[test]
fn jax_unrolled_remat_layers_are_counted_from_the_repeated_parameters() {
    // f_attention_remat.py: LAYERS = 4, `for p in params: x = x + attention_remat(p, x)` — an
    // unrolled Python loop. The buffers line 31 keeps at the peak do not repeat once per layer
    // (the remat'd values are scheduled apart: 4 reduce_max, 3 backward div, 5 + 1 rematted
    // div), which read as "1 layers"; the parameters do: params[0..3]['wqkv'] f32[256,768] and
    // params[0..3]['wo'] f32[256,256].
    let Some(path) =
        common::shared("jax_cpu_captures/f_attention_remat/f_attention_remat.xplane.pb")
    else {
        return;
    };
    let r = memlsp::analyze::run_file(&path, &Options::default()).unwrap();
    let f = r
        .findings
        .iter()
        .find(|f| f.code == Code::JX002)
        .expect("JX002");
    assert!(
        f.evidence
            .iter()
            .any(|e| e.label == Label::Inferred && e.text.starts_with("4 layers, 160.03 MiB")),
        "{:?}",
        f.evidence
    );
}
