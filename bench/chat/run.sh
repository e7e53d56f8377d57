#!/usr/bin/env bash
# Prefix reuse on a multi-turn chat workload (8 conversations, 4 turns,
# one shared ~500-token system prompt), side by side in one run: the
# daemon on tt-worker with its prefix cache, llama-server with its prompt
# cache (--llama-server PATH) and the daemon without the prefix cache; or,
# with --replicas, two replicas with prefix affinity on against off.
# Builds release binaries, then runs the driver, which prints a table and
# appends one JSON line per comparison to bench/chat/results.jsonl.
# Uses $TT_SMOLLM2_GGUF when set (scripts/fetch-smollm2.sh), else the tiny
# test model. Options: bench-chat --help.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --workspace --bins
exec target/release/bench-chat "$@"
