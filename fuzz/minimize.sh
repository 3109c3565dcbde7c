#!/usr/bin/env bash
# Minimise a fuzz target's corpus for committing: `cargo fuzz cmin`, then drop the largest inputs
# until the corpus fits the budget (default 1 MiB per target; the repository keeps a few MB).
# usage: fuzz/minimize.sh TARGET [BUDGET_BYTES]
set -euo pipefail
cd "$(dirname "$0")"
t="$1"
budget="${2:-1048576}"
export RUSTC_BOOTSTRAP=1
cargo fuzz cmin -s none "$t" "corpus/$t" >/dev/null 2>&1
total() { find "corpus/$t" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}'; }
while [ "$(total)" -gt "$budget" ]; do
    rm -- "$(find "corpus/$t" -type f -printf '%s %p\n' | sort -n | tail -1 | cut -d' ' -f2-)"
done
echo "$t: $(find "corpus/$t" -type f | wc -l) inputs, $(total) bytes"
