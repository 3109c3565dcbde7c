#!/usr/bin/env bash
# What CI runs for the Python capture helper, from any directory:
#   a virtual environment outside the repository with jax 0.10.2 and the `memlsp` wheel (built from
#   the root pyproject.toml by .ci/build-wheel.sh, or $MEMLSP_WHEEL; it carries memlsp_capture),
#   then the tests with the real JAX test required.
# Reuses the environment when it is already there. Set MEMLSP_CAPTURE_VENV to put it elsewhere.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${MEMLSP_CAPTURE_VENV:-${HOME}/.cache/memlsp/venv-capture}"

cd "$here/.."   # the repository root (also keeps stray modules in the caller's folder off sys.path)

echo "== python capture helper: environment in $venv"
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
fi
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-${MEMLSP_CI_CACHE:-$HOME/.cache/memlsp-ci}/pip}"
wheel="${MEMLSP_WHEEL:-$(bash .ci/build-wheel.sh)}"
# memlsp-capture was a package of its own before the wheel carried it: an old environment loses it.
"$venv/bin/python" -m pip uninstall --quiet --yes memlsp-capture >/dev/null 2>&1 || true
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "jax==0.10.2" "jaxlib==0.10.2"
# The same version is rebuilt with each change: replace what an earlier run installed.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
"$venv/bin/python" -c 'import jax, memlsp_capture; print("jax", jax.__version__, "| memlsp_capture", memlsp_capture.__version__)'

echo "== python capture helper: tests (memlsp reads the JAX capture: ${MEMLSP_BIN:=$PWD/target/debug/memlsp})"
[ -x "$MEMLSP_BIN" ] || cargo build --quiet --bin memlsp
export MEMLSP_BIN
MEMLSP_REQUIRE_SHARED=1 "$venv/bin/python" - <<'PY'
import sys
import unittest

suite = unittest.defaultTestLoader.discover("python/tests", top_level_dir="python/tests")
result = unittest.TextTestRunner(verbosity=2).run(suite)
failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
skipped = len(result.skipped)
passed = result.testsRun - failed - skipped - len(result.expectedFailures)
print(f"memlsp_capture: {passed} passed, {failed} failed, {skipped} skipped")
sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
PY
