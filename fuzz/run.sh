#!/usr/bin/env bash
# A bounded cargo-fuzz run of every target: `fuzz/run.sh [SECONDS]` (default
# 30 per target). Needs a nightly toolchain and cargo-fuzz; both are
# installed if missing, and when that is impossible (no network to the Rust
# distribution server) the run is skipped with a loud line, because the
# bounded stable run (`cargo test -p tt-servingd fuzzing`) always happens.
# Each target starts from a temporary copy of its checked-in corpus, so the
# tree stays clean; a crash exits non-zero and leaves the input under
# fuzz/artifacts/<target>/.
set -uo pipefail
cd "$(dirname "$0")"
seconds=${1:-30}

if ! cargo +nightly --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal >/dev/null 2>&1 || {
        echo "SKIPPED: fuzz run (no nightly toolchain and none can be installed here)"
        exit 0
    }
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked >/dev/null 2>&1 || {
        echo "SKIPPED: fuzz run (cargo-fuzz cannot be installed here)"
        exit 0
    }
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for target in $(cargo +nightly fuzz list); do
    mkdir -p "$work/$target"
    cp -r "corpus/$target/." "$work/$target/" 2>/dev/null || true
    echo "== fuzz $target for ${seconds}s"
    # -s none: the targets are safe Rust, so AddressSanitizer adds little
    # and doubles the build; coverage guidance stays on. Longer runs: see
    # fuzz/README.md.
    cargo +nightly fuzz run -s none "$target" "$work/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 >"$work/$target.log" 2>&1
    code=$?
    grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb|SUMMARY|thread '|Test unit written)|panicked" "$work/$target.log"
    if [ "$code" -ne 0 ]; then
        tail -30 "$work/$target.log"
        echo "FAIL: fuzz target $target exited $code (a crash leaves its input under fuzz/artifacts/$target/)"
        status=1
    fi
done
exit $status
