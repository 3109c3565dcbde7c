//! Every real snapshot in `../shared/torch_snapshots/real/` decodes, and the decoded model agrees
//! with the oracle's raw counts (segments, blocks per state, segment field sums, trace entries,
//! actions). The analyses' numbers are checked separately in `torch_oracle.rs`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use memlsp::options::DecodeOptions;
use memlsp::torch::load::load_snapshot;
use memlsp::torch::model::BlockState;
use serde_json::Value;

#[test]
fn every_real_snapshot_decodes_to_the_oracle_counts() {
    let Some(dir) = common::shared("torch_snapshots") else {
        return;
    };
    let mut files: Vec<_> = std::fs::read_dir(dir.join("real"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 39, "expected the 39 real snapshots");
    for path in files {
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let oracle: Value = serde_json::from_slice(
            &std::fs::read(dir.join("oracle").join(format!("{name}.json"))).unwrap(),
        )
        .unwrap();
        let snap = load_snapshot(&path, &DecodeOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check(&name, &oracle, &snap, &path);
    }
}

fn check(name: &str, o: &Value, s: &memlsp::torch::model::Snapshot, _path: &Path) {
    let mem = &o["memory"]["overall"];
    assert_eq!(
        s.segments.len() as u64,
        mem["segment_count"].as_u64().unwrap(),
        "{name}: segment_count"
    );
    let blocks: usize = s.segments.iter().map(|g| g.blocks.len()).sum();
    assert_eq!(
        blocks as u64,
        mem["block_total"].as_u64().unwrap(),
        "{name}: block_total"
    );
    let count = |st: BlockState| {
        s.segments
            .iter()
            .flat_map(|g| &g.blocks)
            .filter(|b| b.state == st)
            .count() as u64
    };
    assert_eq!(
        count(BlockState::ActiveAllocated),
        mem["block_count"]["active_allocated"].as_u64().unwrap(),
        "{name}"
    );
    assert_eq!(
        count(BlockState::Inactive),
        mem["block_count"]["inactive"].as_u64().unwrap(),
        "{name}"
    );
    let checks = &o["checks"];
    let sum = |f: fn(&memlsp::torch::model::Segment) -> u64| s.segments.iter().map(f).sum::<u64>();
    assert_eq!(
        sum(|g| g.allocated_size),
        checks["sum_segment_field_allocated_size"].as_u64().unwrap(),
        "{name}"
    );
    assert_eq!(
        sum(|g| g.active_size),
        checks["sum_segment_field_active_size"].as_u64().unwrap(),
        "{name}"
    );
    assert_eq!(
        sum(|g| g.requested_size),
        checks["sum_segment_field_requested_size"].as_u64().unwrap(),
        "{name}"
    );
    assert_eq!(
        s.pickle_protocol.map(u64::from),
        o["pickle_protocol"].as_u64(),
        "{name}: protocol"
    );
    let expected_format = o["format"].as_str().unwrap();
    let got_format = match s.format {
        Some(memlsp::torch::model::SnapshotFormat::Dict) => "dict",
        Some(memlsp::torch::model::SnapshotFormat::SegmentList) => "segment-list",
        None => "none",
    };
    assert_eq!(got_format, expected_format, "{name}");
    if o["trace"]["present"].as_bool() == Some(true) {
        let traces = s
            .device_traces
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: traces missing"));
        for (d, per) in o["trace"]["per_device"].as_object().unwrap() {
            let d: usize = d.parse().unwrap();
            assert_eq!(
                traces[d].len() as u64,
                per["entries"].as_u64().unwrap(),
                "{name}: device {d} entries"
            );
            let mut actions: BTreeMap<String, u64> = BTreeMap::new();
            for e in &traces[d] {
                *actions.entry(e.action.as_str().to_string()).or_default() += 1;
            }
            let want: BTreeMap<String, u64> = per["actions"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                .collect();
            assert_eq!(actions, want, "{name}: device {d} actions");
            let first = traces[d].first().and_then(|e| e.time_us());
            assert_eq!(
                first,
                per["first_time_us"].as_i64(),
                "{name}: device {d} first_time_us"
            );
        }
    } else {
        assert!(s.device_traces.is_none(), "{name}: unexpected traces");
    }
}

/// A cancelled analysis stops with `ErrorKind::Cancelled` whichever stage it is in: inside the
/// pickle VM or the JSON decoder (each checked every 2 MiB of input) or between decode and
/// analysis. A real snapshot behind 9 MiB of bytes inside a wrapper list exercises the VM's
/// check, a 3 MiB JSON trace the JSON decoder's.
#[test]
fn a_cancelled_decode_stops_with_cancelled() {
    use memlsp::error::ErrorKind;
    let Some(p) = common::shared(
        "torch_snapshots/real/sidsoc12__8169e1e6_mem_snapshot_ctx128_fp32_train.pickle",
    ) else {
        return;
    };
    let opts = memlsp::options::Options::default();
    opts.decode.cancel.cancel(); // a default flag cannot be raised: nothing to cancel
    assert!(memlsp::analyze::analyze_file(&p, &opts).is_ok());

    let mut opts = memlsp::options::Options::default();
    opts.decode.cancel = memlsp::options::Cancel::new();
    opts.decode.cancel.cancel();
    let e = memlsp::analyze::analyze_file(&p, &opts).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Cancelled, "{e}");

    // Past the VM's first progress point (2 MiB): 9 MiB of BINBYTES, then the snapshot.
    let snapshot = std::fs::read(&p).unwrap();
    let mut big = vec![0x80, 4, b'B'];
    big.extend_from_slice(&(9u32 << 20).to_le_bytes());
    big.resize(big.len() + (9 << 20), 0);
    big.push(b'0'); // POP
    big.extend_from_slice(&snapshot[2..]);
    let decode = memlsp::options::DecodeOptions {
        cancel: opts.decode.cancel.clone(),
        ..DecodeOptions::default()
    };
    let e =
        memlsp::torch::load::decode_snapshot(Path::new("big.pickle"), &big, &decode).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Cancelled, "{e}");
    assert!(e.offset.is_none());
    // Without the flag the same bytes decode.
    assert!(
        memlsp::torch::load::decode_snapshot(
            Path::new("big.pickle"),
            &big,
            &DecodeOptions::default()
        )
        .is_ok()
    );
    // The JSON form stops too, past its first progress point (2 MiB of trace).
    let mut json = String::from(r#"{"segments": [], "device_traces": [["#);
    for i in 0..60_000 {
        json += &format!(
            r#"{{"action": "alloc", "addr": {}, "size": 512, "stream": 0, "frames": []}},"#,
            i * 512
        );
    }
    json.pop();
    json += "]]}";
    assert!(json.len() > 3 << 20);
    let e = memlsp::torch::load::decode_snapshot(Path::new("big.json"), json.as_bytes(), &decode)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Cancelled, "{e}");
    let s = memlsp::torch::load::decode_snapshot(
        Path::new("big.json"),
        json.as_bytes(),
        &DecodeOptions::default(),
    )
    .unwrap();
    assert_eq!(s.device_traces.unwrap()[0].len(), 60_000);
}

/// The sharing a snapshot's pickle has is not ours to choose: torch shares each frame dict
/// between stacks, but a snapshot rewritten by another tool may hold a fresh dict per frame,
/// or fresh strings too; its JSON form shares nothing. Every real snapshot with stacks in its
/// trace, rewritten these three ways by CPython, gives the user the same report as the
/// original (but for the pickle protocol, which JSON has not; as JSON, the 8 under 1.3 MB),
/// written under a temporary folder, never next to the snapshot.
#[test]
fn real_snapshots_with_unshared_frames_or_as_json_report_the_same() {
    let Some(dir) = common::shared("torch_snapshots/real") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let script = r#"
import json, os, pickle, sys
src, out = sys.argv[1], sys.argv[2]
def fresh_str(v):
    return (v + ".")[:-1] if isinstance(v, str) else v
done = []
for name in sys.argv[3:]:
    with open(os.path.join(src, name), "rb") as f:
        snap = pickle.load(f)
    traces = snap.get("device_traces") if isinstance(snap, dict) else None
    if not traces or not any(e.get("frames") for t in traces for e in t):
        continue
    for kind, frame in (("dicts", dict), ("strings", lambda fr: {k: fresh_str(v) for k, v in fr.items()})):
        lists = {}
        for t in traces:
            for e in t:
                fr = e.get("frames")
                if fr:
                    # A list shared by two entries (free_requested, free_completed) stays shared.
                    e["frames"] = lists.setdefault(id(fr), [frame(x) for x in fr])
        os.makedirs(os.path.join(out, kind), exist_ok=True)
        with open(os.path.join(out, kind, name), "wb") as f:
            pickle.dump(snap, f, protocol=4)
        with open(os.path.join(src, name), "rb") as f:
            snap = pickle.load(f)
        traces = snap["device_traces"]
    # JSON spells every frame out (~30x the pickle): the smaller snapshots keep the test short.
    if os.path.getsize(os.path.join(src, name)) < 1_300_000:
        os.makedirs(os.path.join(out, "json"), exist_ok=True)
        with open(os.path.join(out, "json", name), "w") as f:
            json.dump(snap, f)
    done.append(name)
print("\n".join(done))
"#;
    let (dir_arg, tmp_arg) = (dir.display().to_string(), tmp.path().display().to_string());
    let mut args: Vec<&str> = vec![&dir_arg, &tmp_arg];
    args.extend(names.iter().map(String::as_str));
    let out = common::python(script, &args);
    let rewritten: Vec<String> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        rewritten.len() >= 20,
        "real snapshots with stacks: {rewritten:?}"
    );
    let as_json = std::fs::read_dir(tmp.path().join("json")).unwrap().count();
    assert!(as_json >= 8, "{as_json} real snapshots rewritten as JSON");
    let orig = tmp.path().join("original");
    std::fs::create_dir_all(&orig).unwrap();
    // Four reports a snapshot, on both cores.
    let check = |name: &String| {
        std::fs::copy(dir.join(name), orig.join(name)).unwrap();
        let report = |folder: &Path| {
            let r = common::memlsp(&["report", name, "--format", "json"], folder);
            assert_eq!(r.code, 0, "{name}: {}", r.stderr);
            let mut v = r.json();
            v["captures"][0]["torch"]["pickle_protocol"] = Value::Null;
            v
        };
        let want = report(&orig);
        for kind in ["dicts", "strings", "json"] {
            let folder = tmp.path().join(kind);
            if !folder.join(name).exists() {
                continue;
            }
            let got = report(&folder);
            assert!(
                got == want,
                "{name}: the report of its {kind} rewrite differs from the original's"
            );
        }
    };
    std::thread::scope(|s| {
        for half in [0, 1] {
            let (rewritten, check) = (&rewritten, &check);
            s.spawn(move || rewritten.iter().skip(half).step_by(2).for_each(check));
        }
    });
}

/// The decoder publishes how far it read (what `memlsp report` shows as progress): every few MiB
/// while it reads, the whole file once it decoded; a file cut short stops where it stopped.
#[test]
fn decoding_publishes_how_far_it_read() {
    let Some(path) = common::shared(
        "torch_snapshots/real/sidsoc12__8169e1e6_mem_snapshot_ctx128_fp32_train.pickle",
    ) else {
        return;
    };
    let bytes = std::fs::read(&path).unwrap();
    let watched = || DecodeOptions {
        progress: memlsp::options::Progress::new(),
        ..DecodeOptions::default()
    };
    let opts = watched();
    load_snapshot(&path, &opts).unwrap();
    assert_eq!(opts.progress.read(), bytes.len() as u64);

    let cut = 3_500_000;
    let opts = watched();
    let e = memlsp::torch::load::decode_snapshot(Path::new("cut.pickle"), &bytes[..cut], &opts)
        .unwrap_err();
    assert_eq!(e.kind, memlsp::error::ErrorKind::Truncated, "{e}");
    let read = opts.progress.read();
    assert!((2 << 20..cut as u64).contains(&read), "published {read}");
}
