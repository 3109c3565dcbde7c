"""Write a large CUDA memory snapshot with PyTorch's sharing pattern, for benchmarks.

Usage:
  python3 benches/gen_snapshot.py OUT.pickle [TRACE_ENTRIES]
      synthetic (below)
  python3 benches/gen_snapshot.py --scale SRC.pickle OUT.pickle --target-bytes 250M|1G [--shared-lists|--unshared-frames|--json]
      a real snapshot scaled up (`scale` below)

Synthetic: shape follows torch 2.8+ `_dump_snapshot()` output (torch_snapshots/FORMAT.md) and the
sharing measured in the real snapshots of shared/torch_snapshots/real: frame dicts are built once
and shared by every stack that contains them; every `alloc` and every `free_requested` entry has
its own fresh frames list (20-60 frames, 3/4 of them C++ frames: '??', line 0), and
`free_completed` shares the list object of its `free_requested`; each trace entry carries its own
`compile_context` string object (not memoized, as in real files). Python's default pickle protocol
(4), like torch.
"""
import json
import pickle
import random
import sys


def parse_bytes(text):
    """'250M' / '1G' / '1000000' -> bytes (decimal units, as file sizes are quoted)."""
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def scale(src, out, target, shared_lists, unshared_frames=False, as_json=False):
    """Repeat a real snapshot's device traces until the pickle is about `target` bytes.

    The source is trusted data (a real snapshot from ../shared), read with CPython's pickle.
    Each repetition k (0 = the source itself) is a copy of every device trace with fresh entry
    dicts and fresh frames lists, the frame dicts shared as torch writes them (an entry pair
    free_requested/free_completed keeps sharing one list, and a segment block keeps sharing the
    list of the trace entry it shares in the source). Addresses move by k * SHIFT (a power of two
    above the source's address span, so segment alignment is kept), times by k * the trace's time
    span, and the stream by k: repetition k lives on its own stream of its own address range.
    The segments at the end are the source's segments, repeated the same way, so the end state
    is every repetition's end state and the trace stays consistent (each address is allocated
    and freed in the source's order, within its own range). Own streams keep the repetitions
    apart in PyTorch's caching allocator too (it never hands a block cached on one stream to
    another), so memlsp's allocator replay validates on the result as on the source, as long as
    the source has no OOM and no `empty_cache()` (both release cached segments of every stream).

    `shared_lists`: the same, but frames lists shared between trace entries: one list object per
    distinct stack in the whole file (a valid pickle PyTorch does not write, but others may).

    `unshared_frames`: the same as torch writes it, but every frames list holds fresh frame dicts
    (copies; their strings stay shared), as a tool that rebuilds the frames writes them.

    `as_json`: the snapshot's JSON form (`json.dump`), which shares nothing.
    """
    with open(src, "rb") as f:
        snap = pickle.load(f)
    segments = snap.get("segments", [])
    traces = snap.get("device_traces", [])
    addrs = [s["address"] + s["total_size"] for s in segments] + [s["address"] for s in segments]
    addrs += [e["addr"] for t in traces for e in t if e.get("addr")]
    lo, hi = min(addrs), max(addrs)
    shift = 1 << 21
    while shift <= hi - lo:
        shift <<= 1
    times = [e["time_us"] for t in traces for e in t if isinstance(e.get("time_us"), int)]
    span = (max(times) - min(times) + 1000) if times else 0
    no_addr = {"oom", "snapshot"}
    shared = {}

    def stack_list(frames):
        key = tuple(id(fr) for fr in frames)
        got = shared.get(key)
        if got is None:
            got = shared[key] = list(frames)
        return got

    def repetition(k):
        lists = {}  # id(source list) -> this repetition's list

        def fresh(frames):
            if shared_lists:
                return stack_list(frames)
            got = lists.get(id(frames))
            if got is None:
                got = lists[id(frames)] = [dict(fr) for fr in frames] if unshared_frames else list(frames)
            return got

        def move(a):
            return a + k * shift

        trs = []
        for t in traces:
            nt = []
            for e in t:
                ne = dict(e)
                if e.get("addr") and e.get("action") not in no_addr:
                    ne["addr"] = move(e["addr"])
                if "stream" in e:
                    ne["stream"] = e["stream"] + k
                if isinstance(e.get("time_us"), int):
                    ne["time_us"] = e["time_us"] + k * span
                if "frames" in e:
                    ne["frames"] = fresh(e["frames"])
                nt.append(ne)
            trs.append(nt)
        segs = []
        for s in segments:
            ns = dict(s)
            ns["address"] = move(s["address"])
            ns["stream"] = s.get("stream", 0) + k
            if "frames" in s:
                ns["frames"] = fresh(s["frames"])
            blocks = []
            for b in s.get("blocks", []):
                nb = dict(b)
                if "address" in b:
                    nb["address"] = move(b["address"])
                if "frames" in b:
                    nb["frames"] = fresh(b["frames"])
                blocks.append(nb)
            ns["blocks"] = blocks
            segs.append(ns)
        notes = []
        for a in snap.get("external_annotations", []) or []:
            na = dict(a)
            if isinstance(a.get("time_us"), int):
                na["time_us"] = a["time_us"] + k * span
            notes.append(na)
        return segs, trs, notes

    def build(reps):
        out_snap = dict(snap)
        out_snap["segments"] = []
        out_snap["device_traces"] = [[] for _ in traces]
        if "external_annotations" in snap:
            out_snap["external_annotations"] = []
        for k in range(reps):
            segs, trs, notes = repetition(k)
            out_snap["segments"].extend(segs)
            for d, t in enumerate(trs):
                out_snap["device_traces"][d].extend(t)
            if "external_annotations" in snap:
                out_snap["external_annotations"].extend(notes)
        return out_snap

    def size(snap):
        return len(json.dumps(snap)) if as_json else len(pickle.dumps(snap, protocol=4))

    one = size(build(1))
    shared.clear()
    two = size(build(2))
    shared.clear()
    per = max(1, two - one)
    reps = max(1, round((target - (one - per)) / per))
    big = build(reps)
    if as_json:
        with open(out, "w") as f:
            json.dump(big, f)
    else:
        with open(out, "wb") as f:
            pickle.dump(big, f, protocol=4)
    entries = sum(len(t) for t in big["device_traces"])
    print(f"{out}: {reps} repetitions of {src}, {entries} trace entries", file=sys.stderr)


def refuse(msg):
    """A wrong command line: say so, with the usage, and write nothing (an option taken for the
    output path once wrote a 218 MB file named `--help` into the checkout)."""
    sys.exit(f"gen_snapshot.py: {msg}\n{__doc__}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        refuse("no output path")
    if sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)

if __name__ == "__main__" and sys.argv[1] == "--scale":
    args = sys.argv[2:]
    shared_lists = "--shared-lists" in args
    unshared_frames = "--unshared-frames" in args
    as_json = "--json" in args
    args = [a for a in args if a not in ("--shared-lists", "--unshared-frames", "--json")]
    target = 250 * 10**6
    if "--target-bytes" in args:
        i = args.index("--target-bytes")
        target = parse_bytes(args[i + 1])
        del args[i : i + 2]
    if len(args) != 2 or any(a.startswith("-") for a in args):
        refuse(f"--scale takes SRC.pickle OUT.pickle and the options above, not {args}")
    scale(args[0], args[1], target, shared_lists, unshared_frames, as_json)
    sys.exit(0)


out = sys.argv[1]
if out.startswith("-"):
    refuse(f"unknown option {out}")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
rng = random.Random(7)

user = [f"/home/user/proj/model/layer_{i}.py" for i in range(40)] + ["/home/user/proj/train.py"]
torch = [f"/opt/conda/lib/python3.11/site-packages/torch/nn/modules/m{i}.py" for i in range(60)]
native = [{"name": f"c10::cuda::CUDACachingAllocator::fn{i}()", "filename": "??", "line": 0} for i in range(3000)]
py = [{"name": f"forward_{i}", "filename": rng.choice(user + torch), "line": rng.randint(1, 900)} for i in range(4000)]
stacks = []
for _ in range(12000):
    depth = rng.randint(20, 60)
    st = []
    for _ in range(depth):
        st.append(rng.choice(native) if rng.random() < 0.75 else rng.choice(py))
    stacks.append(st)

trace = []
live = []
addr = 0x7F0000000000
t = 1_760_000_000_000_000
while len(trace) < n:
    t += rng.randint(1, 50)
    if live and rng.random() < 0.45:
        a, size, st = live.pop(rng.randrange(len(live)))
        free_stack = list(rng.choice(stacks))  # a fresh list, shared by the pair
        for action in ("free_requested", "free_completed"):
            trace.append({"action": action, "addr": a, "size": size, "stream": 0, "time_us": t,
                          "frames": free_stack, "compile_context": "".join(["N/", "A"]),
                          "user_metadata": ""})
    else:
        size = rng.choice([512, 4096, 65536, 1 << 20, 3 << 20, 1 << 24])
        st = rng.choice(stacks)
        addr += size
        live.append((addr, size, st))
        trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t,
                      "frames": list(st), "compile_context": "".join(["N/", "A"]), "user_metadata": ""})

segments = []
base = 0x7E0000000000
for s in range(800):
    blocks = []
    a = base + s * (1 << 27)
    for b in range(24):
        state = rng.choice(["active_allocated", "active_allocated", "inactive"])
        blocks.append({"address": a + b * (1 << 22), "size": 1 << 22, "requested_size": (1 << 22) - 512,
                       "state": state, "frames": rng.choice(stacks) if state != "inactive" else []})
    segments.append({"device": 0, "address": a, "total_size": 24 << 22, "allocated_size": 0, "active_size": 0,
                     "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                     "is_expandable": False, "frames": [], "blocks": blocks})

snap = {"segments": segments, "device_traces": [trace],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False}}
with open(out, "wb") as f:
    pickle.dump(snap, f)
