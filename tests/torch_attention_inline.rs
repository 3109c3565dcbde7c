//! PT018 on an eager attention written inline in a module's `forward` of a transformers modeling
//! file, on the real `Maphsge4__ec5be110` trace: Llama inference with a vendored
//! `lib/transformers/models/llama/modeling_llama.py`, whose peak (entry 5317, 19.37 GiB) holds
//! the 1 GiB `q @ k^T` scores and their scaled copy (line 330 of `LlamaAttention.forward`,
//! called from line 408), the softmax (line 346) a few entries later.
//!
//! The same trace with transformers installed instead (its frames moved under `site-packages`,
//! as an installed package records them) must give the same group, pinned to the user's line
//! that runs the decoder layers, with the fix to load the model with SDPA.
//!
//! The device refused memory 39 times and no OOM is recorded: its capacity lies between what it
//! granted and the least it refused (20.97 to 21.01 GiB), and the fix is replayed at both ends.

mod common;

use memlsp::findings::{Code, FixKind};
use memlsp::options::{AnalysisOptions, DecodeOptions};
use memlsp::torch::load::load_snapshot;

const GIB: u64 = 1 << 30;

#[test]
fn an_eager_attention_in_a_vendored_or_installed_modeling_file_is_found() {
    let Some(dir) = common::shared("torch_snapshots") else {
        return;
    };
    let path = dir.join("real/Maphsge4__ec5be110_snapshot.pickle");
    let mut snap = load_snapshot(&path, &DecodeOptions::default()).expect("the real snapshot");

    let a = memlsp::torch::analyse(&snap, &AnalysisOptions::default());
    let g = a.attention.as_ref().expect("the attention group");
    assert!(g.module_forward);
    assert_eq!((g.blocks, g.bytes), (2, 2 * GIB));
    assert!(
        g.file
            .ends_with("lib/transformers/models/llama/modeling_llama.py")
    );
    let f = a
        .findings
        .iter()
        .find(|f| f.code == Code::PT018)
        .expect("PT018");
    let loc = f.location.as_ref().expect("a location");
    assert!(
        loc.file.ends_with("modeling_llama.py") && loc.line == 408,
        "{loc:?}"
    );
    assert!(
        f.fixes[0]
            .title
            .starts_with("Compute the attention in `forward`")
    );
    // The device refused memory 39 times (cached segments released, the request retried) and
    // no OOM is recorded: a replay of the requests with no capacity never releases them and
    // ends 8 GB above the recorded reserved peak. Between the highest reserved it granted
    // (20.97 GiB) and the least it refused (21.01 GiB), the unchanged requests replay as
    // recorded, so the fix is replayed at both ends: the peak moves to the logits, 496 MiB
    // lower (worth no warning: a tenth of the peak would be 1.94 GiB). Reserved, bounded by
    // the capacity, stays put (a little higher at the top of the range: fewer releases).
    let sim = f.fixes[0].simulated.as_ref().expect("simulated");
    assert_eq!(
        (sim.peak_allocated_before, sim.peak_allocated_after),
        (20_802_387_456, 20_282_293_760)
    );
    assert_eq!(
        (sim.peak_reserved_before, sim.peak_reserved_after),
        (22_519_218_176, 22_544_384_000)
    );
    assert_eq!(f.fixes[0].saving_bytes, Some(496 << 20));
    // The 39 refusals were a layer loaded at select_n.py:140 that no cached block could serve;
    // with the scores never made, the peak drops and the cache refills less often: 20 at the end
    // of the capacity range where most remain.
    assert_eq!(
        sim.oom_retries,
        Some(memlsp::findings::OomRetries {
            before: 39,
            after: 20
        })
    );
    // Inference: no graph kept the scores, so no backward makes their gradients.
    assert!(!sim.change.contains("backward"), "{}", sim.change);
    assert_eq!(f.severity, memlsp::findings::Severity::Information);
    let replay = a.replays.capture(&snap);
    assert!(replay.validated && replay.fixes_replayed);
    assert_eq!(
        replay.devices[0].capacity_read,
        Some((22_519_218_176, 22_556_966_911))
    );
    // Inference: each layer's scores are freed by its own lines, not kept for a backward.
    let texts: Vec<&str> = f.evidence.iter().map(|e| e.text.as_str()).collect();
    assert!(
        texts.contains(
            &"freed after the peak by Python lines, none by autograd (their free stacks): 2 of 2 \
              block(s), the running call's temporaries"
        ),
        "{texts:?}"
    );
    assert!(!texts.iter().any(|t| t.contains("backward")), "{texts:?}");
    assert!(
        !texts
            .iter()
            .any(|t| t.contains("without the allocator replay")),
        "{texts:?}"
    );

    // Installed instead of vendored: the modeling file is library code.
    for fr in &mut snap.frames {
        if let Some(rest) = fr
            .filename
            .strip_prefix("/mnt/mcx/select_n/lib/transformers/")
        {
            fr.filename = format!("/opt/conda/lib/python3.10/site-packages/transformers/{rest}");
        }
    }
    let a = memlsp::torch::analyse(&snap, &AnalysisOptions::default());
    let g = a
        .attention
        .as_ref()
        .expect("the attention group, installed");
    assert!(g.module_forward);
    assert_eq!((g.blocks, g.bytes), (2, 2 * GIB));
    assert!(g.file.contains("/site-packages/transformers/models/llama/"));
    let f = a
        .findings
        .iter()
        .find(|f| f.code == Code::PT018)
        .expect("PT018, installed");
    // The first user frame under the attention: the user's loop over the decoder layers.
    let loc = f.location.as_ref().expect("a location");
    assert!(
        loc.file.ends_with("/select_n/lib/select_n.py") && loc.line == 115,
        "{loc:?}"
    );
    assert_eq!(f.fixes[0].kind, FixKind::Advice);
    assert!(
        f.fixes[0]
            .title
            .starts_with("Load the transformers model with `attn_implementation=\"sdpa\"`"),
        "{}",
        f.fixes[0].title
    );
}

/// PT018 of a capture under `../shared/torch_snapshots` (`None`: not there, on a local run).
fn pt018_of(name: &str) -> Option<memlsp::findings::Finding> {
    let dir = common::shared("torch_snapshots")?;
    let snap =
        load_snapshot(&dir.join(name), &DecodeOptions::default()).expect("the real snapshot");
    let a = memlsp::torch::analyse(&snap, &AnalysisOptions::default());
    Some(
        a.findings
            .into_iter()
            .find(|f| f.code == Code::PT018)
            .expect("PT018"),
    )
}

/// A training forward's scores (`Wedsonlin__results_medium_1024_training`): the 47 score-sized
/// blocks live at the peak are freed by autograd in the backward (their free stacks), so they
/// were kept for it.
#[test]
fn a_training_attentions_scores_are_freed_by_autograd() {
    let Some(f) = pt018_of("real/Wedsonlin__results_medium_1024_training_memory_snapshot.pickle")
    else {
        return;
    };
    let texts: Vec<&str> = f.evidence.iter().map(|e| e.text.as_str()).collect();
    assert!(
        texts.contains(
            &"freed after the peak by autograd (a graph released, or inside backward; their free \
              stacks): 47 of 47 block(s)"
        ),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.ends_with("kept for the backward of each layer")),
        "{texts:?}"
    );
}

/// A forward-only benchmark (`bolongcheng__0df6e0e9 … xl_fwd_cl512`): the 64 score-sized
/// blocks live at the peak are freed when the graph is released because the output was dropped
/// (`SavedVariable::reset_data` on their free stacks), and no free of the trace goes through the
/// autograd engine. The scores were kept for a backward that never ran, so the fused-attention
/// replay has no score gradients to keep as recorded: its peak is not an upper bound.
#[test]
fn a_forward_only_attentions_scores_are_kept_for_a_backward_that_never_ran() {
    let Some(f) = pt018_of(
        "real/bolongcheng__0df6e0e9_memory_snapshot_xl_fwd_cl512_dtypetorch.float32.pickle",
    ) else {
        return;
    };
    let texts: Vec<&str> = f.evidence.iter().map(|e| e.text.as_str()).collect();
    assert!(
        texts.contains(
            &"freed after the peak when their graph was released without a backward (its output \
              dropped; their free stacks): 64 of 64 block(s)"
        ),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.ends_with("kept by the graph for a backward that never ran")),
        "{texts:?}"
    );
    let sim = f.fixes[0]
        .simulated
        .as_ref()
        .expect("the fused attention is replayed");
    assert!(!sim.change.contains("backward"), "{}", sim.change);
    assert_eq!(
        (sim.peak_allocated_before - sim.peak_allocated_after) >> 30,
        8,
        "the 8 GiB of scores at the peak go"
    );
}
