"""PyTorch: CUDA caching-allocator history + snapshots after chosen steps and at the first OOM.

What it drives (private but documented PyTorch APIs, see "Understanding CUDA Memory Usage"):

* ``torch.cuda.memory._record_memory_history(enabled="all", context=..., stacks=...,
  max_entries=...)`` (torch 2.1+; the 2.0 form takes a bool and ``trace_alloc_*`` arguments);
  ``enabled=None`` switches recording off again (2.0: ``False``).
* ``torch.cuda.memory._snapshot()``: the dict that ``_dump_snapshot()`` pickles.
* ``torch._C._cuda_attach_out_of_memory_observer(fn)``: ``fn(device, alloc, device_total,
  device_free)`` runs after the allocator recorded the ``oom`` trace entry and before
  ``OutOfMemoryError`` is raised, the standard place to take an OOM snapshot. Observers cannot
  be detached, so ours goes quiet once the capture is stopped.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import pickle
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ._files import CaptureWarning, ensure_dir, env_rank, warn, write_new

log = logging.getLogger("memlsp_capture")

# MemoryViz (pytorch.org/memory_viz) cannot read protocol 5, the default from Python 3.14 on;
# every real snapshot seen so far is protocol 4, which memlsp reads as well.
PICKLE_PROTOCOL = 4

_CONTEXTS = (None, "state", "alloc", "all")
_STACKS = ("python", "all")


class TorchCapture:
    """Created by :func:`memlsp_capture.torch`; see there."""

    def __init__(
        self,
        out_dir: "os.PathLike[str] | str",
        steps: Iterable[int] = (1, 10),
        on_oom: bool = True,
        max_entries: int = 100_000,
        stacks: str = "python",
        context: Optional[str] = "all",
    ) -> None:
        self.out_dir = os.fspath(out_dir)
        self.steps = _check_steps(steps)
        self.on_oom = bool(on_oom)
        if not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        self.max_entries = max_entries
        if stacks not in _STACKS:
            raise ValueError(f"stacks must be one of {_STACKS}, got {stacks!r}")
        self.stacks = stacks
        if context not in _CONTEXTS:
            raise ValueError(f"context must be one of {_CONTEXTS}, got {context!r}")
        self.context = context

        self.step_count = 0
        #: paths of every snapshot written, in order
        self.files: List[str] = []
        #: path of the OOM snapshot once written
        self.oom_file: Optional[str] = None
        self.active = False
        self._legacy = False  # torch 2.0 bool API
        self._mem: Any = None
        self._torch: Any = None
        self._oom_seen = False

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> "TorchCapture":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc is not None and self.active and self.on_oom and not self._oom_seen and _is_oom(exc):
                # The observer should have fired; this covers builds where it could not be attached.
                self._dump_oom_once(reason="OutOfMemoryError left the capture block")
        finally:
            self.stop(_exception=exc)

    # ------------------------------------------------------------------ API

    def start(self) -> "TorchCapture":
        """Switch allocator history on (and attach the OOM observer). Do this before the model
        is built, so that parameter and optimizer-state allocations carry their stacks."""
        if self.active:
            return self
        ensure_dir(self.out_dir)
        torch = importlib.import_module("torch")
        self._torch = torch
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not _call_or(getattr(cuda, "is_available", None), True):
            warn("torch.cuda is not available: memlsp_capture.torch records nothing in this process")
            return self
        self._mem = importlib.import_module("torch.cuda.memory")
        self._enable_history()
        self.active = True
        if self.on_oom:
            self._attach_oom_observer()
        return self

    def step(self, step: Optional[int] = None) -> Optional[str]:
        """Call once at the end of every training step (after ``optimizer.step()``). Dumps a
        snapshot when the step number (counted from 1, or passed explicitly) is one of
        ``steps``. Returns the path written, if any."""
        self.step_count = self.step_count + 1 if step is None else int(step)
        if self.active and self.step_count in self.steps:
            return self.dump(f"step{self.step_count}")
        return None

    def dump(self, label: str) -> Optional[str]:
        """Write ``[rank{r}_]snapshot_{label}.pickle`` now (e.g. ``cap.dump("after_eval")``)."""
        if not self.active:
            warn(f"capture is not active; snapshot {label!r} not written")
            return None
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", label):
            raise ValueError(f"label must be a plain file-name fragment, got {label!r}")
        path = write_new(self.out_dir, f"{self._prefix()}snapshot_{label}.pickle", self._write_snapshot)
        self.files.append(path)
        return path

    def stop(self, _exception: Optional[BaseException] = None) -> None:
        """Switch history off (this also frees the recorded trace). The OOM observer stays
        registered in PyTorch but does nothing from now on."""
        if not self.active:
            return
        self.active = False
        missed = sorted(s for s in self.steps if s > self.step_count)
        if missed and _exception is None and not self._oom_seen:
            warn(
                f"steps {missed} were never reached (last step seen: {self.step_count}); "
                "no snapshot for them. Is cap.step() called once per step?"
            )
        try:
            if self._legacy:
                self._mem._record_memory_history(False)
            else:
                self._mem._record_memory_history(enabled=None)
        except Exception as e:  # never mask the user's own exception
            warn(f"could not switch allocator history off: {type(e).__name__}: {e}")

    # ------------------------------------------------------------------ internals

    def _enable_history(self) -> None:
        rec = self._mem._record_memory_history
        params = _parameters(rec)
        if params is not None and "context" not in params and "trace_alloc_max_entries" in params:
            self._enable_legacy(rec)
            return
        wanted: Dict[str, Any] = {
            "enabled": "all",
            "context": self.context,
            "stacks": self.stacks,
            "max_entries": self.max_entries,
        }
        if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            for name in [k for k in wanted if k != "enabled" and k not in params]:
                del wanted[name]
                warn(_dropped_message(name))
        # A signature that hides its parameters (*args, **kwargs): learn from TypeError.
        for _ in range(len(wanted)):
            try:
                rec(**wanted)
                return
            except TypeError as e:
                bad = _unexpected_keyword(e)
                if bad is None or bad not in wanted or bad == "enabled":
                    raise
                del wanted[bad]
                warn(_dropped_message(bad))
        rec(**wanted)

    def _enable_legacy(self, rec: Any) -> None:
        self._legacy = True
        warn(
            "this torch has the 2.0 form of _record_memory_history (a bool and trace_alloc_* "
            "arguments): using it; stacks are the alloc stacks only and free events carry none"
        )
        rec(
            True,
            record_context=self.context is not None,
            trace_alloc_max_entries=self.max_entries,
            trace_alloc_record_context=self.context in ("alloc", "all"),
        )

    def _attach_oom_observer(self) -> None:
        attach = getattr(getattr(self._torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            warn(
                "torch._C._cuda_attach_out_of_memory_observer is missing: no snapshot at the "
                "moment of an OOM (one is still written if OutOfMemoryError leaves the block)"
            )
            return

        def observer(device: int, alloc: int, device_total: int, device_free: int) -> None:
            # Runs inside the allocator before OutOfMemoryError is raised: it must not raise.
            try:
                if self.active and not self._oom_seen:
                    self._dump_oom_once(
                        reason=(
                            f"CUDA OOM on device {device}: {alloc} B requested, "
                            f"{device_free} B free of {device_total} B"
                        )
                    )
            except BaseException as e:  # noqa: BLE001 - see above
                log.warning("memlsp-capture: OOM snapshot failed: %s: %s", type(e).__name__, e)

        attach(observer)

    def _dump_oom_once(self, reason: str) -> None:
        self._oom_seen = True
        path = write_new(self.out_dir, f"{self._prefix()}snapshot_oom.pickle", self._write_snapshot)
        self.files.append(path)
        self.oom_file = path
        log.warning("memlsp-capture: %s; wrote %s (memlsp report %s)", reason, path, path)

    def _write_snapshot(self, tmp: str) -> None:
        mem = self._mem
        if hasattr(mem, "_snapshot"):
            snapshot = mem._snapshot()
            with open(tmp, "wb") as f:
                pickle.dump(snapshot, f, protocol=PICKLE_PROTOCOL)
        else:
            mem._dump_snapshot(tmp)

    def _prefix(self) -> str:
        rank = _rank(self._torch)
        return "" if rank is None else f"rank{rank}_"


def _rank(torch: Any) -> Optional[int]:
    try:
        dist = importlib.import_module("torch.distributed")
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return env_rank()


def _check_steps(steps: Iterable[int]) -> frozenset:
    if isinstance(steps, int):
        steps = (steps,)
    out = frozenset(steps)
    if not all(isinstance(s, int) and s >= 1 for s in out):
        raise ValueError(f"steps must be step numbers counted from 1, got {steps!r}")
    return out


def _parameters(fn: Any) -> Optional[Dict[str, inspect.Parameter]]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _unexpected_keyword(e: TypeError) -> Optional[str]:
    m = re.search(r"unexpected keyword argument '(\w+)'", str(e))
    return m.group(1) if m else None


def _dropped_message(name: str) -> str:
    why = {
        "stacks": (
            "C++ frames may be recorded and symbolised at dump time, which can take minutes "
            "on a large run"
        ),
        "max_entries": "the history is not bounded by max_entries here",
        "context": "free events may carry no stacks",
    }.get(name, "its default is used")
    return f"this torch's _record_memory_history has no {name!r} argument: left out ({why})"


def _is_oom(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name == "OutOfMemoryError" or "CUDA out of memory" in str(exc)


def _call_or(fn: Any, default: Any) -> Any:
    if fn is None:
        return default
    try:
        return fn()
    except Exception:
        return default


__all__: Sequence[str] = ["TorchCapture", "CaptureWarning", "PICKLE_PROTOCOL"]
