//! The loader's tests: torch-written pickles (made by `python3`), the JSON form, the threaded
//! and inline pipelines, the run cache, and refusals.

use super::*;
use crate::torch::intern::THREAD_FROM;

thread_local! {
    /// Tests: never start the interning thread.
    pub(super) static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// What `python3 ARGS…` writes to stdout (the test fails if it fails).
fn python(args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("python3")
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn load_py(script: &str) -> Result<Snapshot, CaptureError> {
    let bytes = python(&["-c", script]);
    decode_snapshot(Path::new("t.pickle"), &bytes, &DecodeOptions::default())
}

#[test]
fn torch20_blocks_get_addresses_and_history_stacks() {
    let s = load_py(
            r#"
import pickle, sys
f = {'filename': '/w/train.py', 'name': 'step', 'line': 12}
seg = {'device': 0, 'address': 1000, 'total_size': 3072, 'allocated_size': 1024, 'active_size': 1024,
       'requested_size': 1000, 'stream': 0, 'segment_type': 'small',
       'blocks': [{'size': 1024, 'requested_size': 1000, 'state': 'active_allocated',
                   'history': [{'addr': 1000, 'real_size': 1000, 'frames': [f]}]},
                  {'size': 2048, 'requested_size': 0, 'state': 'inactive'}]}
sys.stdout.buffer.write(pickle.dumps({'segments': [seg], 'device_traces': [[]]}, protocol=4))
"#,
        )
        .unwrap();
    let b = &s.segments[0].blocks;
    assert_eq!((b[0].address, b[1].address), (1000, 2024));
    assert_eq!(b[0].history_len, 1);
    let frames: Vec<_> = s.stack_frames(b[0].stack).collect();
    assert_eq!(frames[0].filename, "/w/train.py");
    assert_eq!(frames[0].line, 12);
    assert_eq!(s.device_traces.as_ref().map(|t| t.len()), Some(1));
}

#[test]
fn allocator_settings_keep_roundup_divisions_and_gc_threshold() {
    let json = br#"{"segments": [], "device_traces": [[]], "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[256:4,>:8]",
            "max_split_size": -1, "garbage_collection_threshold": 0.0,
            "expandable_segments": false,
            "roundup_power2_divisions": {"1": 0, "2": 0, "256": 4, "512": 8, "32768": 8,
                                         "3": 99, "x": 5}}}"#;
    let s = decode_snapshot(Path::new("t.json"), json, &DecodeOptions::default()).unwrap();
    let st = s.allocator_settings.unwrap();
    assert_eq!(st.max_split_size, None, "-1 is unlimited");
    assert_eq!(st.garbage_collection_threshold, Some(0.0));
    let d = st.roundup_power2_divisions.unwrap();
    assert_eq!(d.len(), 16);
    assert_eq!((d[0], d[1], d[8], d[9], d[15]), (0, 0, 4, 8, 8));
    assert_eq!(
        d.iter().filter(|&&x| x == 99 || x == 5).count(),
        0,
        "bad keys ignored"
    );
    // Hostile values: negative or huge divisions read as 0, never panic.
    let json = br#"{"segments": [], "allocator_settings": {"roundup_power2_divisions":
            {"1": -4, "1024": 1.5e300, "9223372036854775808": 2}}}"#;
    let s = decode_snapshot(Path::new("t.json"), json, &DecodeOptions::default()).unwrap();
    let d = s
        .allocator_settings
        .unwrap()
        .roundup_power2_divisions
        .unwrap();
    assert_eq!((d[0], d[10], d[15]), (0, 0, 2));
}

#[test]
fn shared_stacks_are_interned_once_and_max_trace_events_drops_oldest() {
    let s = load_py(
            r#"
import pickle, sys
f = {'name': 'fwd', 'filename': '/w/m.py', 'line': 3}
st = [f, {'name': '??', 'filename': '??', 'line': 0}]
tr = [{'action': 'alloc', 'addr': i, 'size': 512, 'stream': 0, 'time_us': i, 'frames': st} for i in range(10)]
sys.stdout.buffer.write(pickle.dumps({'segments': [], 'device_traces': [tr, []]}, protocol=4))
"#,
        )
        .unwrap();
    assert_eq!(s.stacks.len(), 1);
    assert_eq!(s.frames.len(), 2);
    let bytes = python(&[
        "-c",
        "import pickle,sys; tr=[{'action':'alloc','addr':i,'size':1,'stream':0} for i in range(10)]; sys.stdout.buffer.write(pickle.dumps({'segments':[],'device_traces':[tr]}))",
    ]);
    let s = decode_snapshot(
        Path::new("t"),
        &bytes,
        &DecodeOptions {
            max_trace_events: Some(3),
            ..DecodeOptions::default()
        },
    )
    .unwrap();
    let tr = &s.device_traces.unwrap()[0];
    assert_eq!(tr.len(), 3);
    assert_eq!(tr[0].addr, 7);
    assert_eq!(s.dropped_trace_entries, 7);
}

#[test]
fn fresh_frames_lists_intern_by_content_and_long_stacks_stay_whole() {
    // Real sharing: each alloc and free_requested has its own list, free_completed shares
    // the free_requested one; one 1500-frame stack arrives in two APPENDS batches.
    let s = load_py(
        r#"
import pickle, sys
f = {'name': 'fwd', 'filename': '/w/m.py', 'line': 3}
c = {'name': 'c10::alloc()', 'filename': '??', 'line': 0}
tr = []
for i in range(4):
    tr.append({'action': 'alloc', 'addr': i, 'size': 512, 'stream': 0, 'frames': [c, f]})
    fs = [c, c, f]
    tr.append({'action': 'free_requested', 'addr': i, 'size': 512, 'stream': 0, 'frames': fs})
    tr.append({'action': 'free_completed', 'addr': i, 'size': 512, 'stream': 0, 'frames': fs})
tr.append({'action': 'alloc', 'addr': 9, 'size': 512, 'stream': 0, 'frames': [f] * 1499 + [c]})
tr.append({'action': 'oom', 'size': 1, 'device_free': 0, 'stream': 0, 'frames': []})
sys.stdout.buffer.write(pickle.dumps({'segments': [], 'device_traces': [tr]}, protocol=4))
"#,
    )
    .unwrap();
    let tr = &s.device_traces.as_ref().unwrap()[0];
    assert_eq!(tr.len(), 14);
    let used: std::collections::HashSet<_> = tr.iter().filter_map(|e| e.stack()).collect();
    assert_eq!(used.len(), 3, "two short stacks and the long one");
    assert_eq!(tr[0].stack(), tr[3].stack());
    assert_eq!(tr[1].stack(), tr[2].stack());
    assert_ne!(tr[0].stack(), tr[1].stack());
    let long: Vec<_> = s.stack_frames(tr[12].stack()).collect();
    assert_eq!(long.len(), 1500);
    assert_eq!(long[1499].name, "c10::alloc()");
    assert_eq!(long[0].filename, "/w/m.py");
    assert_eq!(tr[13].stack(), None, "an empty frames list is no stack");
}

#[test]
fn unshared_frame_dicts_read_as_the_shared_ones() {
    // The same trace written with frame dicts shared (as torch writes them) and with a fresh
    // dict per frame: an empty one, one with a single key (SETITEM), one with 1,500 keys
    // (two SETITEMS batches, the later one naming the line again), one that refers to
    // itself, one dict of a trace entry referenced again by a later entry, and by a segment
    // written after the traces.
    let script = |fresh: bool| {
        format!(
            r#"
import pickle, sys
fresh = {fresh}
f = {{'name': 'fwd', 'filename': '/w/m.py', 'line': 3}}
c = {{'name': 'c10::alloc()', 'filename': '??', 'line': 0}}
big = {{f'k{{i}}': i for i in range(1500)}}
big.update(name='wide', filename='/w/w.py')
big['line'] = 7
d = (lambda x: dict(x)) if fresh else (lambda x: x)
tr = []
for i in range(3):
    tr.append({{'action': 'alloc', 'addr': i, 'size': 512, 'stream': 0, 'frames': [d(c), d(f), {{}}]}})
    tr.append({{'action': 'free_requested', 'addr': i, 'size': 512, 'stream': 0, 'frames': [d(c), {{'name': 'one'}}]}})
    tr.append({{'action': 'free_completed', 'addr': i, 'size': 512, 'stream': 0, 'frames': [d(big)]}})
shared = d(f)
tr.append({{'action': 'alloc', 'addr': 8, 'size': 512, 'stream': 0, 'frames': [shared, d(c)]}})
tr.append({{'action': 'alloc', 'addr': 9, 'size': 512, 'stream': 0, 'frames': [d(c), shared]}})
me = {{'name': 'me'}}
me['self'] = me  # refers to itself before its items are in
tr.append({{'action': 'alloc', 'addr': 10, 'size': 512, 'stream': 0, 'frames': [me]}})
seg = {{'device': 0, 'address': 0, 'total_size': 2097152, 'allocated_size': 512,
        'active_size': 512, 'requested_size': 512, 'stream': 0, 'segment_type': 'small',
        'blocks': [{{'address': 9, 'size': 512, 'requested_size': 512, 'state': 'active_allocated',
                    'frames': [shared]}}]}}
snap = {{'device_traces': [tr], 'segments': [seg]}}
sys.stdout.buffer.write(pickle.dumps(snap, protocol=4))
"#,
            fresh = if fresh { "True" } else { "False" }
        )
    };
    let frames_of = |s: &Snapshot| -> Vec<Vec<(String, String, u64)>> {
        let tr = &s.device_traces.as_ref().unwrap()[0];
        let mut out: Vec<Vec<(String, String, u64)>> = tr
            .iter()
            .map(|e| {
                s.stack_frames(e.stack())
                    .map(|f| (f.name.clone(), f.filename.clone(), f.line))
                    .collect()
            })
            .collect();
        out.push(
            s.stack_frames(s.segments[0].blocks[0].stack)
                .map(|f| (f.name.clone(), f.filename.clone(), f.line))
                .collect(),
        );
        out
    };
    let shared = load_py(&script(false)).unwrap();
    let fresh = load_py(&script(true)).unwrap();
    let (a, b) = (frames_of(&shared), frames_of(&fresh));
    assert_eq!(a, b);
    let t = |n: &str, f: &str, l: u64| (n.to_string(), f.to_string(), l);
    assert_eq!(
        b[0],
        vec![
            t("c10::alloc()", "??", 0),
            t("fwd", "/w/m.py", 3),
            t("", "", 0)
        ]
    );
    assert_eq!(b[1], vec![t("c10::alloc()", "??", 0), t("one", "", 0)]);
    assert_eq!(b[2], vec![t("wide", "/w/w.py", 7)]);
    assert_eq!(b[11], vec![t("me", "", 0)]);
    assert_eq!(b[12], vec![t("fwd", "/w/m.py", 3)], "the segment's block");
    // Stacks and frames are interned by content in both.
    assert_eq!(shared.stacks.len(), fresh.stacks.len());
    assert_eq!(shared.frames.len(), fresh.frames.len());
}

#[test]
fn unshared_frame_dicts_with_their_keys_in_other_orders_keep_each_field() {
    // Fresh frame dicts, each with the three keys in one of the six orders (or with a fourth
    // key, or a key that is no field), one after the other: the loader reads a dict whose keys
    // come in the order of the dict before it without looking them up, so a dict in another
    // order must not take that order's fields.
    let s = load_py(
        r#"
import itertools, pickle, sys
orders = list(itertools.permutations(['name', 'filename', 'line']))
vals = {'name': lambda i: f'fn{i}', 'filename': lambda i: f'/w/m{i}.py', 'line': lambda i: 100 + i}
tr = []
for i in range(40):
    frames = []
    for j in range(5):
        o = orders[(i * 5 + j) % 7] if (i * 5 + j) % 7 < 6 else ('name', 'filename', 'code')
        k = i * 5 + j
        d = {key: (vals[key](k) if key in vals else 'x') for key in o}
        if k % 11 == 0:
            d['column'] = 4
        frames.append(d)
    tr.append({'action': 'alloc', 'addr': i, 'size': 512, 'stream': 0, 'frames': frames})
sys.stdout.buffer.write(pickle.dumps({'segments': [], 'device_traces': [tr]}, protocol=4))
"#,
    )
    .unwrap();
    let tr = &s.device_traces.as_ref().unwrap()[0];
    for (i, e) in tr.iter().enumerate() {
        let got: Vec<(String, String, u64)> = s
            .stack_frames(e.stack())
            .map(|f| (f.name.clone(), f.filename.clone(), f.line))
            .collect();
        let want: Vec<(String, String, u64)> = (0..5)
            .map(|j| {
                let k = i * 5 + j;
                let line = if k % 7 < 6 { 100 + k as u64 } else { 0 };
                (format!("fn{k}"), format!("/w/m{k}.py"), line)
            })
            .collect();
        assert_eq!(got, want, "entry {i}");
    }
}

#[test]
fn repeated_frames_lists_reuse_their_stack_and_a_hash_collision_decodes_again() {
    // Three distinct stacks, each allocated many times: from the second time on, a list's
    // run of memo references is recognised and not decoded again.
    let script = r#"
import pickle, sys
fs = [{'name': f'f{i}', 'filename': f'/w/m{i}.py', 'line': i} for i in range(6)]
shapes = [[fs[0], fs[1]], [fs[2], fs[3], fs[4]], [fs[5], fs[0]]]
tr = []
for i in range(300):
    st = list(shapes[i % 3])
    tr.append({'action': 'alloc', 'addr': i, 'size': 512, 'stream': 0, 'frames': st})
sys.stdout.buffer.write(pickle.dumps({'segments': [], 'device_traces': [tr]}, protocol=4))
"#;
    let names = |s: &Snapshot| -> Vec<Vec<String>> {
        s.device_traces.as_ref().unwrap()[0]
            .iter()
            .map(|e| s.stack_frames(e.stack()).map(|f| f.name.clone()).collect())
            .collect()
    };
    let plain = load_py(script).unwrap();
    let got = names(&plain);
    assert_eq!(got.len(), 300);
    assert_eq!(got[0], ["f0", "f1"]);
    assert_eq!(got[1], ["f2", "f3", "f4"]);
    assert_eq!(got[299], ["f5", "f0"]);
    assert_eq!(plain.stacks.len(), 3);
    crate::torch::intern::COLLIDE.with(|c| c.set(true));
    let collided = load_py(script);
    crate::torch::intern::COLLIDE.with(|c| c.set(false));
    assert_eq!(
        names(&collided.unwrap()),
        got,
        "decoded again without the cache"
    );
}

#[test]
fn a_frames_list_appended_to_after_its_entry_has_its_final_content_as_in_python() {
    // Hand-written: entry 1 has L = [f0]; then `L.append(f0)` through a memo reference; entry
    // 2 refers to L. pickle.loads gives both entries [f0, f0].
    let data = b"\x80\x04}\x94\x8c\rdevice_traces\x94]\x94]\x94(}\x94(\x8c\x06frames\x94]\x94(}\x94(\x8c\x04name\x94\x8c\x02f0\x94ue\x8c\x06action\x94\x8c\x05alloc\x94uh\x06h\x07a0}\x94(h\x05h\x06h\nh\x0bueas.";
    let s = decode_snapshot(Path::new("t.pickle"), data, &DecodeOptions::default()).unwrap();
    let tr = &s.device_traces.as_ref().unwrap()[0];
    assert_eq!(tr.len(), 2);
    for e in tr {
        let names: Vec<_> = s.stack_frames(e.stack()).map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["f0", "f0"]);
    }
}

#[test]
fn a_large_snapshot_loads_the_same_threaded_inline_and_without_the_run_cache() {
    // The benchmark's generator at ~10 MB: above THREAD_FROM, so the worker thread runs.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/gen_snapshot.py");
    let bytes = python(&[script, "/dev/stdout", "45000"]);
    assert!(bytes.len() >= THREAD_FROM, "{} bytes", bytes.len());
    let load = || decode_snapshot(Path::new("big.pickle"), &bytes, &DecodeOptions::default());
    type Row = (Action, u64, u64, Option<i64>, Vec<String>);
    let view = |s: &Snapshot| -> Vec<Row> {
        s.device_traces.as_ref().unwrap()[0]
            .iter()
            .map(|e| {
                let frames = s.stack_frames(e.stack()).map(|f| f.name.clone()).collect();
                (e.action, e.addr, e.size, e.time_us(), frames)
            })
            .collect()
    };
    let threaded = view(&load().unwrap());
    assert_eq!(threaded.len(), 45_000);
    assert!(
        threaded.iter().all(|e| !e.4.is_empty()),
        "every entry has its stack"
    );
    INLINE.with(|c| c.set(true));
    let inline = view(&load().unwrap());
    crate::torch::intern::COLLIDE.with(|c| c.set(true));
    let no_cache = view(&load().unwrap());
    crate::torch::intern::COLLIDE.with(|c| c.set(false));
    INLINE.with(|c| c.set(false));
    assert!(threaded == inline, "threaded and inline loads differ");
    assert!(threaded == no_cache, "the run cache changed a stack");
}

#[test]
fn json_form_loads_like_the_pickle() {
    let json = br#"{"segments":[{"device":0,"address":4096,"total_size":2097152,"allocated_size":512,
            "active_size":512,"requested_size":100,"stream":0,"segment_type":"small","segment_pool_id":[0,0],
            "is_expandable":false,"frames":[],"blocks":[{"address":4096,"size":512,"requested_size":100,
            "state":"active_allocated","frames":[{"name":"f","filename":"/w/a.py","line":7}]},
            {"address":4608,"size":2096640,"requested_size":0,"state":"inactive","frames":[]}]}],
            "device_traces":[[{"action":"oom","device_free":1024,"size":4096,"stream":0,"frames":[]}]]}"#;
    let s = decode_snapshot(Path::new("s.json"), json, &DecodeOptions::default()).unwrap();
    assert_eq!(s.segments[0].pool_id, Some((0, 0)));
    assert_eq!(s.segments[0].blocks[0].state, BlockState::ActiveAllocated);
    let tr = &s.device_traces.unwrap()[0];
    assert_eq!(tr[0].action, Action::Oom);
    assert_eq!(tr[0].device_free(), Some(1024));
    assert_eq!(tr[0].stack(), None);
}

#[test]
fn json_streams_its_trace_and_reads_as_python_does() {
    // Escaped strings, a repeated key (the last value counts, as in json.load), a frame
    // with an extra nested value, an empty frames list, and the top-level keys in file order.
    let json = br#"{"device_traces":[[
            {"action":"alloc","addr":4096,"size":1,"size":512,"stream":0,"frames":[
                {"name":"f\u00e9","filename":"C:\\w\\a.py","line":7,"extra":{"k":[1]}},
                {"name":"g","filename":"/w/b.py","line":9}]},
            {"action":"free_requested","addr":4096,"size":512,"stream":0,"frames":[]}]],
            "segments":[]}"#;
    let s = decode_snapshot(Path::new("s.json"), json, &DecodeOptions::default()).unwrap();
    assert_eq!(s.top_level_keys, vec!["device_traces", "segments"]);
    let tr = &s.device_traces.as_ref().unwrap()[0];
    assert_eq!((tr[0].size, tr[1].stack()), (512, None));
    let f: Vec<_> = s.stack_frames(tr[0].stack()).collect();
    assert_eq!(
        (f[0].name.as_str(), f[0].filename.as_str()),
        ("fé", r"C:\w\a.py")
    );
    assert_eq!((f[1].name.as_str(), f[1].line), ("g", 9));
    // A trace item that is not a dict: the same error as in a pickle, where it stands.
    let json = br#"{"segments":[],"device_traces":[[{"action":"alloc"}, 7]]}"#;
    let e = decode_snapshot(Path::new("s.json"), json, &DecodeOptions::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("an item of `device_traces` is an int, expected a dict"),
        "{e}"
    );
    assert_eq!(e.offset, Some(53));
}

#[test]
fn json_decodes_to_the_snapshot_its_document_tree_gives() {
    // The streaming decoder against serde_json's document tree converted to the same graph
    // (the previous way), on a bigger JSON form: the same snapshot.
    let bytes = python(&[
        "-c",
        r#"
import json, sys
fs = [{'name': f'f{i}', 'filename': f'/w/m{i % 3}.py', 'line': i} for i in range(40)]
tr = []
for i in range(300):
    tr.append({'action': 'alloc', 'addr': 4096 * i, 'size': 512, 'stream': 0, 'time_us': i,
               'frames': fs[i % 7:i % 7 + 20]})
    tr.append({'action': 'free_requested', 'addr': 4096 * i, 'size': 512, 'stream': 0,
               'frames': fs[:3]})
    tr.append({'action': 'free_completed', 'addr': 4096 * i, 'size': 512, 'stream': 0, 'frames': []})
seg = {'device': 0, 'address': 0, 'total_size': 2097152, 'allocated_size': 0, 'active_size': 0,
       'requested_size': 0, 'stream': 0, 'segment_type': 'small',
       'blocks': [{'address': 0, 'size': 2097152, 'requested_size': 0, 'state': 'inactive',
                   'frames': fs[:2]}]}
sys.stdout.write(json.dumps({'segments': [seg], 'device_traces': [tr, []]}))
"#,
    ]);
    let path = Path::new("s.json");
    let opts = DecodeOptions::default();
    let streamed = decode_snapshot(path, &bytes, &opts).unwrap();
    let tree = tree_from_json(path, &bytes).unwrap();
    let whole = build(path, bytes.len(), &tree, &opts, Interner::default(), None).unwrap();
    use crate::torch::model::Frame;
    let frames = |s: &Snapshot| -> Vec<Vec<Frame>> {
        let mut v: Vec<Vec<Frame>> = s
            .device_traces
            .iter()
            .flatten()
            .flatten()
            .map(|e| s.stack_frames(e.stack()).cloned().collect())
            .collect();
        v.extend(
            s.segments
                .iter()
                .flat_map(|g| &g.blocks)
                .map(|b| s.stack_frames(b.stack).cloned().collect()),
        );
        v
    };
    assert_eq!(frames(&streamed), frames(&whole));
    assert_eq!(frames(&streamed).len(), 901);
    type Entry = (Action, u64, u64, Option<i64>);
    let strip = |s: &Snapshot| -> Vec<Vec<Entry>> {
        s.device_traces
            .iter()
            .flatten()
            .map(|t| {
                t.iter()
                    .map(|e| (e.action, e.addr, e.size, e.time_us()))
                    .collect()
            })
            .collect()
    };
    assert_eq!(strip(&streamed), strip(&whole));
    // Stack ids are numbered in the order stacks are met (compared by content above).
    let segs = |s: &Snapshot| {
        let mut v = s.segments.clone();
        v.iter_mut()
            .flat_map(|g| &mut g.blocks)
            .for_each(|b| b.stack = None);
        v
    };
    assert_eq!(segs(&streamed), segs(&whole));
}

#[test]
fn code_and_garbage_are_refused_with_offsets() {
    let e = decode_snapshot(
        Path::new("evil.pickle"),
        b"cos\nsystem\n(S'touch MARKER'\ntR.",
        &DecodeOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.offset, Some(0));
    assert!(e.to_string().contains("os.system"), "{e}");
    let e = decode_snapshot(
        Path::new("x.pickle"),
        b"\x80\x04K\x01.",
        &DecodeOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("top-level object is an int"), "{e}");
    let e = decode_snapshot(
        Path::new("x.json"),
        b"{\"segments\": [",
        &DecodeOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Truncated);
}

#[test]
fn trace_entries_read_each_field_by_its_key_when_the_keys_change_order_or_repeat() {
    // Hand-written, keys memoized as torch's pickles have them (an entry with the key objects
    // of the one before reads its fields from the positions found for those keys): entries in
    // one order, then another, then with `size` named twice (a dict keeps the last value;
    // Python never writes this, a hostile file can), each layout twice in a row.
    use crate::pickle::opcodes as op;
    let mut b = vec![op::PROTO, 4, op::EMPTY_DICT, op::MARK];
    let text = |b: &mut Vec<u8>, s: &str| {
        b.extend([op::SHORT_BINUNICODE, s.len() as u8]);
        b.extend_from_slice(s.as_bytes());
    };
    text(&mut b, "segments");
    b.push(op::EMPTY_LIST);
    text(&mut b, "device_traces");
    b.extend([op::EMPTY_LIST, op::MARK, op::EMPTY_LIST, op::MARK]);
    // Memo: 0 action, 1 addr, 2 size, 3 stream, 4 "alloc".
    for k in ["action", "addr", "size", "stream", "alloc"] {
        text(&mut b, k);
        b.push(op::MEMOIZE);
        b.push(op::POP);
    }
    let entry = |b: &mut Vec<u8>, items: &[(u8, u8)]| {
        b.extend([op::EMPTY_DICT, op::MARK, op::BINGET, 0, op::BINGET, 4]);
        for &(key, v) in items {
            b.extend([op::BINGET, key, op::BININT1, v]);
        }
        b.push(op::SETITEMS);
    };
    let (addr, size, stream) = (1, 2, 3);
    entry(&mut b, &[(addr, 1), (size, 16), (stream, 0)]);
    entry(&mut b, &[(addr, 2), (size, 32), (stream, 0)]);
    entry(&mut b, &[(size, 48), (stream, 0), (addr, 3)]);
    entry(&mut b, &[(size, 64), (stream, 0), (addr, 4)]);
    entry(&mut b, &[(addr, 5), (size, 1), (stream, 0), (size, 80)]);
    entry(&mut b, &[(addr, 6), (size, 2), (stream, 0), (size, 96)]);
    entry(&mut b, &[(addr, 7), (size, 112), (stream, 0)]);
    b.extend([op::APPENDS, op::APPENDS, op::SETITEMS, op::STOP]);
    let s = decode_snapshot(Path::new("t.pickle"), &b, &DecodeOptions::default()).unwrap();
    let tr = &s.device_traces.as_ref().unwrap()[0];
    let got: Vec<(u64, u64)> = tr.iter().map(|e| (e.addr, e.size)).collect();
    assert_eq!(
        got,
        [
            (1, 16),
            (2, 32),
            (3, 48),
            (4, 64),
            (5, 80),
            (6, 96),
            (7, 112)
        ]
    );
    assert!(tr.iter().all(|e| e.action == Action::Alloc));
}
