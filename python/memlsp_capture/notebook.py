"""The memlsp report page inline in Jupyter and VS Code notebooks: ``show()`` and ``%memlsp``.

``show("snap.pickle")`` runs the installed ``memlsp report … --format html`` (the same
self-contained page the CLI writes: inline script and style, no server, no network) and returns an
object that notebooks display as that page in an ``<iframe srcdoc>``, so the page's style and script
stay out of the notebook's own. ``%memlsp ARGS`` (after ``%load_ext memlsp_capture``, or loaded by
``import memlsp_capture`` inside IPython) is ``show`` with ``memlsp report``'s arguments. IPython
itself is never imported here: a notebook has it already.
"""

from __future__ import annotations

import html
import os
import shlex
import subprocess
from typing import List, Optional, Sequence

__all__ = ["show", "Report", "load_ipython_extension", "memlsp_magic"]


def _memlsp_bin() -> str:
    from memlsp import find_memlsp_bin  # the same wheel's binary

    return find_memlsp_bin()


class Report:
    """One rendered report page; notebooks display it inline (``_repr_html_``).

    ``html`` is the page itself (what ``memlsp report … --format html`` writes), ``args`` the
    arguments ``memlsp report`` got. ``save(path)`` writes the page to a file.
    """

    def __init__(self, page: str, args: Sequence[str], height: int = 800) -> None:
        self.html = page
        self.args = list(args)
        self.height = height

    def _repr_html_(self) -> str:
        # srcdoc keeps the page's <style> and <script> to itself; quote=True escapes the quotes.
        return (
            f'<iframe class="memlsp-report" srcdoc="{html.escape(self.html, quote=True)}" '
            f'style="width:100%;height:{int(self.height)}px;border:1px solid #d0d7de" '
            'title="memlsp report"></iframe>'
        )

    def save(self, path: "os.PathLike[str] | str") -> str:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html)
        return os.fspath(path)

    def __repr__(self) -> str:
        return f"<memlsp report {' '.join(self.args)}: {len(self.html)} bytes of HTML>"


def _report(args: List[str], height: int) -> Report:
    cmd = [_memlsp_bin(), "report", *args, "--format", "html"]
    done = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8")
    if done.returncode != 0:
        # memlsp's own one-line message (what, where, what to do).
        msg = done.stderr.strip() or f"memlsp report exited with status {done.returncode}"
        raise RuntimeError(msg)
    return Report(done.stdout, args, height)


def show(
    capture: "os.PathLike[str] | str",
    diff: "Optional[os.PathLike[str] | str]" = None,
    module: Optional[str] = None,
    height: int = 800,
) -> Report:
    """The report page of ``capture`` (a snapshot, a JAX capture, or a folder of them), to
    display inline: the last expression of a cell, or ``IPython.display.display(show(...))``.

    ``diff``: a later snapshot of the same run (what grew between them, ``--diff``); ``module``:
    the JAX module (``--module``); ``height``: the frame's height in pixels. Raises
    RuntimeError with memlsp's message when the capture cannot be read.
    """
    args = [os.fspath(capture)]
    if diff is not None:
        args += ["--diff", os.fspath(diff)]
    if module is not None:
        args += ["--module", module]
    return _report(args, height)


def memlsp_magic(line: str) -> Report:
    """``%memlsp CAPTURE [--diff LATER] [--module NAME] [--height PX]``: the page inline."""
    args = shlex.split(line, posix=os.name != "nt")
    height = 800
    if "--height" in args:
        i = args.index("--height")
        try:
            height = int(args[i + 1])
        except (IndexError, ValueError):
            raise ValueError("%memlsp: --height takes a number of pixels") from None
        del args[i : i + 2]
    if not args:
        raise ValueError("usage: %memlsp CAPTURE [--diff LATER] [--module NAME] [--height PX]")
    return _report(args, height)


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 (IPython's InteractiveShell)
    """``%load_ext memlsp_capture``: registers the ``%memlsp`` line magic."""
    ipython.register_magic_function(memlsp_magic, magic_kind="line", magic_name="memlsp")


def _register_if_in_ipython() -> None:
    """On import inside a running IPython kernel or shell, register ``%memlsp`` as well."""
    import sys

    ipy = sys.modules.get("IPython")
    if ipy is None:
        return
    try:
        shell = ipy.get_ipython()
    except Exception:  # an old or partial IPython: %load_ext still works
        return
    if shell is not None:
        load_ipython_extension(shell)
