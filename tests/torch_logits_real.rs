//! PT019 (logits and loss over a large vocabulary) on a real trace whose vocabulary is made
//! larger the way a larger vocabulary changes the capture.
//!
//! MAGMA27 trains a cs336 Transformer (d_model 768, vocabulary 10,000, B×T = 8192 tokens). Read
//! by hand, its device-0 trace around the peak (entry #1402) is:
//!   #1393 alloc 312.5 MiB  model.py:39 einsum ← model.py:257 (the LM head)   = the fp32 logits
//!   #1398 alloc 312.5 MiB  nn_utils.py:12 log_softmax ← nn_utils.py:17 cross_entropy
//!   #1399 alloc 312.5 MiB  nn_utils.py:13 log_softmax ← nn_utils.py:17 cross_entropy
//!   #1402 alloc 312.5 MiB  nn_utils.py:13 log_softmax ← nn_utils.py:17 cross_entropy  ← peak
//! every one called from benchmarking_script.py:69 (`<module>`). 312.5 MiB = 8192 × 10,000 × 4 B.
//! The line an expert names is **benchmarking_script.py:69**: the user's `cross_entropy(logits,
//! …)` call over the full B×T×V logits, where the loss is chunked; nn_utils.py:12/13 are lines
//! inside the user's own `log_softmax` (the message's stack shows how it gets there).
//! The four blocks are 1.22 GiB of the 12.97 GiB peak (9.4 %): below PT019's 10 %, no finding.
//!
//! The rewrite (CPython, the pickle is only loaded by the trusted interpreter of the test) makes
//! the vocabulary 5× larger (50,000, about GPT-2's 50,257): every trace entry of the B×T×V size S
//! (the logits, the log-softmax copies, the backward's gradients of them, 33 entries) becomes
//! 5·S, and the six segments that were made for S blocks (S rounded up to 2 MiB) grow by 4·S
//! with their blocks (the live logits block among them), moved above every other segment so
//! that nothing overlaps; the trace's addresses inside them move with them. The V×d embedding
//! and head weights (29.3 MiB) are left as recorded. The expected numbers are computed by
//! Python from the rewritten trace, independently of memlsp.

mod common;

use std::path::Path;

const MAGMA: &str = "torch_snapshots/real/MAGMA27__memory_snapshot.pickle";
const K: u64 = 5;

fn json(file: &Path) -> serde_json::Value {
    let r = common::memlsp(
        &["report", common::arg(file), "--format", "json"],
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    r.json()
}

/// Rewrites `src` into `out` with the vocabulary `k`× larger (see the module comment); prints
/// S, the trace-relative peak index of the rewritten trace, and the blocks of size k·S live
/// after it, split into the loss's (a `log_softmax`/`cross_entropy` frame on the stack) and
/// the others, with the first user line of the loss's first block.
const REWRITE: &str = r#"
import json, pickle, sys
src, out, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(src, "rb") as f:
    snap = pickle.load(f)
trace = snap["device_traces"][0]
LOSS = ("log_softmax", "cross_entropy")
S = max(e["size"] for e in trace if e["action"] == "alloc"
        and any(fr["name"] in LOSS for fr in e["frames"]))
grow = (k - 1) * S
MB2 = 2 << 20
SEG = -(-S // MB2) * MB2
top = max(s["address"] + s["total_size"] for s in snap["segments"])
moved = {}
for s in snap["segments"]:
    if s["total_size"] != SEG:
        continue
    new = -(-top // MB2) * MB2
    old = s["address"]
    moved[old] = new
    top = new + SEG + grow
    s["address"] = new
    s["total_size"] += grow
    for b in s["blocks"]:
        off = b["address"] - old
        b["address"] = new + off + (grow if off >= S else 0)
        if b["size"] == S:
            b["size"] = k * S
            b["requested_size"] = k * S
            if b["state"] == "active_allocated":
                for key in ("allocated_size", "active_size", "requested_size"):
                    s[key] += grow
        elif off < S < off + b["size"]:
            b["size"] += grow
def remap(addr):
    for old, new in moved.items():
        if old <= addr < old + SEG:
            off = addr - old
            return new + off + (grow if off >= S else 0)
    return addr
scaled = 0
for e in trace:
    e["addr"] = remap(e["addr"])
    if e["size"] == S:
        e["size"] = k * S
        scaled += 1
with open(out, "wb") as f:
    pickle.dump(snap, f, protocol=4)
live, cur, peak, at = {}, 0, -1, -1
for i, e in enumerate(trace):
    if e["action"] == "alloc":
        live[e["addr"]] = i
        cur += e["size"]
    elif e["action"] == "free_completed" and e["addr"] in live:
        cur -= trace[live.pop(e["addr"])]["size"]
    if cur > peak:
        peak, at = cur, i
live = {}
for i, e in enumerate(trace[: at + 1]):
    if e["action"] == "alloc":
        live[e["addr"]] = i
    elif e["action"] == "free_completed":
        live.pop(e["addr"], None)
seen, before = set(), []
for i, e in enumerate(trace):
    if e["action"] == "alloc":
        seen.add(e["addr"])
    elif e["action"] == "free_completed":
        if e["addr"] not in seen and e["size"] == k * S:
            before.append(i)
        seen.discard(e["addr"])
big = sorted(i for i in live.values() if trace[i]["size"] == k * S)
loss = [i for i in big if any(fr["name"] in LOSS for fr in trace[i]["frames"])]
other = [i for i in big if i not in loss]
caller = [fr for fr in trace[loss[0]]["frames"] if fr["name"] not in LOSS][0]
print(json.dumps({"S": S, "scaled": scaled, "before": before, "peak_index": at, "loss": loss, "other": other,
                  "file": caller["filename"], "line": caller["line"]}))
"#;

fn pt019(doc: &serde_json::Value) -> Vec<&serde_json::Value> {
    doc["captures"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "PT019")
        .collect()
}

#[test]
fn a_five_times_larger_vocabulary_fires_pt019_at_the_loss_call() {
    let Some(src) = common::shared(MAGMA) else {
        return;
    };
    // As recorded: 1.22 of 12.97 GiB (9.4 %), no PT019.
    let orig = json(&src);
    assert!(pt019(&orig).is_empty(), "the real file must not fire PT019");
    let orig_live = &orig["captures"][0]["torch"]["timeline"][0]["live_bytes_reconstructed"];
    let orig_peak = orig_live["peak"].as_u64().unwrap();
    assert_eq!(
        orig_live["peak_index"], 1402,
        "the loss's peak, read by hand"
    );
    let s_orig = 327_680_000u64; // 8192 × 10,000 × 4 B
    assert!(
        4 * s_orig * 100 < orig_peak * 10,
        "four B×T×V blocks under 10 %"
    );

    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("magma27_vocab50k.pickle");
    let py = common::python(
        REWRITE,
        &[common::arg(&src), common::arg(&out), &K.to_string()],
    );
    let want: serde_json::Value = serde_json::from_slice(&py).unwrap();
    let s = want["S"].as_u64().unwrap();
    assert_eq!(s, s_orig);
    assert_eq!(
        want["scaled"], 33,
        "11 B×T×V tensors × alloc/free_requested/free_completed"
    );
    let n = |k: &str| want[k].as_array().unwrap().len() as u64;
    // Read by hand: the log-softmax copies #1398, #1399, #1402 and the logits #1393.
    assert_eq!(want["loss"], serde_json::json!([1398, 1399, 1402]));
    assert_eq!(want["other"], serde_json::json!([1393]));
    assert_eq!(want["peak_index"], 1402);
    assert!(
        want["file"]
            .as_str()
            .unwrap()
            .ends_with("benchmarking_script.py")
    );
    assert_eq!(want["line"], 69);

    let doc = json(&out);
    // The rewrite keeps the capture consistent: the state before the trace grows by the one
    // B×T×V block alive then (the previous step's logits, freed at #1394 when
    // benchmarking_script.py:65 rebinds them), and the peak by exactly the four blocks' growth,
    // at the same entry.
    assert_eq!(want["before"], serde_json::json!([1395]));
    let live = &doc["captures"][0]["torch"]["timeline"][0]["live_bytes_reconstructed"];
    assert_eq!(
        live["start"].as_u64().unwrap(),
        orig_live["start"].as_u64().unwrap() + (K - 1) * s
    );
    assert_eq!(live["peak_index"], 1402);
    let peak = live["peak"].as_u64().unwrap();
    assert_eq!(peak, orig_peak + (K - 1) * s * (n("loss") + n("other")));

    let found = pt019(&doc);
    assert_eq!(found.len(), 1, "one PT019");
    let f = found[0];
    assert_eq!(f["severity"], "warning");
    // The loss call, not a line inside the hand-written log_softmax.
    assert_eq!(f["file"], want["file"]);
    assert_eq!(f["line"], 69);
    assert_eq!(f["function"], "<module>");
    let bytes = K * s * (n("loss") + n("other"));
    assert_eq!(f["bytes"].as_u64(), Some(bytes)); // 6.10 GiB
    assert_eq!(f["bytes_label"], "measured");
    // The share is of the bytes live at the peak entry (the peak set: 508 B under the
    // reconstructed running peak).
    let at_peak = &doc["captures"][0]["torch"]["timeline"][0]["peak_live"];
    assert_eq!(at_peak["index"], 1403);
    let set = at_peak["live_bytes"].as_u64().unwrap();
    assert!(set <= peak && peak - set < 1024, "{set} vs {peak}");
    let pct = f["percent"].as_f64().unwrap();
    assert!(
        (pct - 100.0 * bytes as f64 / set as f64).abs() < 1e-9,
        "{pct}"
    );
    assert!(
        f["message"].as_str().unwrap().starts_with(
            "The loss over the vocabulary holds 6.10 GiB of the 17.85 GiB live at the peak (34.2%)"
        ),
        "{}",
        f["message"]
    );
    let ev: Vec<(&str, &str)> = f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["label"].as_str().unwrap(), e["text"].as_str().unwrap()))
        .collect();
    assert_eq!(
        ev[0],
        (
            "measured",
            "at the trace peak (before entry #1403 of device 0): 17.85 GiB live"
        )
    );
    assert_eq!(ev[1].0, "measured");
    assert!(
        ev[1]
            .1
            .starts_with("3 blocks (4.58 GiB) live at the peak were made by the loss")
            && ev[1].1.ends_with("the largest is 1.53 GiB"),
        "{}",
        ev[1].1
    );
    assert_eq!(
        ev[2],
        (
            "measured",
            "1 more blocks (1.53 GiB) of the same size were made elsewhere just before the loss"
        )
    );
    assert!(ev[3..].iter().all(|e| e.0 == "inferred"), "{ev:?}");
    // The saving is the loss's copies only (a bound, not replayed).
    assert_eq!(
        f["fixes"][0]["saving_bytes"].as_u64(),
        Some(K * s * n("loss"))
    );
}
