#!/usr/bin/env bash
# End-to-end tests in real editors (issue 5). Called by .ci/run after `cargo test`; also runs alone.
# Self-contained: installs what it needs (Debian packages as root, PyPI, npm) and builds the
# server. Caches between runs on one machine under $MEMLSP_CI_CACHE (default ~/.cache/memlsp-ci):
# the Neovim venv, the code-server build and npm's cache.
#
#   .ci/e2e.sh              # every suite
#   .ci/e2e.sh nvim         # one suite: nvim, emacs, vscode, html
#
# Each suite prints one line per check and `N passed, N failed`; the script ends with a total
# and exits non-zero when a suite failed.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
export MEMLSP_CI_CACHE="${MEMLSP_CI_CACHE:-$HOME/.cache/memlsp-ci}"
SHARED="${MEMLSP_SHARED:-$REPO/../shared}"
ARTIFACTS="$REPO/target/e2e"
export E2E_ARTIFACTS="$ARTIFACTS"
mkdir -p "$MEMLSP_CI_CACHE" "$ARTIFACTS"
SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(nvim emacs vscode html)
T_START=$SECONDS

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
apt_install() {
  local missing=()
  for p in "$@"; do have_pkg "$p" || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "e2e: missing Debian packages (${missing[*]}) and not root to install them" >&2
    return 1
  fi
  echo "== apt-get install ${missing[*]}"
  if [ -z "${APT_UPDATED:-}" ]; then
    apt-get update -q >/dev/null
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

if [ ! -d "$SHARED/jax_cpu_captures" ] || [ ! -d "$SHARED/torch_snapshots" ]; then
  # Like .ci/run: without the real captures there is nothing true to show an editor.
  echo "== e2e: ERROR: $SHARED (the real captures) is missing" >&2
  exit 1
fi

echo "== build the server (debug)"
nice -n 10 cargo build --quiet --bin memlsp
MEMLSP="$REPO/target/debug/memlsp"

declare -A RESULT
run_nvim() {
  apt_install python3-venv
  local nvim
  nvim="$(tests/e2e/setup-nvim.sh "$MEMLSP_CI_CACHE")"
  echo "== Neovim: 0.11 config (vim.lsp.enable)"
  NVIM_CONFIG=enable tests/e2e/nvim.sh "$nvim" "$MEMLSP" "$SHARED" || return 1
  echo "== Neovim: 0.10 config (require('memlsp').setup())"
  NVIM_CONFIG=setup tests/e2e/nvim.sh "$nvim" "$MEMLSP" "$SHARED" || return 1
}

run_emacs() {
  apt_install emacs-nox elpa-eglot git
  tests/e2e/emacs.sh "$MEMLSP" "$SHARED"
}

run_vscode() {
  # code-server 4.100 needs Node 20 (NodeSource's nodejs here; Debian 12's is 18).
  if ! node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' 2>/dev/null; then
    apt_install nodejs || true
  fi
  if ! node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' 2>/dev/null; then
    echo "e2e: VS Code needs Node >= 20 (found: $(node --version 2>/dev/null || echo none))"
    echo "0 passed, 1 failed"
    return 1
  fi
  command -v npm >/dev/null || apt_install npm
  # Build deps of code-server's native modules, ripgrep for its search, Chromium for Playwright.
  apt_install libkrb5-dev libsecret-1-dev libx11-dev libxkbfile-dev pkg-config ripgrep g++ make \
    python3 curl chromium
  export npm_config_cache="$MEMLSP_CI_CACHE/npm"
  tests/e2e/vscode.sh "$MEMLSP" "$SHARED" "$ARTIFACTS"
}

run_html() {
  # The report page in Chromium (Playwright): every capture of ../shared.
  command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
  apt_install chromium
  export npm_config_cache="$MEMLSP_CI_CACHE/npm"
  tests/e2e/html.sh "$MEMLSP" "$SHARED" "$ARTIFACTS"
}

failed=0
for s in "${SUITES[@]}"; do
  t0=$SECONDS
  echo "=============== e2e: $s"
  if "run_$s"; then RESULT[$s]="ok"; else RESULT[$s]="FAILED"; failed=1; fi
  echo "=============== e2e: $s ${RESULT[$s]} ($((SECONDS - t0)) s)"
done
echo "== e2e summary ($((SECONDS - T_START)) s):"
for s in "${SUITES[@]}"; do echo "   $s: ${RESULT[$s]}"; done
exit $failed
