#!/usr/bin/env bash
# Build code-server 4.100.3 (= VS Code 1.100, the last line on Node 20) from the npm registry
# only, into the CI cache, and print the path of its entry.js. Nothing is fetched from GitHub or
# update.code.visualstudio.com: install scripts are skipped, native modules are rebuilt against
# the system Node headers, and ripgrep comes from Debian. Reused once complete.
#
#   ENTRY="$(tests/e2e/setup-code-server.sh [CACHE_DIR])"
#
# Needs (Debian): nodejs >= 20, libkrb5-dev libsecret-1-dev libx11-dev libxkbfile-dev pkg-config
# ripgrep g++ make python3. .ci/e2e.sh installs them.
set -euo pipefail
VERSION=4.100.3
CACHE="${1:-${MEMLSP_CI_CACHE:-$HOME/.cache/memlsp-ci}}"
DEST="$CACHE/code-server-$VERSION"
ENTRY="$DEST/package/out/node/entry.js"
if [ -f "$DEST/.complete" ] && [ -f "$ENTRY" ]; then
  echo "$ENTRY"
  exit 0
fi
npm_flags=(--omit=dev --no-audit --no-fund --loglevel=error)
{
  rm -rf "$DEST"
  mkdir -p "$DEST"
  cd "$DEST"
  npm pack --silent "code-server@$VERSION"
  tar xzf "code-server-$VERSION.tgz"
  rm "code-server-$VERSION.tgz"
  cd package/lib/vscode
  # --ignore-scripts: @vscode/ripgrep's postinstall downloads rg from GitHub.
  npm install "${npm_flags[@]}" --ignore-scripts
  # node-gyp: the system Node headers instead of a download; npm_config_yes lets node-pty's
  # `npx node-gyp` run without a prompt.
  npm_config_nodedir=/usr npm_config_yes=true \
    npm rebuild --loglevel=error @vscode/deviceid @vscode/spdlog kerberos native-watchdog node-pty
  mkdir -p node_modules/@vscode/ripgrep/bin
  cp "$(command -v rg)" node_modules/@vscode/ripgrep/bin/rg
  ln -sfn node_modules node_modules.asar
  (cd extensions && npm install "${npm_flags[@]}")
  cd ../..
  npm install "${npm_flags[@]}" --ignore-scripts
  npm_config_nodedir=/usr npm rebuild --loglevel=error argon2
} >&2
touch "$DEST/.complete"
echo "$ENTRY"
