#!/usr/bin/env bash
# Engine benchmark: tt-worker (TP=1, TP=2) and llama.cpp on the same GGUF, in
# one run, as JSON lines on stdout (also appended to bench/engine/results.jsonl).
#
#   bench/engine/run.sh [--tokens N] [--repeats R] [--env KEY=VALUE ...]
#                       [--llama-server PATH] [--rounds K] [--baseline-worker PATH]
#                       [--native] [--prefill 512,2048] [--honour-eos]
#
# The engine measured is the build users get: the README's
# `cargo build --release` (portable x86-64; the hot loops pick AVX2/VNNI at
# run time), with whatever RUSTFLAGS the caller has (recorded as `build`).
#
# --llama-server PATH   the peer is llama-server (bench/engine/llama_server_peer.py,
#                       -np 8 -t 2) instead of llama-cpp-python; the engine's
#                       targets are stated against it.
# --rounds K            K rounds, the arms alternating within each (tt-worker,
#                       the peer; A B B A order from round to round), so a
#                       noisy machine shows as spread, not as one arm's loss.
# --baseline-worker P   a third arm: another tt-worker binary (an older
#                       build), to say what a change bought in the same run;
#                       its records carry "worker": "baseline", ours "this".
# --native              one more arm: the same source built with
#                       `-C target-cpu=native` (target/native), records
#                       tagged "worker": "native", to show what the portable
#                       build gives up (issue 44's target: within 3%).
# --prefill L1,L2       long prompts timed (unique, then repeated from the
#                       prefix / prompt cache); "" skips them.
# --honour-eos          streams end at EOS as clients get them (default:
#                       every stream decodes all --tokens, both engines).
#
# The workers run with the example config's flags (TTW_KV_F16=1, as in
# host/src/config/example.toml) unless --env is given; the settings are in
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
LLAMA_SERVER=""
ROUNDS=1
BASELINE=""
NATIVE=0
PREFILL="512,2048"
EOS=()
usage="usage: $0 [--tokens N] [--repeats R] [--env KEY=VALUE ...] [--llama-server PATH] [--rounds K] [--baseline-worker PATH] [--native] [--prefill L1,L2] [--honour-eos]"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --tokens) TOKENS="$2"; shift 2 ;;
        --repeats) REPEATS="$2"; shift 2 ;;
        --env) ENVS+=(--env "$2"); shift 2 ;;
        --llama-server) LLAMA_SERVER="$2"; shift 2 ;;
        --rounds) ROUNDS="$2"; shift 2 ;;
        --baseline-worker) BASELINE="$2"; shift 2 ;;
        --native) NATIVE=1; shift ;;
        --prefill) PREFILL="$2"; shift 2 ;;
        --honour-eos) EOS=(--honour-eos); shift ;;
        *) echo "${usage}" >&2; exit 2 ;;
    esac
done
if [[ -n "${LLAMA_SERVER}" && ! -x "${LLAMA_SERVER}" ]]; then
    echo "--llama-server ${LLAMA_SERVER}: not an executable (build it with scripts/llama-server.sh)" >&2
    exit 2
fi
if [[ -n "${BASELINE}" && ! -x "${BASELINE}" ]]; then
    echo "--baseline-worker ${BASELINE}: not an executable" >&2
    exit 2
fi
if ! [[ "${ROUNDS}" =~ ^[1-9][0-9]*$ ]]; then
    echo "--rounds ${ROUNDS}: expected a positive whole number" >&2
    exit 2
fi
if [[ ${#ENVS[@]} -eq 0 ]]; then
    ENVS=(--env TTW_KV_F16=1)
fi
MODEL="${TT_SMOLLM2_GGUF:-$(scripts/fetch-smollm2.sh)}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
# The README's build: no target-cpu flag unless the caller sets one.
BUILD="${RUSTFLAGS:-portable}"
cargo build --release -j2 -p tt-worker --bin tt-worker --example bench_engine >&2
if [[ "${NATIVE}" == 1 ]]; then
    RUSTFLAGS="-C target-cpu=native" CARGO_TARGET_DIR="${CARGO_TARGET_DIR}/native" \
        cargo build --release -j2 -p tt-worker --bin tt-worker >&2
fi
OUT="bench/engine/results.jsonl"
RUN_ID="$(date -u +%Y%m%dT%H%M%SZ)"
# One arm: its JSON lines on stdout, each prefixed with the arm's tags.
arm() {
    local tag="$1" round="$2"
    shift 2
    "$@" | sed -e "s/^{/{${tag}\"round\": ${round}, /"
}
worker_arm() {
    local which="$1" binary="$2" round="$3"
    # Rounds after the first measure the warm engine only (TP=1, 1 and 8
    # streams); the first also measures TP=2, 4 streams and cold/warm load.
    local scope=()
    if [[ "${round}" -gt 0 ]]; then scope=(--tp 1 --streams 1,8); fi
    local build="${BUILD}"
    if [[ "${which}" == native ]]; then build="-C target-cpu=native"; fi
    if [[ "${which}" == baseline ]]; then build="given"; fi
    arm "\"worker\": \"${which}\", \"build\": \"${build}\", " "${round}" \
        "${CARGO_TARGET_DIR}/release/examples/bench_engine" \
        --worker "${binary}" --model "${MODEL}" \
        --tokens "${TOKENS}" --repeats "${REPEATS}" "${ENVS[@]}" "${scope[@]}" \
        --prefill "${PREFILL}" "${EOS[@]}"
}
peer_arm() {
    local round="$1"
    if [[ -n "${LLAMA_SERVER}" ]]; then
        arm "" "${round}" python3 bench/engine/llama_server_peer.py --llama-server "${LLAMA_SERVER}" \
            --model "${MODEL}" --tokens "${TOKENS}" --repeats "${REPEATS}" --streams 1,8 \
            --prefill "${PREFILL}" "${EOS[@]}"
    else
        arm "" "${round}" python3 bench/engine/llamacpp_peer.py --model "${MODEL}" \
            --tokens "${TOKENS}" --repeats "${REPEATS}"
    fi
}
{
    for ((round = 0; round < ROUNDS; round++)); do
        arms=(this)
        if [[ "${NATIVE}" == 1 ]]; then arms+=(native); fi
        if [[ -n "${BASELINE}" ]]; then arms+=(baseline); fi
        arms+=(peer)
        if ((round % 2 == 1)); then arms=($(printf '%s\n' "${arms[@]}" | tac)); fi
        for a in "${arms[@]}"; do
            case "${a}" in
                this) worker_arm this "${CARGO_TARGET_DIR}/release/tt-worker" "${round}" ;;
                native) worker_arm native "${CARGO_TARGET_DIR}/native/release/tt-worker" "${round}" ;;
                baseline) worker_arm baseline "${BASELINE}" "${round}" ;;
                peer) peer_arm "${round}" ;;
            esac
        done
    done
} | python3 -c '
import json, subprocess, sys
run = sys.argv[1]
git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
for line in sys.stdin:
    rec = json.loads(line)
    rec["run"] = run
    rec["git"] = git
    print(json.dumps(rec, sort_keys=True), flush=True)
' "${RUN_ID}" | tee -a "${OUT}"
python3 bench/engine/summarize.py "${OUT}" "${RUN_ID}" bench/engine/summaries.jsonl
