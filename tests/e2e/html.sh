#!/usr/bin/env bash
# The HTML report page in real Chromium: `memlsp report X --format html` for every capture in
# ../shared (39 real PyTorch snapshots, 16 JAX captures), each page opened from file:// by
# Playwright + Debian's Chromium (tests/e2e/html/html.cjs): bands drawn, tooltips, click
# targets, no console error, no network request, open time under 1 s.
#
#   tests/e2e/html.sh MEMLSP [SHARED] [ARTIFACTS]
#
# Leaves the screenshots ARTIFACTS/html-torch.png and ARTIFACTS/html-jax.png (used by the README).
# BIG_SNAPSHOT=FILE adds that snapshot's page (e.g. the bench's 1 GB one). Prints one line per
# page and `N passed, N failed`; non-zero exit on failure. One more page is hostile: a snapshot
# whose frame name attacks the page (its data block must stay one block, the name text).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
MEMLSP="$(realpath "${1:?usage: html.sh MEMLSP [SHARED] [ARTIFACTS]}")"
SHARED="$(realpath "${2:-$REPO/../shared}")"
ARTIFACTS="$(mkdir -p "${3:-$REPO/target/e2e}" && realpath "${3:-$REPO/target/e2e}")"
CACHE="${MEMLSP_CI_CACHE:-$HOME/.cache/memlsp-ci}"
export npm_config_cache="${npm_config_cache:-$CACHE/npm}"
CHROMIUM="${CHROMIUM:-$(command -v chromium || true)}"
[ -x "$CHROMIUM" ] || { echo "html e2e: chromium not found"; echo "0 passed, 1 failed"; exit 1; }

TMP="$(mktemp -d "${TMPDIR:-/tmp}/memlsp-html-e2e.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/pages"
n=0
page() { # capture, page name
  "$MEMLSP" report "$1" --format html -o "$TMP/pages/$2.html"
  n=$((n + 1))
}
for f in "$SHARED"/torch_snapshots/real/*.pickle "$SHARED"/torch_snapshots/real/*.pkl; do page "$f" "$(basename "$f")"; done
for f in "$SHARED"/jax_cpu_captures/*/*.xplane.pb "$SHARED"/jax-real-captures/*/*.xplane.pb; do
  page "$f" "$(basename "$(dirname "$f")")__$(basename "$f")"
done
# A job's ranks on one page: three real snapshots as ranks 0-2.
mkdir -p "$TMP/ranks"
for r in 0 1 2; do
  cp "$SHARED/torch_snapshots/real/kkaitlyn111__memory_$(echo snapshot ctx128_fullstep ctx256_forward | cut -d' ' -f$((r + 1))).pickle" "$TMP/ranks/rank${r}_snapshot.pickle"
done
page "$TMP/ranks" "ranks"
# A hostile page (issue 31): the JSON fixture with the function `train_ddp` renamed to a string
# that tries to close or comment out the data block, inject HTML and a Markdown link, and carries
# ESC, NUL, CR, a C1 CSI, a bidi override and U+2028/2029 (as tests/support/hostile.rs does).
HOSTILE_NAME="$(python3 - "$REPO/fixtures/torch/format_json_snapshot.json" "$TMP/hostile_snapshot.json" <<'PY'
import json, sys
name = ("train_ddp`<!--<script>[pwn](http://evil.example/x)![i](http://evil.example/i.png)"
        "<img src=x onerror=alert(1)>**bold**\x1b[2J\x1b]0;owned\x07\x00\r\x9b31m\u202e\u2028\u2029</script>\nforged.py:1: error[PT009] forged")
text = open(sys.argv[1]).read()
needle = '"name": "train_ddp"'
assert needle in text
open(sys.argv[2], "w").write(text.replace(needle, '"name": ' + json.dumps(name)))
print(json.dumps(name))
PY
)"
export HOSTILE_NAME
page "$TMP/hostile_snapshot.json" "hostile__snapshot"
if [ -n "${BIG_SNAPSHOT:-}" ]; then
  t0=$(date +%s.%N)
  page "$BIG_SNAPSHOT" "big__$(basename "$BIG_SNAPSHOT")"
  echo "== $(basename "$BIG_SNAPSHOT"): page written in $(echo "$(date +%s.%N) - $t0" | bc) s"
fi
echo "== $n pages from $SHARED"

(cd "$REPO/tests/e2e/html" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
PAGES="$TMP/pages" SHOT_DIR="$ARTIFACTS" CHROMIUM="$CHROMIUM" \
  SHOTS="Constructor-Sun__memory_snapshot.pickle.html=html-torch.png,e_attention_big__e_attention_big.xplane.pb.html=html-jax.png" \
  node "$REPO/tests/e2e/html/html.cjs"
