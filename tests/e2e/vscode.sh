#!/usr/bin/env bash
# VS Code end-to-end test: builds the extension's VSIX (with the server binary inside), installs
# it into a real VS Code workbench (code-server 4.100.3, built from npm by setup-code-server.sh)
# and drives the workbench with Playwright + Debian's Chromium (tests/e2e/vscode/e2e.cjs).
#
#   tests/e2e/vscode.sh MEMLSP [SHARED] [ARTIFACTS]
#
# Leaves ARTIFACTS/memlsp-linux-x64.vsix and the screenshots ARTIFACTS/vscode.png (hint, squiggle,
# hover, Problems), vscode-quickfix.png, vscode-after-fix.png (and vscode-error.png plus the logs
# on failure). Prints `N passed, N failed`; non-zero exit on failure.
# Needs node >= 20 and npm; the Debian packages listed in setup-code-server.sh and chromium.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
MEMLSP="$(realpath "${1:?usage: vscode.sh MEMLSP [SHARED] [ARTIFACTS]}")"
SHARED="$(realpath "${2:-$REPO/../shared}")"
ARTIFACTS="$(mkdir -p "${3:-$REPO/target/e2e}" && realpath "${3:-$REPO/target/e2e}")"
CACHE="${MEMLSP_CI_CACHE:-$HOME/.cache/memlsp-ci}"
export npm_config_cache="${npm_config_cache:-$CACHE/npm}"
npm_quiet=(--no-audit --no-fund --loglevel=error)
rm -rf "$ARTIFACTS"/vscode*.png "$ARTIFACTS/vscode-logs" "$ARTIFACTS/memlsp-linux-x64.vsix"

echo "== VSIX: npm ci, type-check, bundle, package (linux-x64, server binary inside)"
(
  cd "$REPO/editors/vscode"
  # npm ci only when the lock file changed since the last install here.
  lock="$(sha256sum package-lock.json | cut -d' ' -f1)"
  if [ "$(cat node_modules/.memlsp-lock 2>/dev/null)" != "$lock" ]; then
    npm ci "${npm_quiet[@]}"
    echo "$lock" > node_modules/.memlsp-lock
  fi
  npx tsc --noEmit -p .
  npm run -s bundle >/dev/null
  rm -rf bin && mkdir -p bin && cp "$MEMLSP" bin/memlsp && chmod 755 bin/memlsp
  npx vsce package --no-dependencies --skip-license --target linux-x64 \
    -o "$ARTIFACTS/memlsp-linux-x64.vsix" | tail -n 1
)
VSIX="$ARTIFACTS/memlsp-linux-x64.vsix"

echo "== code-server 4.100.3 (built from npm, cached in $CACHE)"
ENTRY="$("$REPO/tests/e2e/setup-code-server.sh" "$CACHE")"

echo "== Playwright (playwright-core, Debian chromium)"
(cd "$REPO/tests/e2e/vscode" && npm ci "${npm_quiet[@]}")
CHROMIUM="${CHROMIUM:-$(command -v chromium || true)}"
[ -x "$CHROMIUM" ] || { echo "vscode e2e: chromium not found"; echo "0 passed, 1 failed"; exit 1; }

TMP="$(mktemp -d "${TMPDIR:-/tmp}/memlsp-vscode-e2e.XXXXXX")"
CS_PID=""
cleanup() {
  if [ -n "$CS_PID" ]; then kill "$CS_PID" 2>/dev/null || true; wait "$CS_PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
WS="$TMP/ws"
"$REPO/tests/e2e/make-workspace.sh" "$WS" "$SHARED"

# A fresh VS Code profile: the memlsp VSIX is its only extension. No `memlsp` on PATH, so the
# server that runs is the one bundled in the VSIX.
D="$TMP/vscode"
mkdir -p "$D/ext" "$D/user/User"
echo '[]' > "$D/ext/extensions.json"
cat > "$D/user/User/settings.json" <<'JSON'
{
  "workbench.startupEditor": "none",
  "workbench.tips.enabled": false,
  "security.workspace.trust.enabled": false,
  "telemetry.telemetryLevel": "off",
  "extensions.autoCheckUpdates": false,
  "extensions.autoUpdate": false,
  "update.mode": "none",
  "editor.minimap.enabled": false,
  "editor.stickyScroll.enabled": false,
  "workbench.colorTheme": "Default Light Modern",
  "window.commandCenter": false,
  "chat.commandCenter.enabled": false,
  "memlsp.trace.server": "verbose"
}
JSON
cs=(node "$ENTRY" --config "$TMP/code-server.yaml" --user-data-dir "$D/user" --extensions-dir "$D/ext")
"${cs[@]}" --install-extension "$VSIX" | grep -i "installed" || { echo "0 passed, 1 failed (VSIX not installed)"; exit 1; }

PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
PATH_NO_MEMLSP="$(echo "$PATH" | tr ':' '\n' | while read -r p; do [ -x "$p/memlsp" ] || echo "$p"; done | paste -sd:)"
PATH="$PATH_NO_MEMLSP" "${cs[@]}" --auth none --bind-addr "127.0.0.1:$PORT" --disable-telemetry \
  --disable-update-check --disable-workspace-trust --disable-getting-started-override \
  "$WS" > "$TMP/code-server.log" 2>&1 &
CS_PID=$!
for _ in $(seq 1 120); do
  curl -fs -o /dev/null "http://127.0.0.1:$PORT/healthz" && break
  sleep 0.5
done

rc=0
(
  cd "$REPO/tests/e2e/vscode"
  CS_URL="http://127.0.0.1:$PORT" WS="$WS" SHOT_DIR="$ARTIFACTS" CHROMIUM="$CHROMIUM" \
  NEW_CAPTURE="$REPO/fixtures/torch/pt002_retained_graph.pickle" \
    timeout 300 node e2e.cjs
) || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "vscode e2e: exit status $rc; logs kept in $ARTIFACTS/vscode-logs"
  rm -rf "$ARTIFACTS/vscode-logs" && mkdir -p "$ARTIFACTS/vscode-logs"
  cp "$TMP/code-server.log" "$ARTIFACTS/vscode-logs/" 2>/dev/null || true
  cp -r "$D/user/logs" "$ARTIFACTS/vscode-logs/" 2>/dev/null || true
  [ "$rc" -eq 124 ] && echo "0 passed, 1 failed (timed out)"
  exit 1
fi
