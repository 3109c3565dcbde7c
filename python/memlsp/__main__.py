"""`python -m memlsp ARGS…`: runs the installed `memlsp` binary with ARGS (its exit status too)."""

from __future__ import annotations

import os
import subprocess
import sys

from . import find_memlsp_bin


def main() -> int:
    try:
        exe = find_memlsp_bin()
    except FileNotFoundError as e:
        print(f"memlsp: {e}", file=sys.stderr)
        return 2
    if sys.platform == "win32":
        # No exec on Windows: run it and hand its status on.
        return subprocess.run([exe, *sys.argv[1:]]).returncode
    os.execv(exe, [exe, *sys.argv[1:]])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
