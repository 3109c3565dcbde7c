#!/usr/bin/env python3
"""Random nested values pickled by CPython, with a canonical JSON description of each.

Used by tests/pickle_differential.rs: for every case it prints one JSON line
  {"case": i, "proto": p, "pickle": "<hex>", "expect": <canonical>}
The canonical form names every list and dict by a number assigned in depth-first pre-order; a
second occurrence of the same object is {"t": "ref", "id": n}, so sharing is part of what the
Rust side must reproduce. Tuples, strs, ints, … are compared by value.

usage: pickle_gen.py SEED CASES
"""
import json
import pickle
import random
import struct
import sys

ALPHABET = "abcxyz_/.: 0123456789" + "é€中文ß" + "\U0001F600" + "\n\t\x00\\'\""


def rand_str(r):
    n = r.choice([0, 1, 3, 8, 20, 70, 300])
    return "".join(r.choice(ALPHABET) for _ in range(n))


def rand_int(r):
    kind = r.randrange(8)
    if kind == 0:
        return r.randrange(256)
    if kind == 1:
        return r.randrange(-(2**31), 2**31)
    if kind == 2:
        return r.choice([2**60 - 1, 2**60, -(2**60), -(2**60) - 1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64])
    if kind == 3:
        bits = r.choice([65, 100, 127, 128, 129, 200, 1000, 3000])
        v = r.getrandbits(bits)
        return v if r.random() < 0.5 else -v
    if kind == 4:
        return r.randrange(-(2**62), 2**62)
    if kind == 5:
        return r.choice([0, -1, 255, 256, 65535, 65536, -129, -32769])
    return r.randrange(-1000, 100000)


def rand_float(r):
    return r.choice([0.0, -0.0, 1.5, -2.25, 1e308, 5e-324, float("inf"), float("-inf"),
                     float("nan"), r.random() * 1e6, -r.random(), 3.141592653589793])


class Gen:
    def __init__(self, r, proto):
        self.r = r
        self.proto = proto
        self.pool = []  # containers available for sharing
        self.budget = 3000  # values left to create in this case

    def leaf(self):
        r = self.r
        k = r.randrange(9)
        if k == 0:
            return None
        if k == 1:
            return r.random() < 0.5
        if k in (2, 3):
            return rand_int(r)
        if k == 4:
            return rand_float(r)
        if k == 5 and self.proto >= 3:
            return bytes(r.randrange(256) for _ in range(r.choice([0, 1, 5, 40, 300])))
        return rand_str(r)

    def key(self):
        return rand_str(self.r) if self.r.random() < 0.7 else rand_int(self.r)

    def value(self, depth):
        r = self.r
        if self.pool and r.random() < 0.15:
            return r.choice(self.pool)
        self.budget -= 1
        if depth <= 0 or self.budget <= 0 or r.random() < 0.35:
            return self.leaf()
        k = r.randrange(10)
        n = r.choice([0, 1, 2, 3, 4, 7])
        if depth == 1 and r.random() < 0.1:
            # Past pickle's batch size of 1000: several APPENDS / SETITEMS batches.
            n = r.choice([999, 1000, 1001, 1500])
        if k < 4:
            v = [self.value(depth - 1) for _ in range(n)]
            if r.random() < 0.2:
                # Grown after other objects exist: exercises APPEND to a list built earlier.
                v.extend(self.value(depth - 1) for _ in range(r.randrange(3)))
        elif k < 7:
            v = {}
            for _ in range(n):
                v[self.key()] = self.value(depth - 1)
        elif k < 9:
            v = tuple(self.value(depth - 1) for _ in range(min(n, 6)))
        elif self.proto >= 4:
            v = {self.key() for _ in range(min(n, 5))}
        else:
            v = self.leaf()
        if isinstance(v, (list, dict)):
            self.pool.append(v)
        return v

    def torch_like(self):
        """PyTorch's sharing: frame dicts shared inside stack lists shared across entries."""
        r = self.r
        frames = [{"filename": rand_str(r), "line": r.randrange(1, 5000), "name": rand_str(r)}
                  for _ in range(r.randrange(1, 6))]
        stacks = [[r.choice(frames) for _ in range(r.randrange(0, 5))] for _ in range(r.randrange(1, 4))]
        entries = [{"action": r.choice(["alloc", "free_requested", "free_completed"]),
                    "addr": r.randrange(2**47), "size": r.randrange(2**34),
                    "stream": 0, "frames": r.choice(stacks)}
                   for _ in range(r.randrange(0, 12))]
        segments = [{"device": 0, "address": r.randrange(2**47), "total_size": 2**21,
                     "blocks": [{"size": 512, "state": "active_allocated", "frames": r.choice(stacks)}]}
                    for _ in range(r.randrange(0, 3))]
        return {"segments": segments, "device_traces": [entries, []]}


def canon(v, ids):
    if v is None:
        return {"t": "none"}
    if isinstance(v, bool):
        return {"t": "bool", "v": v}
    if isinstance(v, int):
        return {"t": "int", "v": str(v)}
    if isinstance(v, float):
        return {"t": "float", "bits": str(struct.unpack("<Q", struct.pack("<d", v))[0])}
    if isinstance(v, str):
        return {"t": "str", "v": v}
    if isinstance(v, bytes):
        return {"t": "bytes", "hex": v.hex()}
    if isinstance(v, tuple):
        return {"t": "tuple", "items": [canon(x, ids) for x in v]}
    if isinstance(v, (set, frozenset)):
        return {"t": "set", "items": [canon(x, ids) for x in v]}
    if id(v) in ids:
        return {"t": "ref", "id": ids[id(v)]}
    ids[id(v)] = len(ids)
    me = ids[id(v)]
    if isinstance(v, list):
        return {"t": "list", "id": me, "items": [canon(x, ids) for x in v]}
    if isinstance(v, dict):
        return {"t": "dict", "id": me, "items": [[canon(k, ids), canon(x, ids)] for k, x in v.items()]}
    raise TypeError(type(v))


def main():
    seed, cases = int(sys.argv[1]), int(sys.argv[2])
    out = sys.stdout
    for i in range(cases):
        r = random.Random(seed * 1_000_003 + i)
        proto = (2, 3, 4, 5)[i % 4]
        g = Gen(r, proto)
        if i % 5 == 4:
            v = g.torch_like()
        else:
            v = g.value(r.randrange(1, 6))
            if r.random() < 0.5:
                v = [v, g.value(3), g.value(2)]
        data = pickle.dumps(v, protocol=proto)
        line = {"case": i, "proto": proto, "pickle": data.hex(), "expect": canon(v, {})}
        out.write(json.dumps(line))
        out.write("\n")


if __name__ == "__main__":
    main()
