"""JAX: a profiler trace of a few warm steps, the compiled plan's memory analysis, and device
memory profiles before and after the traced steps.

What it drives (public JAX APIs):

* ``jax.profiler.start_trace(out_dir)`` / ``stop_trace()``: writes
  ``out_dir/plugins/profile/<run>/<host>.xplane.pb`` (the HLO modules with their buffer
  assignment, and on GPU the BFC allocator's events) when the trace stops.
* ``jitted.lower(*args).compile().memory_analysis()``: the compiler's own byte counts for one
  compiled module (arguments, outputs, aliases, temporaries, generated code).
* ``jax.profiler.device_memory_profile()``: a pprof profile of the live device buffers.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._files import ensure_dir, replace_own, warn, write_new

log = logging.getLogger("memlsp_capture")

MEMORY_ANALYSIS_SCHEMA = "memlsp-capture/memory-analysis/1"


class JaxCapture:
    """Created by :func:`memlsp_capture.jax`; see there."""

    def __init__(
        self,
        out_dir: "os.PathLike[str] | str",
        steps: Tuple[int, int] = (2, 4),
        memory_profile: bool = True,
    ) -> None:
        self.out_dir = os.fspath(out_dir)
        if isinstance(steps, int):
            steps = (steps, steps)
        steps = tuple(steps)
        if (
            len(steps) != 2
            or not all(isinstance(s, int) for s in steps)
            or not 1 <= steps[0] <= steps[1]
        ):
            raise ValueError(f"steps must be (first, last) with 1 <= first <= last, got {steps!r}")
        self.first, self.last = steps
        self.memory_profile = bool(memory_profile)

        self.step_count = 0
        self.tracing = False
        self.traced = False
        #: ``out_dir/plugins/profile/<run>`` once the trace is written
        self.run_dir: Optional[str] = None
        #: the ``*.xplane.pb`` files of this capture's run
        self.xplane_files: List[str] = []
        #: every file this capture wrote
        self.files: List[str] = []
        self._analyses: List[Dict[str, Any]] = []
        self._analysis_file: Optional[str] = None
        self._before_profile: Optional[bytes] = None
        self._jax: Any = None
        self._runs_before: set = set()

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> "JaxCapture":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(_exception=exc)

    def stop(self, _exception: Optional[BaseException] = None) -> None:
        """Stop the trace if it is still running and write what is pending. Also runs when the
        block ends with an exception (an OOM, typically): the trace so far is the evidence."""
        if self.tracing:
            if _exception is None:
                warn(
                    f"the block ended after step {self.step_count}, before step {self.last}: "
                    "the trace is stopped and written now"
                )
            self._stop_trace(outputs=())
        self._write_pending()

    # ------------------------------------------------------------------ API

    def start(self) -> "JaxCapture":
        """Prepare the capture; the trace starts right away only when ``steps`` starts at 1."""
        ensure_dir(self.out_dir)
        self._jax = importlib.import_module("jax")
        if self.first == 1:
            warn(
                "steps start at 1: the trace includes the first call, which compiles; "
                "the capture gets larger and the compile time shows up in it"
            )
            self._start_trace()
        return self

    def step(self, *outputs: Any) -> None:
        """Call once at the end of every step. Pass the step's outputs (e.g. the loss) so that
        the trace starts and stops only when the device has really finished that work; without
        them every live array is waited for at those two points."""
        self.step_count += 1
        if not self.tracing and not self.traced and self.step_count == self.first - 1:
            self._block(outputs)
            self._start_trace()
        elif self.tracing and self.step_count >= self.last:
            self._stop_trace(outputs)
            self._write_pending()

    def save_memory_analysis(self, fn: Callable, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        """Record ``fn.lower(*args, **kwargs).compile().memory_analysis()`` in
        ``memory_analysis.json`` (beside the ``.xplane.pb`` once the trace is written).
        ``fn`` is a ``jax.jit`` function (a plain function is jitted first). Returns the entry."""
        jax = self._jax or importlib.import_module("jax")
        self._jax = jax
        jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        args, kwargs = _alive_or_avals(jax, (args, kwargs))
        compiled = jitted.lower(*args, **kwargs).compile()
        stats = compiled.memory_analysis()
        if stats is None:
            raise RuntimeError(f"{_name(fn)}: this backend gives no memory_analysis()")
        entry: Dict[str, Any] = {"module": _module_name(compiled), "function": _name(fn)}
        entry.update(_source(fn))
        for attr in sorted(dir(stats)):
            if attr.endswith("_in_bytes"):
                value = getattr(stats, attr, None)
                if isinstance(value, int):
                    entry[attr] = value
        donate = getattr(compiled, "donate_argnums", None)
        if donate is not None:
            try:
                entry["donate_argnums"] = sorted(int(i) for i in donate)
            except TypeError:
                pass
        self._analyses.append(entry)
        if self._analysis_file is not None or self.traced:
            self._write_analysis()
        return entry

    def watch(self, fn: Callable) -> Callable:
        """Wrap a jitted function so that its first call saves its memory analysis (taken
        before the call, while donated arguments are still alive). Use the wrapper in the loop:
        ``train_step = cap.watch(train_step)``."""
        done = False

        def watched(*args: Any, **kwargs: Any) -> Any:
            nonlocal done
            if not done:
                done = True
                try:
                    self.save_memory_analysis(fn, *args, **kwargs)
                except Exception as e:
                    warn(f"memory_analysis of {_name(fn)} failed: {type(e).__name__}: {e}")
            return fn(*args, **kwargs)

        watched.__wrapped__ = fn  # type: ignore[attr-defined]
        watched.__name__ = getattr(fn, "__name__", "watched")
        return watched

    # ------------------------------------------------------------------ internals

    def _start_trace(self) -> None:
        jax = self._jax
        self._runs_before = set(_runs(self.out_dir))
        if self.memory_profile:
            self._before_profile = _memory_profile(jax)
        try:
            jax.profiler.start_trace(self.out_dir)
        except Exception as e:  # e.g. another trace is already running
            warn(f"jax.profiler.start_trace failed, nothing is traced: {type(e).__name__}: {e}")
            self.traced = True  # do not try again
            return
        self.tracing = True
        log.info("memlsp-capture: tracing from step %d into %s", self.step_count + 1, self.out_dir)

    def _stop_trace(self, outputs: Sequence[Any]) -> None:
        jax = self._jax
        try:
            self._block(outputs)
        finally:
            self.tracing = False
            self.traced = True
            jax.profiler.stop_trace()
        new_runs = sorted(set(_runs(self.out_dir)) - self._runs_before)
        # Two captures within one second share jax's run folder name; take the newest then.
        run = new_runs[-1] if new_runs else _newest_run(self.out_dir)
        if run is None:
            warn(f"the profiler wrote no run folder under {self.out_dir}/plugins/profile")
            return
        self.run_dir = run
        self.xplane_files = sorted(
            os.path.join(run, n) for n in os.listdir(run) if n.endswith(".xplane.pb")
        )
        self.files.extend(self.xplane_files)
        log.info("memlsp-capture: trace of steps %d-%d in %s", self.first, self.step_count, run)
        if self.memory_profile:
            after = _memory_profile(jax)
            for name, data in (("memory_before.prof", self._before_profile), ("memory_after.prof", after)):
                if data is not None:
                    self.files.append(write_new(run, self._prefix() + name, _bytes_writer(data)))

    def _write_pending(self) -> None:
        if self._analyses:
            self._write_analysis()

    def _write_analysis(self) -> None:
        jax = self._jax
        doc = {
            "schema": MEMORY_ANALYSIS_SCHEMA,
            "jax_version": getattr(jax, "__version__", None),
            "jaxlib_version": _jaxlib_version(),
            "backend": _safe(lambda: jax.default_backend()),
            "device_kind": _safe(lambda: jax.devices()[0].device_kind),
            "process_index": _safe(lambda: jax.process_index()),
            "trace_steps": [self.first, self.last],
            "xplane": [os.path.basename(p) for p in self.xplane_files],
            "modules": self._analyses,
        }
        text = json.dumps(doc, indent=2, sort_keys=False) + "\n"

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)

        if self._analysis_file is None:
            directory = self.run_dir or self.out_dir
            if self.run_dir is None:
                warn(f"no trace was written; memory_analysis.json goes to {self.out_dir}")
            self._analysis_file = write_new(directory, self._prefix() + "memory_analysis.json", write)
            self.files.append(self._analysis_file)
        else:
            replace_own(self._analysis_file, write)

    def _block(self, outputs: Sequence[Any]) -> None:
        jax = self._jax
        try:
            if outputs:
                jax.block_until_ready(outputs)
            else:
                jax.block_until_ready(jax.live_arrays())
        except Exception as e:
            warn(f"could not wait for the device: {type(e).__name__}: {e}")

    def _prefix(self) -> str:
        jax = self._jax
        if _safe(lambda: jax.process_count(), 1) > 1:
            return f"process{jax.process_index()}_"
        return ""


# ---------------------------------------------------------------------- helpers


def _runs(out_dir: str) -> List[str]:
    root = os.path.join(out_dir, "plugins", "profile")
    if not os.path.isdir(root):
        return []
    return [os.path.join(root, n) for n in os.listdir(root) if os.path.isdir(os.path.join(root, n))]


def _newest_run(out_dir: str) -> Optional[str]:
    runs = _runs(out_dir)
    return max(runs, key=os.path.getmtime) if runs else None


def _memory_profile(jax: Any) -> Optional[bytes]:
    try:
        return jax.profiler.device_memory_profile()
    except Exception as e:
        warn(f"jax.profiler.device_memory_profile failed: {type(e).__name__}: {e}")
        return None


def _bytes_writer(data: bytes) -> Callable[[str], None]:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    return write


def _alive_or_avals(jax: Any, tree: Any) -> Any:
    """Donated (deleted) arrays cannot be lowered with; their shape/dtype/sharding can."""

    def conv(a: Any) -> Any:
        if isinstance(a, jax.Array) and a.is_deleted():
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
        return a

    return jax.tree_util.tree_map(conv, tree)


def _module_name(compiled: Any) -> Optional[str]:
    try:
        return compiled.runtime_executable().hlo_modules()[0].name
    except Exception:
        pass
    try:
        first = compiled.as_text().split("\n", 1)[0]  # "HloModule jit_train_step, ..."
        return first.split()[1].rstrip(",")
    except Exception:
        return None


def _name(fn: Any) -> str:
    inner = getattr(fn, "__wrapped__", fn)
    return getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or repr(fn)


def _source(fn: Any) -> Dict[str, Any]:
    inner = inspect.unwrap(fn) if callable(fn) else fn
    try:
        file = inspect.getsourcefile(inner)
        _, line = inspect.getsourcelines(inner)
        return {"file": file, "line": line}
    except (TypeError, OSError):
        return {}


def _jaxlib_version() -> Optional[str]:
    try:
        return importlib.import_module("jaxlib").__version__
    except Exception:
        return None


def _safe(fn: Callable[[], Any], default: Any = None) -> Any:
    try:
        return fn()
    except Exception:
        return default
