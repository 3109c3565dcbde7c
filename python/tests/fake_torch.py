"""A stand-in for the parts of torch that memlsp_capture.torch touches, recording every call.

It follows the real signatures: `_record_memory_history` of torch 2.1+ (`enabled`, `context`,
`stacks`, `max_entries`, …, with `__signature__` set as torch does), one without `stacks`,
one that hides its parameters behind `*args, **kwargs`, and torch 2.0's bool form.
"""

import sys
import types
from inspect import signature
from unittest import mock


class FakeTorch:
    def __init__(self, flavour="2.11", rank=None, cuda_available=True, has_observer=True):
        self.events = []  # ("record", kwargs) | ("snapshot", n) | ("attach", fn)
        self.history = None  # what recording is on, as the allocator would know it
        self.observers = []
        self.snapshots = 0
        self.fail_snapshot = False

        torch = types.ModuleType("torch")
        torch.__version__ = flavour
        cuda = types.ModuleType("torch.cuda")
        memory = types.ModuleType("torch.cuda.memory")
        C = types.ModuleType("torch._C")
        dist = types.ModuleType("torch.distributed")
        torch.cuda, torch._C, torch.distributed, cuda.memory = cuda, C, dist, memory

        cuda.is_available = lambda: cuda_available
        dist.is_available = lambda: True
        dist.is_initialized = lambda: rank is not None
        dist.get_rank = lambda: rank

        memory._record_memory_history = self._make_record(flavour)
        memory._snapshot = self._snapshot
        if has_observer:
            C._cuda_attach_out_of_memory_observer = self._attach

        self.modules = {
            "torch": torch,
            "torch.cuda": cuda,
            "torch.cuda.memory": memory,
            "torch._C": C,
            "torch.distributed": dist,
        }

    # ------------------------------------------------------------------ installation

    def installed(self):
        """`with fake.installed():` puts the stand-in in sys.modules and takes it out again."""
        return mock.patch.dict(sys.modules, self.modules)

    # ------------------------------------------------------------------ recorded calls

    def records(self):
        return [e[1] for e in self.events if e[0] == "record"]

    def _set(self, call):
        self.events.append(("record", call))
        enabled = call.get("enabled")
        self.history = None if enabled in (None, False) else call

    def _make_record(self, flavour):
        fake = self

        if flavour == "2.0":
            def _record_memory_history(enabled, record_context=True, trace_alloc_max_entries=1,
                                       trace_alloc_record_context=False, device=None,
                                       _enable_expensive_cpp=False):
                if not isinstance(enabled, bool):
                    raise TypeError("enabled must be a bool in torch 2.0")
                fake._set(dict(enabled=enabled, record_context=record_context,
                               trace_alloc_max_entries=trace_alloc_max_entries,
                               trace_alloc_record_context=trace_alloc_record_context))
            return _record_memory_history

        if flavour == "nostacks":
            # A build whose recorder predates `stacks` (vendor forks, patched builds).
            def _record_memory_history(enabled="all", context="all", max_entries=sys.maxsize,
                                       device=None):
                fake._set(dict(enabled=enabled, context=context, max_entries=max_entries))
            return _record_memory_history

        def _impl(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                  device=None, clear_history=False, compile_context=False,
                  global_record_annotations=False, skip_actions=None):
            fake._set(dict(enabled=enabled, context=context, stacks=stacks,
                           max_entries=max_entries))

        def _record_memory_history(enabled="all", *args, **kwargs):
            if isinstance(enabled, bool):
                raise AssertionError("the legacy bool form is not expected here")
            return _impl(enabled, *args, **kwargs)

        if flavour == "varkw-nostacks":
            # Parameters hidden behind *args/**kwargs and no `stacks` in the implementation:
            # only a TypeError tells.
            def _impl_nostacks(enabled="all", context="all", max_entries=sys.maxsize, device=None):
                fake._set(dict(enabled=enabled, context=context, max_entries=max_entries))

            def _record_memory_history(enabled="all", *args, **kwargs):  # noqa: F811
                return _impl_nostacks(enabled, *args, **kwargs)
            return _record_memory_history

        # torch 2.1 … 2.11: the public function advertises the implementation's signature.
        _record_memory_history.__signature__ = signature(_impl)
        return _record_memory_history

    def _snapshot(self, device=None):
        if self.fail_snapshot:
            raise RuntimeError("snapshot failed on purpose")
        self.snapshots += 1
        self.events.append(("snapshot", self.snapshots))
        return {
            "segments": [],
            "device_traces": [[{"action": "alloc", "addr": 1, "size": 512, "stream": 0,
                                "frames": [{"name": "f", "filename": "train.py", "line": 3}]}]],
            "fake_index": self.snapshots,
            "recording": dict(self.history) if self.history else None,
        }

    def _attach(self, fn):
        self.events.append(("attach", fn))
        self.observers.append(fn)

    def oom(self, device=0, alloc=1 << 30, total=80 << 30, free=1 << 20):
        """What the caching allocator does on a failed allocation: run every observer."""
        for fn in self.observers:
            fn(device, alloc, total, free)
