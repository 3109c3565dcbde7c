#!/usr/bin/env bash
# memlsp's MCP server driven by the official Python MCP client SDK (`mcp` on PyPI, pinned in
# tests/mcp/requirements.txt): installs the SDK into a venv under the CI cache (reused while the
# requirements are unchanged), then runs tests/mcp/sdk_client.py, which prints one line per check
# and `N passed, N failed`. Called by .ci/run; never skips: it fails when it cannot install the
# SDK, find the binary or the real captures, or when a check fails.
#
#   bash tests/mcp/run.sh [MEMLSP]     # default: target/debug/memlsp
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
MEMLSP="${1:-$REPO/target/debug/memlsp}"
CACHE="${MEMLSP_CI_CACHE:-$HOME/.cache/memlsp-ci}"
SHARED="${MEMLSP_SHARED:-$REPO/../shared}"
REQ="$REPO/tests/mcp/requirements.txt"
VENV="$CACHE/mcp-venv"
STAMP="$VENV/.requirements.sha256"

if [ ! -x "$MEMLSP" ]; then
  echo "mcp: ERROR: $MEMLSP is not an executable memlsp (build it with cargo build)" >&2
  exit 1
fi
if [ ! -f "$SHARED/README.md" ]; then
  echo "mcp: ERROR: $SHARED (the real captures) is missing" >&2
  exit 1
fi

want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if ! { [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ] \
       && "$VENV/bin/python" -c "import mcp" 2>/dev/null; }; then
  echo "== mcp: installing the Python MCP SDK into $VENV"
  mkdir -p "$CACHE"
  rm -rf "$VENV"
  if ! python3 -m venv "$VENV" >&2 \
     || ! "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ" >&2; then
    echo "mcp: ERROR: cannot install the Python MCP SDK from $REQ" >&2
    exit 1
  fi
  echo "$want" > "$STAMP"
fi
echo "== mcp: $("$VENV/bin/python" -c 'import importlib.metadata as m; print("mcp", m.version("mcp"))') against $MEMLSP mcp"
"$VENV/bin/python" "$REPO/tests/mcp/sdk_client.py" "$MEMLSP" "$SHARED" "$REPO/fixtures"
