#!/usr/bin/env bash
# The `memlsp` wheel as a new user gets it (issue 30). Called by .ci/run after the editor tests;
# also runs alone. Builds the wheel with maturin from the root pyproject.toml, installs it into a
# NEW virtual environment with no Rust on PATH, and from that install runs: `memlsp --version`,
# `memlsp report` on a real snapshot of ../shared (compared with the cargo-built binary),
# `python -m memlsp`, `uvx --from WHEEL memlsp` (offline), `import memlsp_capture`, the notebook
# (executed headless with nbclient), the pre-commit hook, action.yml's steps and docs/RANKS.md's
# Ray recipe on a real local Ray cluster.
#
# The wheel is built with the dev profile by default: that reuses the debug binary the tests
# already built (maturin runs the same `cargo build`), so this stage costs seconds of Rust, not a
# release build. MEMLSP_WHEEL_PROFILE=release builds what the release workflow ships.
# MEMLSP_WHEEL=PATH tests a wheel already built (python/ci.sh's, or a release one) instead.
# pip's downloads are cached under $MEMLSP_CI_CACHE/pip; the tool environment is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
export MEMLSP_CI_CACHE="${MEMLSP_CI_CACHE:-$HOME/.cache/memlsp-ci}"
export PIP_CACHE_DIR="$MEMLSP_CI_CACHE/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
SHARED="$(cd "${MEMLSP_SHARED:-$REPO/../shared}" && pwd)"
PROFILE="${MEMLSP_WHEEL_PROFILE:-dev}"
SNAPSHOT="$SHARED/torch_snapshots/real/JasperSolt__snapshot.pickle"
T0=$SECONDS
[ -f "$SNAPSHOT" ] || { echo "wheel: ERROR: $SNAPSHOT (a real snapshot) is missing" >&2; exit 1; }

echo "== wheel: maturin build --profile $PROFILE (.ci/build-wheel.sh)"
WHEEL="${MEMLSP_WHEEL:-$(MEMLSP_WHEEL_PROFILE="$PROFILE" .ci/build-wheel.sh)}"
TOOLS="$MEMLSP_CI_CACHE/wheel-tools"
echo "   $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)"
CARGO_BIN="$REPO/target/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")/memlsp"

# A new environment, and a PATH without cargo/rustc: what runs below comes from the wheel.
WORK="$(mktemp -d "${TMPDIR:-/tmp}/memlsp-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
VENV="$WORK/venv"
python3 -m venv "$VENV"
CLEAN_PATH="$VENV/bin"
for d in /usr/local/bin /usr/bin /bin; do
  [ -x "$d/cargo" ] || [ -x "$d/rustc" ] || CLEAN_PATH="$CLEAN_PATH:$d"
done
py() { env -u CARGO_HOME -u RUSTUP_HOME -u MEMLSP_BIN PATH="$CLEAN_PATH" "$VENV/bin/python" "$@"; }
inenv() { env -u CARGO_HOME -u RUSTUP_HOME -u MEMLSP_BIN PATH="$CLEAN_PATH" "$@"; }
inenv bash -c '! command -v cargo && ! command -v rustc' >/dev/null \
  || { echo "wheel: ERROR: cargo or rustc is still on the clean PATH" >&2; exit 1; }

fails=0
check() {  # check "what" command…: one line per check
  local what="$1"; shift
  if out="$("$@" 2>&1)"; then echo "ok   $what"; else echo "FAIL $what"; echo "$out" | tail -20; fails=$((fails + 1)); fi
}
same_report() {  # the installed binary's JSON report == the cargo-built binary's (same snapshot)
  diff <(inenv memlsp report "$SNAPSHOT" --format json) <("$CARGO_BIN" report "$SNAPSHOT" --format json) >/dev/null
}

echo "== wheel: a new venv, no Rust on PATH: pip install $(basename "$WHEEL")"
py -m pip install --quiet "$WHEEL"
version="$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)"
check "memlsp --version is $version (from $VENV/bin)" \
  bash -c "[ \"\$(PATH='$CLEAN_PATH' command -v memlsp)\" = '$VENV/bin/memlsp' ] && [ \"\$(PATH='$CLEAN_PATH' memlsp --version)\" = 'memlsp $version' ]"
headline="$(inenv memlsp report "$SNAPSHOT" | head -1)"
check "memlsp report on a real snapshot: ${headline:0:70}…" bash -c "[ -n '${headline//\'/}' ] && [[ '${headline//\'/}' == *'[PT004]' ]]"
check "its JSON report equals the cargo-built binary's" same_report
check "python -m memlsp report (same headline)" \
  bash -c "[ \"\$(PATH='$CLEAN_PATH' '$VENV/bin/python' -m memlsp report '$SNAPSHOT' | head -1)\" = \"\$(PATH='$CLEAN_PATH' memlsp report '$SNAPSHOT' | head -1)\" ]"
check "python -m memlsp passes the exit status on (2: unreadable capture)" \
  bash -c "PATH='$CLEAN_PATH' '$VENV/bin/python' -m memlsp report '$WORK/missing.pickle'; [ \$? -eq 2 ]"
check "import memlsp_capture from the same wheel" \
  py -c "import memlsp_capture, os; assert memlsp_capture.__file__.startswith('$VENV'), memlsp_capture.__file__; assert callable(memlsp_capture.show)"
export UV_CACHE_DIR="$MEMLSP_CI_CACHE/uv"
check "uvx --from WHEEL memlsp report (offline, its own environment)" \
  bash -c "[ \"\$(PATH='$CLEAN_PATH' '$TOOLS/bin/uvx' --offline --no-config --from '$WHEEL' memlsp report '$SNAPSHOT' | head -1)\" = '${headline//\'/}' ]"

echo "== wheel: notebook, pre-commit, action, Ray (tools from PyPI into the same venv)"
py -m pip install --quiet "nbclient==0.11.0" "nbformat==5.11.1" "ipykernel==7.4.0" "pre-commit==4.7.0" "ray==2.60.0"
check "notebook: show() and %memlsp render the report page inline (nbclient, headless)" \
  py python/tests/notebook/check_notebook.py "$SNAPSHOT" "$WORK/executed.ipynb"
check "pre-commit: .pre-commit-hooks.yaml's memlsp-check, memlsp from this install" \
  py python/tests/precommit_hook.py .pre-commit-hooks.yaml "$SNAPSHOT"
check "action.yml: install from the wheel, --check --format sarif, exit-code, fail step" \
  py python/tests/action_steps.py action.yml "$WHEEL" "$SNAPSHOT"
check "docs/RANKS.md's Ray recipe on a real local Ray cluster (ray.init())" \
  py python/tests/ray_recipe.py "$SHARED"

echo "== wheel: $fails failed ($((SECONDS - T0)) s)"
[ "$fails" -eq 0 ]
