#!/usr/bin/env bash
# Fuzz smoke test: each fuzz target for a few seconds from the committed corpus (≤ 60 s in all).
# Needs cargo-fuzz (installed here if missing). The machine has only stable Rust, so
# RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags. Exit status: 0 ok, 1 a target crashed /
# hung / ran out of memory, or the smoke test could not run (it never passes by skipping).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${FUZZ_SMOKE_SECONDS:-10}"
TARGETS=(pickle_vm torch_snapshot xplane report)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: cargo-fuzz not found, installing it"
    if ! cargo install cargo-fuzz --locked >/dev/null 2>&1; then
        echo "fuzz-smoke: ERROR: cannot install cargo-fuzz; the fuzz smoke test did not run" >&2
        exit 1
    fi
fi

export RUSTC_BOOTSTRAP=1
cd fuzz
# -s none: no sanitizer (the code under test is safe Rust; this keeps the build and runs fast).
if ! cargo fuzz build -s none >/tmp/fuzz-smoke-build.log 2>&1; then
    cat /tmp/fuzz-smoke-build.log
    echo "fuzz-smoke: ERROR: the fuzz targets did not build" >&2
    exit 1
fi
status=0
for t in "${TARGETS[@]}"; do
    work=$(mktemp -d)
    # Run on a scratch copy so the committed corpus is never changed by CI.
    [ -d "corpus/$t" ] && cp -r "corpus/$t/." "$work/"
    if cargo fuzz run -s none "$t" "$work" -- \
        -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -timeout=10 \
        >"/tmp/fuzz-smoke-$t.log" 2>&1; then
        echo "fuzz-smoke: $t ok ($(grep -o 'Done [0-9]* runs' "/tmp/fuzz-smoke-$t.log" | tail -1))"
    else
        echo "fuzz-smoke: $t FAILED; reproducer under fuzz/artifacts/$t/"
        tail -40 "/tmp/fuzz-smoke-$t.log"
        status=1
    fi
    rm -rf "$work"
done
exit $status
