#!/usr/bin/env bash
# The OpenAI front door against the gRPC port of one daemon, alternating,
# at 1 and 8 streams. Builds release binaries, then runs the driver, which
# prints the ratios and appends JSON lines to bench/openai/results.jsonl.
# Uses $TT_SMOLLM2_GGUF when set (scripts/fetch-smollm2.sh), else the tiny
# test model. Options: bench-openai --help.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --workspace --bins
exec target/release/bench-openai "$@"
