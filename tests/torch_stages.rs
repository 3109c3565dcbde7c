//! Stages on the real snapshots: the `external_annotations` START/END spans 12 of the 39 shared
//! snapshots recorded (`Optimizer.step#…`, `Optimizer.zero_grad#…`, `enumerate(DataLoader)#…`,
//! compiled-graph calls, `dynamo_timed` spans) and the stages inferred where none covers the
//! trace — in JSON (`captures[].torch.stages`), text, the headline and the page's bands.

mod common;

use std::path::Path;

use serde_json::Value;

fn real(name: &str) -> Option<std::path::PathBuf> {
    common::shared(&format!("torch_snapshots/real/{name}"))
}

fn report(path: &Path, format: &str) -> common::Run {
    let r = common::memlsp(
        &["report", common::arg(path), "--format", format],
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    r
}

fn stages(doc: &Value) -> Vec<Value> {
    doc["captures"][0]["torch"]["stages"]
        .as_array()
        .expect("captures[].torch.stages")
        .clone()
}

const NIU: &str = "NiuHuangxiaozi__16edf316_forward_and_backward_memory_snapshot_150.pickle";

/// Three training steps, each `Optimizer.zero_grad#NIUAdam.zero_grad` then, after the forward
/// and backward (not annotated), `Optimizer.step#NIUAdam.step`: six recorded spans, placed on
/// the trace by time, the gaps inferred, the peak in the second step's backward.
#[test]
fn niu_recorded_steps_and_the_peak_in_step_two() {
    let Some(p) = real(NIU) else { return };
    let doc = report(&p, "json").json();
    let st = stages(&doc);
    let recorded: Vec<&Value> = st.iter().filter(|s| s["source"] == "recorded").collect();
    let names: Vec<(&str, u64)> = recorded
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["step"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        names,
        vec![
            ("Optimizer.zero_grad#NIUAdam.zero_grad", 1),
            ("Optimizer.step#NIUAdam.step", 1),
            ("Optimizer.zero_grad#NIUAdam.zero_grad", 2),
            ("Optimizer.step#NIUAdam.step", 2),
            ("Optimizer.zero_grad#NIUAdam.zero_grad", 3),
            ("Optimizer.step#NIUAdam.step", 3),
        ]
    );
    // The last step's span ends where the trace ends (its END is the last event).
    let last = recorded.last().unwrap();
    assert_eq!(last["label"], "read");
    assert_eq!(last["span"]["end_index"], 11477);
    assert_eq!(last["span"]["start_us"], 1762924144708341i64);
    assert_eq!(last["span"]["end_us"], 1762924144720093i64);
    // An optimizer step of a model already in memory neither grows nor shrinks live memory.
    assert_eq!(last["growth_bytes"], 0);
    for s in &st {
        assert!(s["peak_bytes"].as_i64() >= s["start_bytes"].as_i64(), "{s}");
        assert!(s["peak_bytes"].as_i64() >= s["end_bytes"].as_i64(), "{s}");
    }
    let peak: Vec<&Value> = st
        .iter()
        .filter(|s| s["holds_device_peak"] == true)
        .collect();
    assert_eq!(peak.len(), 1);
    assert_eq!(
        (&peak[0]["name"], &peak[0]["source"], &peak[0]["step"]),
        (&"backward".into(), &"inferred".into(), &2.into())
    );
    // The stage's peak is the device's reconstructed peak (timeline).
    let t = &doc["captures"][0]["torch"]["timeline"][0]["live_bytes_reconstructed"];
    assert_eq!(peak[0]["peak_bytes"], t["peak"]);
    let pi = peak[0]["peak_index"].as_u64().unwrap();
    assert_eq!(Some(pi), t["peak_index"].as_u64());
    let head = doc["captures"][0]["headline"].as_str().unwrap();
    assert!(
        head.ends_with("; peak in the backward of step 2 (inferred)"),
        "{head}"
    );
    let text = report(&p, "text").stdout;
    assert!(
        text.contains("`Optimizer.step#NIUAdam.step` [read]  entries 6053..7691"),
        "{text}"
    );
    assert!(text.contains("► step 2   backward [inferred]"), "{text}");
}

/// Two devices' worth of a DataLoader fetch and a `zero_grad`, both between the same two trace
/// entries: recorded spans that hold no entry are kept (name, span and the bytes at that point),
/// and the devices without annotations get inferred stages.
#[test]
fn constructor_sun_recorded_spans_without_entries_and_inferred_devices() {
    let Some(p) = real("Constructor-Sun__memory_snapshot.pickle") else {
        return;
    };
    let doc = report(&p, "json").json();
    let st = stages(&doc);
    let recorded: Vec<&Value> = st.iter().filter(|s| s["source"] == "recorded").collect();
    assert_eq!(recorded.len(), 2, "{recorded:#?}");
    assert_eq!(
        recorded[0]["name"],
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    );
    assert_eq!(recorded[1]["name"], "Optimizer.zero_grad#AdamW.zero_grad");
    for r in &recorded {
        assert_eq!(
            (
                r["span"]["start_index"].as_u64(),
                r["span"]["end_index"].as_u64()
            ),
            (Some(428), Some(428))
        );
        assert_eq!(r["peak_bytes"], r["start_bytes"]);
        assert_eq!(r["device"], 0);
    }
    for d in [1, 2] {
        assert!(
            st.iter()
                .any(|s| s["device"] == d && s["source"] == "inferred"),
            "device {d} gets inferred stages"
        );
    }
    // Each traced device has its peak in one stage.
    assert_eq!(
        st.iter().filter(|s| s["holds_device_peak"] == true).count(),
        3
    );
}

/// A snapshot without annotations: only inferred stages, labelled so, and no stage in the
/// headline (which names only what a snapshot recorded).
#[test]
fn a_snapshot_without_annotations_gets_inferred_stages() {
    let Some(p) = real("HugePandaCoder__1e496ac8_my_snapshot.pickle") else {
        return;
    };
    let doc = report(&p, "json").json();
    let st = stages(&doc);
    assert!(!st.is_empty());
    assert!(
        st.iter()
            .all(|s| s["source"] == "inferred" && s["label"] == "inferred")
    );
    assert_eq!(doc["captures"][0]["torch"]["annotations_recorded"], false);
    assert!(
        !doc["captures"][0]["headline"]
            .as_str()
            .unwrap()
            .contains("peak in")
    );
    let text = report(&p, "text").stdout;
    assert!(
        text.contains("no external_annotations recorded: inferred from the trace"),
        "{text}"
    );
}

/// The recorded AdamW step that holds the peak of a full training step.
#[test]
fn kkaitlyn_peak_in_the_recorded_optimizer_step() {
    let Some(p) = real("kkaitlyn111__memory_ctx128_fullstep.pickle") else {
        return;
    };
    let doc = report(&p, "json").json();
    let head = doc["captures"][0]["headline"].as_str().unwrap();
    assert!(
        head.contains("peak in `Optimizer.step#AdamW.step` of step 1"),
        "{head}"
    );
}

/// 867 `pad_mm_benchmark (dynamo_timed)` spans between the same two entries are listed once.
#[test]
fn repeated_empty_compile_spans_fold_into_one() {
    let Some(p) = real("kkaitlyn111__memory_ctx256_forward.pickle") else {
        return;
    };
    let st = stages(&report(&p, "json").json());
    let pad: Vec<&Value> = st
        .iter()
        .filter(|s| s["name"] == "pad_mm_benchmark (dynamo_timed)")
        .collect();
    assert_eq!(pad.len(), 1);
    assert_eq!(pad[0]["repeats"], 867);
}

/// The page draws the bands: each device's outermost stages with entries, in trace order.
#[test]
fn the_page_carries_stage_bands() {
    let Some(p) = real(NIU) else { return };
    let html = report(&p, "html").stdout;
    let start = html
        .find(r#"<script id="memlsp-data" type="application/json">"#)
        .unwrap()
        + r#"<script id="memlsp-data" type="application/json">"#.len();
    let end = start + html[start..].find("</script>").unwrap();
    let data: Value = serde_json::from_str(&html[start..end].replace("<\\/", "</")).unwrap();
    let bands = data["captures"][0]["torch"]["devices"][0]["stages"]
        .as_array()
        .unwrap();
    let step = bands
        .iter()
        .find(|b| b[2] == "Optimizer.step#NIUAdam.step")
        .unwrap();
    assert_eq!(
        (&step[0], &step[1], &step[3]),
        (&2264.into(), &3904.into(), &"read".into())
    );
    assert!(bands.iter().any(|b| b[5] == true && b[2] == "backward"));
    // The page script draws them (the bands of each device, from its `stages`).
    assert!(html.contains("(dev.stages || []).map(st =>"));
}

/// An SGD run with no optimizer step recorded: its `zero_grad` calls number the steps.
#[test]
fn zero_grad_numbers_the_steps_without_an_optimizer_step() {
    let Some(p) = real("ZidongLiu__2f29ac4e_memory.pickle") else {
        return;
    };
    let st = stages(&report(&p, "json").json());
    let zg: Vec<u64> = st
        .iter()
        .filter(|s| s["name"] == "Optimizer.zero_grad#SGD.zero_grad")
        .map(|s| s["step"].as_u64().unwrap())
        .collect();
    assert_eq!(zg, vec![1, 2]);
    assert_eq!(st.last().unwrap()["step"], 2);
}

/// The inferred stages of one device: `(name, start_index, end_index)`.
fn inferred(st: &[Value]) -> Vec<(String, u64, u64)> {
    st.iter()
        .filter(|s| s["source"] == "inferred")
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["span"]["start_index"].as_u64().unwrap(),
                s["span"]["end_index"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// A bf16 forward-only benchmark: the frees after its peak are the autocast weight cache that
/// autocast's `__exit__` cleared (85 of the 90 frees, 230 of 243 MiB, `clear_autocast_cache` on
/// their stacks; PT016), and no free anywhere carries autograd's engine: no backward ran, and
/// the stage after the forward is named for what released it.
#[test]
fn a_forward_only_run_gets_no_backward_stage_autocast_exit_is_named() {
    let Some(p) = real("silmont2000__memory_forward_bf16_128.pickle") else {
        return;
    };
    let doc = report(&p, "json").json();
    assert_eq!(doc["captures"][0]["torch"]["releases"]["graph"], "none");
    assert_eq!(
        inferred(&stages(&doc)),
        vec![
            ("forward".to_string(), 0, 2631),
            ("autocast cache clear".to_string(), 2631, 2811),
        ]
    );
    let text = report(&p, "text").stdout;
    assert!(
        text.contains("step 1   autocast cache clear [inferred]  entries 2631..2811"),
        "{text}"
    );
    assert!(!text.contains("backward [inferred]"), "{text}");
}

/// A grad-enabled forward whose output is dropped without backward (bolongcheng: 708 frees
/// through `SavedVariable::reset_data` / `deleteNode`, none on the engine's thread): the graph
/// is released by the dropping line, not by a backward pass.
#[test]
fn a_graph_dropped_without_backward_is_not_a_backward_stage() {
    let Some(p) =
        real("bolongcheng__0df6e0e9_memory_snapshot_xl_fwd_cl512_dtypetorch.float32.pickle")
    else {
        return;
    };
    let doc = report(&p, "json").json();
    assert_eq!(
        doc["captures"][0]["torch"]["releases"]["graph"],
        "dropped_without_backward"
    );
    assert_eq!(
        inferred(&stages(&doc)),
        vec![
            ("forward".to_string(), 0, 3694),
            ("graph dropped".to_string(), 3694, 5112),
        ]
    );
}

/// A real training step keeps its backward: sidsoc12's frees after the forward are autograd's
/// engine releasing saved tensors and gradient temporaries, then the recorded AdamW step and
/// `zero_grad` follow.
#[test]
fn a_training_step_keeps_its_backward_stage() {
    let Some(p) = real("sidsoc12__8169e1e6_mem_snapshot_ctx128_fp32_train.pickle") else {
        return;
    };
    let doc = report(&p, "json").json();
    assert_eq!(doc["captures"][0]["torch"]["releases"]["graph"], "backward");
    assert_eq!(
        inferred(&stages(&doc)),
        vec![
            ("forward".to_string(), 0, 5699),
            ("backward".to_string(), 5699, 15452),
        ]
    );
}
