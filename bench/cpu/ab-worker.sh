#!/usr/bin/env bash
# A baseline tt-worker-openai against this tree's, side by side: runs
# bench-cpu with the baseline binary and with this tree's alternately,
# --pairs times (which goes first alternates), each record labelled "baseline" or "this tree" (and the
# binary in worker_binary). Build the baseline from another checkout
# first, e.g.
#   git worktree add /tmp/base REV && (cd /tmp/base && cargo build --release -p tt-worker-openai)
#   bench/cpu/ab-worker.sh /tmp/base/target/release/tt-worker-openai --pairs 3 -- --streams 8 --rounds 6
# Everything after -- goes to bench-cpu (bench-cpu --help).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ] || [ ! -x "$1" ]; then
    echo "usage: bench/cpu/ab-worker.sh BASELINE_WORKER_BINARY [--pairs N] [-- bench-cpu args]" >&2
    exit 2
fi
baseline="$1"
shift
pairs=2
if [ "${1:-}" = "--pairs" ]; then
    pairs="${2:-}"
    shift 2 || true
    case "$pairs" in '' | *[!0-9]* | 0)
        echo "--pairs takes a positive number" >&2
        exit 2 ;;
    esac
fi
[ "${1:-}" = "--" ] && shift
cargo build --release --workspace --bins
run_baseline() {
    echo "== pair $1: baseline ($baseline)"
    target/release/bench-cpu --worker "$baseline" --label baseline "${@:2}"
}
run_this() {
    echo "== pair $1: this tree"
    target/release/bench-cpu --label "this tree" "${@:2}"
}
# The first of a pair goes second in the next, so drift hits both alike.
for i in $(seq 1 "$pairs"); do
    if [ $((i % 2)) -eq 1 ]; then
        run_baseline "$i" "$@"
        run_this "$i" "$@"
    else
        run_this "$i" "$@"
        run_baseline "$i" "$@"
    fi
done
