//! What a snapshot says about its own recording: the ring buffer's `trace_alloc_overflowed` /
//! `trace_alloc_max_entries` (read where present, the mid-run inference otherwise, labelled) and
//! the pinned host allocator's `host_segments` (shown apart, never in the device totals). No
//! shared real snapshot carries these keys yet (torch 2.14 / 2026), so the snapshots here are
//! written to FORMAT.md's layout; the inference is checked on a real one.

mod common;

use std::path::Path;

fn snapshot(extra: &str) -> String {
    format!(
        r#"{{"segments":[{{"device":0,"address":4096,"total_size":2097152,"allocated_size":1024,
        "active_size":1024,"requested_size":1000,"stream":0,"segment_type":"small",
        "blocks":[{{"address":4096,"size":1024,"requested_size":1000,"state":"active_allocated","frames":[]}},
                  {{"address":5120,"size":2096128,"requested_size":0,"state":"inactive","frames":[]}}]}}],
        "device_traces":[[{{"action":"free_completed","addr":9000,"size":512,"stream":0}},
                          {{"action":"alloc","addr":4096,"size":1000,"stream":0}}]]{extra}}}"#
    )
}

fn report(dir: &Path, name: &str, body: &str, format: &str) -> common::Run {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    let r = common::memlsp(&["report", common::arg(&p), "--format", format], dir);
    assert_eq!(r.code, 0, "{}", r.stderr);
    r
}

#[test]
fn a_recorded_overflow_is_read_and_said() {
    let tmp = tempfile::tempdir().unwrap();
    let body = snapshot(r#","trace_alloc_overflowed":[true],"trace_alloc_max_entries":[100000]"#);
    let doc = report(tmp.path(), "a_snapshot.json", &body, "json").json();
    let s = &doc["captures"][0]["torch"]["trace_start"][0];
    assert_eq!(
        (&s["starts_mid_run"], &s["label"], &s["max_entries"]),
        (&true.into(), &"read".into(), &100000.into())
    );
    let text = report(tmp.path(), "a_snapshot.json", &body, "text").stdout;
    assert!(
        text.contains("device 0: the ring buffer of 100000 entries overflowed: the trace starts mid-run [read]"),
        "{text}"
    );
    // A recorded "did not overflow" overrides the inference from the unmatched free.
    let body = snapshot(r#","trace_alloc_overflowed":{"0":false},"trace_alloc_max_entries":5"#);
    let doc = report(tmp.path(), "b_snapshot.json", &body, "json").json();
    let s = &doc["captures"][0]["torch"]["trace_start"][0];
    assert_eq!(
        (&s["starts_mid_run"], &s["label"]),
        (&false.into(), &"read".into())
    );
    assert_eq!(s["frees_of_older_blocks"], 1);
}

#[test]
fn without_the_keys_the_mid_run_inference_is_labelled() {
    let tmp = tempfile::tempdir().unwrap();
    let text = report(tmp.path(), "c_snapshot.json", &snapshot(""), "text").stdout;
    assert!(
        text.contains("the trace starts mid-run (1 frees of blocks allocated earlier) [inferred]"),
        "{text}"
    );
    // The same on a real snapshot whose trace wrapped or started late (438 unmatched frees).
    let Some(p) = common::shared("torch_snapshots/real") else {
        return;
    };
    let mut any = false;
    for e in std::fs::read_dir(p).unwrap().flatten() {
        let r = common::memlsp(
            &["report", common::arg(&e.path()), "--format", "json"],
            tmp.path(),
        );
        let doc = r.json();
        for s in doc["captures"][0]["torch"]["trace_start"]
            .as_array()
            .unwrap()
        {
            assert_eq!(
                s["label"], "inferred",
                "no real snapshot records the ring buffer yet"
            );
            assert_eq!(
                s["starts_mid_run"],
                s["frees_of_older_blocks"].as_u64() > Some(0)
            );
            any |= s["starts_mid_run"] == true;
        }
    }
    assert!(any);
}

#[test]
fn pinned_host_memory_is_shown_apart_from_the_device() {
    let tmp = tempfile::tempdir().unwrap();
    let body = snapshot(
        r#","host_segments":[{"address":1,"total_size":4194304,"allocated_size":1048576,"blocks":[]},
           {"address":2,"total_size":2097152,"blocks":[{"size":4096,"state":"active_allocated"},{"size":8192,"state":"inactive"}]}],
           "host_traces":[{"action":"alloc","addr":1,"size":1048576}]"#,
    );
    let doc = report(tmp.path(), "h_snapshot.json", &body, "json").json();
    let t = &doc["captures"][0]["torch"];
    assert_eq!(t["host"]["reserved_bytes"], 6291456);
    assert_eq!(t["host"]["allocated_bytes"], 1048576 + 4096);
    assert_eq!(t["host"]["trace_entries"], 1);
    assert_eq!(t["host"]["label"], "read");
    // The device totals are the device's alone.
    assert_eq!(t["totals"]["reserved_bytes"], 2097152);
    assert_eq!(t["totals"]["allocated_bytes"], 1024);
    let text = report(tmp.path(), "h_snapshot.json", &body, "text").stdout;
    assert!(text.contains("Pinned host memory (host_segments, apart from the device totals)"));
    assert!(
        text.contains("reserved 6.00 MiB (6291456 B) [read]"),
        "{text}"
    );
    // Without the keys there is no host value at all.
    let doc = report(tmp.path(), "c_snapshot.json", &snapshot(""), "json").json();
    assert!(doc["captures"][0]["torch"].get("host").is_none());
}
