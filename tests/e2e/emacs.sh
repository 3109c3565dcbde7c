#!/usr/bin/env bash
# Emacs + eglot end-to-end test (Debian's emacs-nox 28 + elpa-eglot 1.9: diagnostics; no inlay
# hints before Emacs 29). Uses the configuration snippet of docs/EDITORS.md.
#
#   tests/e2e/emacs.sh MEMLSP [SHARED]
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
MEMLSP="$(realpath "${1:?usage: emacs.sh MEMLSP [SHARED]}")"
SHARED="$(realpath "${2:-$REPO/../shared}")"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/memlsp-emacs-e2e.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
WS="$TMP/ws"
"$REPO/tests/e2e/make-workspace.sh" "$WS" "$SHARED"
# Two copies of the program: suffix matching alone cannot choose; pathMappings picks mapped/.
mkdir -p "$WS/mapped" "$TMP/bin" "$TMP/home"
cp "$WS/jax/b_mlp_nodonate.py" "$WS/mapped/"
ln -s "$MEMLSP" "$TMP/bin/memlsp"
# eglot takes the project root from project.el, which (Emacs 28) knows VC roots only.
git init -q "$WS"
# Not -Q: Debian's elpa-eglot is on the load-path through site-start.
(cd "$WS" && HOME="$TMP/home" PATH="$TMP/bin:$PATH" WS="$WS" \
  timeout 120 emacs --batch -l "$REPO/tests/e2e/emacs/eglot.el")
