"""The `memlsp` wheel's Python side: where its binary is, for `python -m memlsp`.

The wheel installs the `memlsp` binary into the environment's scripts folder (`bin/` or
`Scripts\\`), next to `python`. The capture helper is the separate package `memlsp_capture`
(`import memlsp_capture`); this package only finds and runs the binary.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig

__all__ = ["find_memlsp_bin"]


def find_memlsp_bin() -> str:
    """The path of the `memlsp` binary this wheel installed.

    Looked for, in order: `$MEMLSP_BIN`; the scripts folder of this interpreter's install scheme
    (a virtual environment's `bin/`, the system's or `--user`'s); `PATH`. Raises
    FileNotFoundError naming every place looked at.
    """
    exe = "memlsp" + (sysconfig.get_config_var("EXE") or "")
    env = os.environ.get("MEMLSP_BIN")
    if env:
        if os.path.isfile(env):
            return env
        raise FileNotFoundError(f"MEMLSP_BIN={env} is not a file (unset it, or point it at memlsp)")
    looked = []
    schemes = [sysconfig.get_default_scheme()] if hasattr(sysconfig, "get_default_scheme") else []
    user = {"posix": "posix_user", "nt": "nt_user"}.get(os.name)
    if sys.platform == "darwin" and sys._framework:  # type: ignore[attr-defined]
        user = "osx_framework_user"
    if user:
        schemes.append(user)
    for scheme in schemes:
        try:
            folder = sysconfig.get_path("scripts", scheme=scheme)
        except KeyError:
            continue
        path = os.path.join(folder, exe)
        looked.append(path)
        if os.path.isfile(path):
            return path
    # The folder of the running interpreter (a venv's bin/ when sysconfig disagrees).
    path = os.path.join(os.path.dirname(sys.executable), exe)
    looked.append(path)
    if os.path.isfile(path):
        return path
    found = shutil.which(exe)
    if found:
        return found
    looked.append("PATH")
    raise FileNotFoundError(
        f"memlsp binary not found (looked at {', '.join(looked)}); "
        "reinstall with `pip install memlsp` or set MEMLSP_BIN"
    )
