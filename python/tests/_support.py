"""Shared by the tests: import memlsp_capture from this source tree, not from site-packages."""

import os
import sys

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[:1] != [PYTHON_DIR]:
    sys.path.insert(0, PYTHON_DIR)

for name in [m for m in sys.modules if m == "memlsp_capture" or m.startswith("memlsp_capture.")]:
    if not (getattr(sys.modules[name], "__file__", "") or "").startswith(PYTHON_DIR):
        del sys.modules[name]
