#!/usr/bin/env bash
# Daemon benchmarks: routing overhead, recovery split, cold vs warm startup.
# Builds release binaries (with the CPU features in .cargo/config.toml), then
# runs the driver, which prints ratios and appends JSON lines to
# bench/daemon/results.jsonl. Uses $TT_SMOLLM2_GGUF when set
# (scripts/fetch-smollm2.sh), else the tiny test model.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --workspace --bins
exec target/release/bench-daemon "$@"
