"""memlsp-capture: take GPU memory captures that memlsp can explain line by line.

Two entry points, each a context manager with a per-step hook::

    import memlsp_capture

    # PyTorch: enter BEFORE building the model, so parameters get their stacks too.
    with memlsp_capture.torch("caps/", steps=(1, 10)) as cap:
        model = build_model().cuda()
        for step, batch in enumerate(loader, 1):
            ...
            optimizer.step()
            cap.step()      # caps/snapshot_step1.pickle, caps/snapshot_step10.pickle

    # JAX: trace warm steps 2..4 (step 1 compiles), plus the compiler's memory analysis.
    with memlsp_capture.jax("caps/", steps=(2, 4)) as cap:
        train_step = cap.watch(train_step)
        for step in range(1, 5):
            params, opt_state, loss = train_step(params, opt_state, batch)
            cap.step(loss)

Then run ``memlsp report caps/``, or in a notebook ``memlsp_capture.show("caps/")`` (or the
``%memlsp caps/`` line magic): the report page inline.

Importing this package imports neither torch nor jax; each is imported when its capture starts.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional, Tuple

from ._files import CaptureWarning
from .jax_capture import MEMORY_ANALYSIS_SCHEMA, JaxCapture
from .notebook import Report, load_ipython_extension, show
from .notebook import _register_if_in_ipython
from .torch_capture import PICKLE_PROTOCOL, TorchCapture

__version__ = "0.1.0"

__all__ = [
    "torch",
    "jax",
    "TorchCapture",
    "JaxCapture",
    "CaptureWarning",
    "MEMORY_ANALYSIS_SCHEMA",
    "PICKLE_PROTOCOL",
    "show",
    "Report",
    "load_ipython_extension",
    "__version__",
]

_register_if_in_ipython()  # `%memlsp` in a notebook once memlsp_capture is imported


def torch(
    out_dir: "os.PathLike[str] | str",
    steps: Iterable[int] = (1, 10),
    on_oom: bool = True,
    max_entries: int = 100_000,
    stacks: str = "python",
    context: Optional[str] = "all",
) -> TorchCapture:
    """Record PyTorch's CUDA allocator history and write snapshots for memlsp.

    On entry (or ``start()``): ``torch.cuda.memory._record_memory_history(enabled="all",
    context=context, stacks=stacks, max_entries=max_entries)`` and, with ``on_oom``, an OOM
    observer. Enter it before the model is built: allocations made before recording starts
    have no stack, so memlsp cannot say which line made them.

    ``cap.step()`` at the end of each step (after ``optimizer.step()``) counts steps from 1 and
    writes ``snapshot_step{k}.pickle`` after each step ``k`` listed in ``steps`` (any number
    of them; the default dumps after the first step and after step 10, a pair memlsp can diff
    to see growth). ``cap.step(k)`` sets the step number explicitly; ``cap.dump("label")``
    writes ``snapshot_label.pickle`` now.

    The first CUDA out-of-memory error writes ``snapshot_oom.pickle`` (once per capture), at
    the moment of the failure, before ``OutOfMemoryError`` reaches your code.

    On exit (or ``stop()``): history is switched off (``enabled=None``).

    * ``stacks="python"`` keeps Python frames only: C++ symbolisation at dump time is what
      makes ``stacks="all"`` dumps take minutes on big runs, and memlsp needs Python lines.
    * ``max_entries`` bounds the trace ring buffer (each entry costs host memory; the oldest
      are overwritten).
    * With ``torch.distributed`` initialised (or ``RANK``/``WORLD_SIZE>1`` set by the launcher)
      names get a ``rank{r}_`` prefix: ``rank3_snapshot_step10.pickle``.
    * An existing file is never replaced: the new one is written as ``snapshot_step1-2.pickle``
      (with a :class:`CaptureWarning`).
    * Snapshots are pickled with protocol 4 (what ``_dump_snapshot`` writes up to Python 3.13;
      pytorch.org/memory_viz cannot read protocol 5).
    * Older ``_record_memory_history`` signatures are handled: arguments the installed torch
      lacks are left out with a :class:`CaptureWarning`; torch 2.0's bool form is used there.
    """
    return TorchCapture(
        out_dir, steps=steps, on_oom=on_oom, max_entries=max_entries, stacks=stacks, context=context
    )


def jax(
    out_dir: "os.PathLike[str] | str",
    steps: Tuple[int, int] = (2, 4),
    memory_profile: bool = True,
) -> JaxCapture:
    """Trace a window of warm JAX steps for memlsp.

    ``steps=(first, last)`` is an inclusive range of steps counted from 1. ``cap.step()`` at
    the end of each step starts ``jax.profiler.start_trace(out_dir)`` once step ``first - 1``
    has finished (so the default skips step 1, which compiles) and stops the trace after step
    ``last``. Pass the step's outputs, ``cap.step(loss)``, so the boundaries wait for the
    device to finish that step (otherwise all live arrays are waited for). The trace lands in
    ``out_dir/plugins/profile/<run>/<host>.xplane.pb``; leaving the block early (an exception,
    an OOM) stops and writes it too.

    Beside the ``.xplane.pb``:

    * ``memory_analysis.json``: ``jitted.lower(*args).compile().memory_analysis()`` for every
      function given to ``cap.save_memory_analysis(jitted, *args)`` or wrapped with
      ``train_step = cap.watch(train_step)`` (analysed at its first call);
    * ``memory_before.prof`` / ``memory_after.prof`` (``memory_profile=True``): pprof
      profiles of the live device buffers when the trace starts and when it stops (a growth
      between them that the compiled plan cannot explain is a leak in your Python code).

    With several JAX processes, side files get a ``process{i}_`` prefix.
    """
    return JaxCapture(out_dir, steps=steps, memory_profile=memory_profile)
