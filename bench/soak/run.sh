#!/usr/bin/env bash
# Soak under chaos: 2,000 requests at concurrency 8 with random lengths,
# deadlines and client cancellations, a worker SIGKILL every 300 requests, on
# a TP=1 and a TP=2 slot of the tiny test model on fake cards; then every
# invariant of the chaos suite is checked. Appends one JSON line to
# bench/soak/results.jsonl and exits 1 if an invariant failed.
# The soak checks invariants, not speed, so the debug build is enough.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --workspace --bins
exec target/debug/bench-soak "$@"
