#!/usr/bin/env bash
# Engine benchmark: tt-worker (TP=1, TP=2) and llama.cpp on the same GGUF, in
# one run, as JSON lines on stdout (also appended to bench/engine/results.jsonl).
#
#   bench/engine/run.sh [--tokens N] [--repeats R] [--env KEY=VALUE ...]
#
# The workers run with the example config's flags (TTW_KV_F16=1, as in
# daemon/src/config/example.toml) unless --env is given; the settings are in
# every record (`worker_env`).
#
# Needs the model (scripts/fetch-smollm2.sh) and, for the peer, llama-cpp-python
# (`pip install 'llama-cpp-python[server]'`, about 5 minutes to build). Without
# the peer the tt-worker records are still produced and the peer is skipped
# with a record saying so.
set -euo pipefail
cd "$(dirname "$0")/../.."
TOKENS=128
REPEATS=3
ENVS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --tokens) TOKENS="$2"; shift 2 ;;
        --repeats) REPEATS="$2"; shift 2 ;;
        --env) ENVS+=(--env "$2"); shift 2 ;;
        *) echo "usage: $0 [--tokens N] [--repeats R] [--env KEY=VALUE ...]" >&2; exit 2 ;;
    esac
done
if [[ ${#ENVS[@]} -eq 0 ]]; then
    ENVS=(--env TTW_KV_F16=1)
fi
MODEL="${TT_SMOLLM2_GGUF:-$(scripts/fetch-smollm2.sh)}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
# The quantized kernels are compiled for the CPU they run on (see
# docs/PERFORMANCE.md); without AVX2/FMA they are about 2.7x slower.
export RUSTFLAGS="${RUSTFLAGS:--C target-cpu=native}"
cargo build --release -j2 -p tt-worker --bin tt-worker --example bench_engine >&2
OUT="bench/engine/results.jsonl"
RUN_ID="$(date -u +%Y%m%dT%H%M%SZ)"
{
    "${CARGO_TARGET_DIR}/release/examples/bench_engine" \
        --worker "${CARGO_TARGET_DIR}/release/tt-worker" --model "${MODEL}" \
        --tokens "${TOKENS}" --repeats "${REPEATS}" "${ENVS[@]}"
    python3 bench/engine/llamacpp_peer.py --model "${MODEL}" --tokens "${TOKENS}" --repeats "${REPEATS}"
} | python3 -c '
import json, sys
run = sys.argv[1]
for line in sys.stdin:
    rec = json.loads(line)
    rec["run"] = run
    print(json.dumps(rec, sort_keys=True), flush=True)
' "${RUN_ID}" | tee -a "${OUT}"
python3 bench/engine/summarize.py "${OUT}" "${RUN_ID}"
