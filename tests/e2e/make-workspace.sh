#!/usr/bin/env bash
# Lay out the e2e test workspace in WS (a fresh directory at another path than any capture
# recorded): real JAX captures with their programs, a real PyTorch snapshot with its user file
# (reconstructed, since the snapshot's program is not available), and the project's training
# script whose PT002 snapshot the tests add while the editor runs.
#
#   tests/e2e/make-workspace.sh WS SHARED
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
WS="${1:?usage: make-workspace.sh WS SHARED}"
SHARED="${2:?usage: make-workspace.sh WS SHARED}"
for f in jax_cpu_captures/b_mlp_nodonate/b_mlp_nodonate.xplane.pb \
         jax_cpu_captures/e_attention_big/e_attention_big.xplane.pb \
         torch_snapshots/real/silmont2000__mem_snapshot.pickle; do
  [ -f "$SHARED/$f" ] || { echo "e2e: missing $SHARED/$f" >&2; exit 1; }
done
mkdir -p "$WS/jax" "$WS/captures"
# A root marker (Neovim's root_markers; VS Code opens the folder).
printf '[project]\nname = "memlsp-e2e"\nversion = "0"\n' > "$WS/pyproject.toml"
for c in b_mlp_nodonate e_attention_big; do
  # recorded as /srv/jaxdemo/<c>.py
  cp "$SHARED/jax_cpu_captures/$c/$c.py" "$SHARED/jax_cpu_captures/$c/$c.xplane.pb" "$WS/jax/"
done
# recorded as /root/autodl-tmp/assignment2-systems/cs336_systems/trace_peak_memory.py
cp -r "$REPO/tests/e2e/fixtures/torch_real/cs336_systems" "$WS/"
cp "$SHARED/torch_snapshots/real/silmont2000__mem_snapshot.pickle" "$WS/captures/mem_snapshot.pickle"
# recorded as /home/alice/project/train_leak.py (fixtures/torch/pt002_retained_graph.pickle)
cp "$REPO/fixtures/torch/train_leak.py" "$WS/"
chmod -R u+w "$WS"
