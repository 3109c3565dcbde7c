//! `compile_context` (torch 2.8+ writes it on every trace entry, `"N/A"` outside a
//! `torch.compile` region): bytes live at the peak per region. No shared real file records a
//! region (those with the key say `"N/A"` everywhere), so a real snapshot that has the key is
//! rewritten by CPython the way torch writes the field (a string on each trace entry), with two
//! regions over the entries before the peak; the expected bytes are computed in Python from the
//! same trace, independently of memlsp.

mod common;

use std::path::Path;

const SUN: &str = "torch_snapshots/real/Constructor-Sun__memory_snapshot.pickle";
const NIU: &str =
    "torch_snapshots/real/NiuHuangxiaozi__16edf316_forward_and_backward_memory_snapshot_150.pickle";

fn report(file: &Path, format: &str) -> common::Run {
    let r = common::memlsp(
        &["report", common::arg(file), "--format", format],
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    r
}

/// Rewrites `src` into `out` with `compile_context` "[0/0]" on entries `0..k/2` of device 0
/// and "[1/0]" on `k/2..k` (the rest keep "N/A"); prints the requested bytes live after entry
/// `k − 1` per context as JSON.
const REWRITE: &str = r#"
import json, pickle, sys
src, out, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(src, "rb") as f:
    snap = pickle.load(f)
trace = snap["device_traces"][0]
assert all(e.get("compile_context") == "N/A" for e in trace), "the real file says N/A everywhere"
def ctx(i):
    return "[0/0]" if i < k // 2 else ("[1/0]" if i < k else "N/A")
for i, e in enumerate(trace):
    e["compile_context"] = ctx(i)
live = {}
for i, e in enumerate(trace[:k]):
    if e["action"] == "alloc":
        live[e["addr"]] = (e["size"], i)
    elif e["action"] == "free_completed":
        live.pop(e["addr"], None)
want = {}
for size, i in live.values():
    c = ctx(i)
    b, n = want.get(c, (0, 0))
    want[c] = (b + size, n + 1)
with open(out, "wb") as f:
    pickle.dump(snap, f, protocol=4)
print(json.dumps(want))
"#;

#[test]
fn bytes_at_the_peak_per_compile_context() {
    let Some(src) = common::shared(SUN) else {
        return;
    };
    // The original: the key is recorded, every entry says N/A.
    let doc = report(&src, "json").json();
    let cc = &doc["captures"][0]["torch"]["compile_contexts"];
    assert_eq!(cc["recorded"], true);
    let d = &cc["devices"][0];
    assert_eq!(d["regions"], serde_json::json!([]));
    assert_eq!(d["outside_bytes"], d["traced_bytes"]);
    let k = d["peak_index"].as_u64().unwrap() + 1;
    assert!(k > 10, "peak after entry {k}");

    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sun_compiled.pickle");
    let py = common::python(
        REWRITE,
        &[common::arg(&src), common::arg(&out), &k.to_string()],
    );
    let want: serde_json::Value = serde_json::from_slice(&py).unwrap();

    let doc = report(&out, "json").json();
    let t = &doc["captures"][0]["torch"];
    let d = &t["compile_contexts"]["devices"][0];
    assert_eq!(d["peak_index"].as_u64().unwrap() + 1, k, "same peak");
    let regions = d["regions"].as_array().unwrap();
    let got = |name: &str| {
        regions
            .iter()
            .find(|r| r["compile_context"] == name)
            .map(|r| (r["bytes"].as_u64().unwrap(), r["blocks"].as_u64().unwrap()))
    };
    for name in ["[0/0]", "[1/0]"] {
        let w = &want[name];
        if w.is_null() {
            assert_eq!(got(name), None, "{name}: nothing live at the peak");
            continue;
        }
        let w = (w[0].as_u64().unwrap(), w[1].as_u64().unwrap());
        assert_eq!(got(name), Some(w), "{name}");
    }
    assert!(
        !regions.is_empty(),
        "some live block was allocated inside a region"
    );
    assert_eq!(
        d["outside_bytes"], 0,
        "every traced entry before the peak is in a region"
    );

    let text = report(&out, "text").stdout;
    assert!(
        text.contains("Compile regions (compile_context) at the peak"),
        "{text}"
    );
    let first = &regions[0];
    assert!(
        text.contains(&format!(
            "{:<40}",
            first["compile_context"].as_str().unwrap()
        )),
        "{text}"
    );
    let html = common::memlsp(
        &["report", common::arg(&out), "--format", "html"],
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
    assert!(
        html.stdout.contains("\"compile_context\":\"[0/0]\""),
        "page data"
    );
    assert!(html.stdout.contains("by compile_context"), "page panel");
}

#[test]
fn a_snapshot_without_the_key_says_not_recorded() {
    let Some(p) = common::shared(NIU) else { return };
    let doc = report(&p, "json").json();
    let cc = &doc["captures"][0]["torch"]["compile_contexts"];
    assert_eq!(cc["recorded"], false);
    assert_eq!(cc["devices"], serde_json::json!([]));
    let text = report(&p, "text").stdout;
    assert!(text.contains("Compile regions: not recorded"), "{text}");
}
