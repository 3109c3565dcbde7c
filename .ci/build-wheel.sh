#!/usr/bin/env bash
# Build the `memlsp` wheel (root pyproject.toml, maturin `bindings = "bin"`) and print its path.
# Used by python/ci.sh and .ci/wheel.sh. The dev profile by default: maturin runs the same
# `cargo build --bin memlsp` as the tests, so it reuses that binary instead of a release build
# (MEMLSP_WHEEL_PROFILE=release for what the release workflow ships). maturin and uv are pinned in
# a tool environment under $MEMLSP_CI_CACHE/wheel-tools, reused between runs.
#
#   WHEEL="$(.ci/build-wheel.sh)"      # target/wheels-ci/memlsp-<version>-py3-none-linux_<arch>.whl
set -euo pipefail
cd "$(dirname "$0")/.."
export MEMLSP_CI_CACHE="${MEMLSP_CI_CACHE:-$HOME/.cache/memlsp-ci}"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$MEMLSP_CI_CACHE/pip}"
TOOLS="$MEMLSP_CI_CACHE/wheel-tools"
PINS="maturin==1.16.0 uv==0.13.9"
if [ "$(cat "$TOOLS/.pins" 2>/dev/null)" != "$PINS" ] || [ ! -x "$TOOLS/bin/maturin" ]; then
  rm -rf "$TOOLS"
  mkdir -p "$MEMLSP_CI_CACHE"
  python3 -m venv "$TOOLS" >&2
  # shellcheck disable=SC2086
  "$TOOLS/bin/pip" install --quiet --disable-pip-version-check $PINS >&2
  echo "$PINS" > "$TOOLS/.pins"
fi
DIST="$PWD/target/wheels-ci"
rm -rf "$DIST"
# --compatibility linux: a plain linux tag for this machine's test install (the release workflow
# builds manylinux wheels in manylinux containers).
nice -n 10 "$TOOLS/bin/maturin" build --quiet --profile "${MEMLSP_WHEEL_PROFILE:-dev}" \
  --compatibility linux -o "$DIST" >&2
ls "$DIST"/memlsp-*.whl
