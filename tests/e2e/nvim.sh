#!/usr/bin/env bash
# Neovim end-to-end test: a real Neovim 0.11 (headless) with the shipped editors/nvim config,
# on a workspace at another path than the captures recorded.
#
#   tests/e2e/nvim.sh NVIM MEMLSP [SHARED]
#
# NVIM: the nvim binary (tests/e2e/setup-nvim.sh installs 0.11.4); MEMLSP: the server binary;
# SHARED: the shared reference folder with the real captures (default ../shared).
# NVIM_CONFIG=enable (default) writes the 0.11 user config (`vim.lsp.enable('memlsp')`);
# NVIM_CONFIG=setup the 0.10 one (`require('memlsp').setup()`).
# Prints one line per check and `N passed, N failed`; exits non-zero on any failure.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
NVIM="$(realpath "${1:?usage: nvim.sh NVIM MEMLSP [SHARED]}")"
MEMLSP="$(realpath "${2:?usage: nvim.sh NVIM MEMLSP [SHARED]}")"
SHARED="$(realpath "${3:-$REPO/../shared}")"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/memlsp-nvim-e2e.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
WS="$TMP/ws"
mkdir -p "$TMP/bin"
"$REPO/tests/e2e/make-workspace.sh" "$WS" "$SHARED"

# The server as a user has it: `memlsp` on PATH.
ln -s "$MEMLSP" "$TMP/bin/memlsp"

# The user's whole Neovim config: put editors/nvim on the runtimepath and enable the server.
mkdir -p "$TMP/config/nvim"
case "${NVIM_CONFIG:-enable}" in
  enable) cat > "$TMP/config/nvim/init.lua" <<LUA
vim.opt.rtp:append('$REPO/editors/nvim')
vim.lsp.enable('memlsp')
LUA
  ;;
  setup) cat > "$TMP/config/nvim/init.lua" <<LUA
vim.opt.rtp:append('$REPO/editors/nvim')
require('memlsp').setup()
LUA
  ;;
  *) echo "NVIM_CONFIG must be enable or setup"; exit 2 ;;
esac
echo "== Neovim user config ($TMP/config/nvim/init.lua):"
sed 's/^/   /' "$TMP/config/nvim/init.lua"

rc=0
(
  cd "$WS"
  PATH="$TMP/bin:$PATH" XDG_CONFIG_HOME="$TMP/config" XDG_DATA_HOME="$TMP/data" \
  XDG_STATE_HOME="$TMP/state" XDG_CACHE_HOME="$TMP/cache" \
  WS="$WS" E2E_ARTIFACTS="${E2E_ARTIFACTS:-}" NEW_CAPTURE="$REPO/fixtures/torch/pt002_retained_graph.pickle" \
    timeout 180 "$NVIM" --headless -i NONE -n -c "luafile $REPO/tests/e2e/nvim/e2e.lua"
) || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "nvim e2e: exit status $rc; the end of Neovim's LSP log:"
  tail -n 40 "$TMP/state/nvim/lsp.log" 2>/dev/null || true
  [ "$rc" -eq 124 ] && echo "0 passed, 1 failed (timed out)"
  exit 1
fi
