#!/usr/bin/env bash
# CPU per relayed token: the daemon and tt-worker-openai beside nginx (the
# floor), interleaved in one run. Builds release binaries, then runs the
# driver, which prints µs of CPU per token per process and appends JSON
# lines to bench/cpu/results.jsonl. Engines: --engine fast (default, the
# zero-cost engine), --engine llama-server --llama-server "$(scripts/llama-server.sh)",
# --engine vllm --vllm "$(scripts/vllm.sh)" --vllm-model "$(scripts/vllm.sh --model-dir)".
# nginx from PATH or /usr/sbin/nginx (Debian: apt-get install nginx-light).
# --hold N holds N streams open at once instead (docs/PERFORMANCE.md, "A
# thousand streams"), e.g. --hold 1000 --tokens 100 --token-us 50000.
# Options: bench-cpu --help.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --workspace --bins
exec target/release/bench-cpu "$@"
