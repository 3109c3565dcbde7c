"""Write a large synthetic CUDA memory snapshot with PyTorch's sharing pattern, for benchmarks.

Usage: python3 benches/gen_snapshot.py OUT.pickle [TRACE_ENTRIES]

Shape follows torch 2.8+ `_dump_snapshot()` output (torch_snapshots/FORMAT.md) and the sharing
measured in the real snapshots of shared/torch_snapshots/real: frame dicts are built once and shared
by every stack that contains them; every `alloc` and every `free_requested` entry has its own fresh
frames list (20-60 frames, 3/4 of them C++ frames: '??', line 0), and `free_completed` shares the
list object of its `free_requested`; each trace entry carries its own `compile_context` string
object (not memoized, as in real files). Python's default pickle protocol (4), like torch.
"""
import pickle
import random
import sys

out = sys.argv[1]
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
