"""Writing capture files without ever replacing one that is already there."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Callable, Optional

log = logging.getLogger("memlsp_capture")


class CaptureWarning(UserWarning):
    """Something about a capture that the user should know (a fallback, a renamed file)."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def warn(message: str) -> None:
    """Warn with the location of the user's code (the first frame outside this package)."""
    level = 2  # 1 would be this function, 2 its caller
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame = frame.f_back
        level += 1
    warnings.warn(message, CaptureWarning, stacklevel=level)


def split_name(name: str) -> tuple[str, str]:
    """'snapshot_step1.pickle' -> ('snapshot_step1', '.pickle')."""
    stem, ext = os.path.splitext(name)
    return stem, ext


def reserve(directory: str, name: str) -> str:
    """Create an empty file named `name` in `directory`, or `stem-2.ext`, `stem-3.ext`, … when
    that name is taken. O_EXCL makes the reservation safe against other processes (ranks)."""
    stem, ext = split_name(name)
    n = 1
    while True:
        candidate = name if n == 1 else f"{stem}-{n}{ext}"
        path = os.path.join(directory, candidate)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            n += 1
            continue
        os.close(fd)
        if n > 1:
            warn(
                f"{os.path.join(directory, name)} already exists (an earlier run?); "
                f"writing {path} instead, the existing capture is left as it was"
            )
        return path


def write_new(directory: str, name: str, write_to: Callable[[str], None]) -> str:
    """Write a new file: `write_to(tmp_path)` produces it, then it is renamed onto a freshly
    reserved name, so a reader never sees a half-written capture under its final name and an
    existing capture is never replaced. Returns the final path."""
    path = reserve(directory, name)
    replace_own(path, write_to)
    return path


def replace_own(path: str, write_to: Callable[[str], None]) -> None:
    """Atomically (re)write a file that this process created itself."""
    directory, name = os.path.split(path)
    # The partial name does not end in a capture extension, so memlsp never picks it up.
    tmp = os.path.join(directory, f".{name}.partial-{os.getpid()}")
    try:
        write_to(tmp)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        if os.path.exists(path) and os.path.getsize(path) == 0:
            _remove_quietly(path)
        raise
    log.info("memlsp-capture: wrote %s (%s)", path, _size(path))


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _size(path: str) -> str:
    try:
        n = os.path.getsize(path)
    except OSError:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return "?"


def ensure_dir(path: "os.PathLike[str] | str") -> str:
    out = os.fspath(path)
    os.makedirs(out, exist_ok=True)
    return out


def env_rank() -> Optional[int]:
    """Rank from the launcher's environment (torchrun, SLURM via torchrun), used only when
    torch.distributed is not initialised yet but the job clearly has several ranks."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return None
    if world > 1 and os.environ.get("RANK", "").isdigit():
        return int(os.environ["RANK"])
    return None
