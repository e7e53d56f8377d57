#!/usr/bin/env bash
# What #45's features cost the relay, side by side in one run: bench-cpu's
# CPU per relayed token with
#   baseline    a build from before usage per key and the priority queue
#               (its tt-servingd and tt-worker-openai),
#   traces off  this tree as it ships (usage per key and the priority
#               queue always on; [tracing] unset),
#   traces on   this tree exporting every request's spans over OTLP to a
#               real receiver (tests/clients/otlp_receiver.py).
# The three alternate, their order rotating, --pairs times; each record is
# labelled "<run> <arm>" and a summary of medians per arm is printed (and
# appended to bench/cpu/features.jsonl). Build the baseline first, e.g.
#   git worktree add /tmp/base b92930c
#   (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base-target cargo build --release -p tt-servingd -p tt-worker-openai)
#   bench/cpu/ab-features.sh /tmp/base-target/release --pairs 3 -- --streams 1,8 --skip direct,nginx
# Everything after -- goes to bench-cpu (bench-cpu --help). The receiver
# runs on the Python of scripts/grpcio-python.sh (or TT_GRPCIO_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ] || [ ! -x "$1/tt-servingd" ] || [ ! -x "$1/tt-worker-openai" ]; then
    echo "usage: bench/cpu/ab-features.sh BASELINE_RELEASE_DIR [--pairs N] [-- bench-cpu args]" >&2
    echo "  BASELINE_RELEASE_DIR holds the baseline's tt-servingd and tt-worker-openai" >&2
    exit 2
fi
base="$1"
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
python="${TT_GRPCIO_PYTHON:-$(scripts/grpcio-python.sh)}"
run="features-$(date -u +%Y%m%dT%H%M%SZ)"
spans="$(mktemp -d)"
"$python" tests/clients/otlp_receiver.py "$spans/spans.jsonl" >"$spans/port" &
receiver=$!
trap 'kill "$receiver" 2>/dev/null || true; rm -rf "$spans"' EXIT
for _ in $(seq 100); do
    grep -q '^PORT ' "$spans/port" 2>/dev/null && break
    sleep 0.1
done
port="$(sed -n 's/^PORT //p' "$spans/port")"
[ -n "$port" ] || { echo "the OTLP receiver did not start" >&2; exit 1; }
endpoint="http://127.0.0.1:${port}"

arm() {
    case "$1" in
    baseline)
        target/release/bench-cpu --daemon "$base/tt-servingd" --worker "$base/tt-worker-openai" \
            --label "$run baseline" "${@:2}" ;;
    off) target/release/bench-cpu --label "$run traces off" "${@:2}" ;;
    on) target/release/bench-cpu --otlp-endpoint "$endpoint" --label "$run traces on" "${@:2}" ;;
    esac
}
arms=(baseline off on)
for i in $(seq 1 "$pairs"); do
    for j in 0 1 2; do
        a="${arms[$(((i + j) % 3))]}"
        echo "== round $i: $a"
        arm "$a" "$@"
    done
done
echo "spans received while traces were on: $(wc -l <"$spans/spans.jsonl" 2>/dev/null || echo 0)"
python3 - "$run" <<'EOF'
import json, statistics, sys
run = sys.argv[1]
recs = [json.loads(l) for l in open("bench/cpu/results.jsonl") if run in l]
rows = {}
for r in recs:
    arm = r["label"].split(" ", 1)[1]
    key = (r["arm"], r["streams"])
    rows.setdefault(key, {}).setdefault(arm, []).append(
        r["cpu_us_per_token"]["daemon"] + r["cpu_us_per_token"]["worker"])
out = open("bench/cpu/features.jsonl", "a")
print(f"{run}: daemon+worker CPU us per relayed token, medians")
for (door, streams), by in sorted(rows.items()):
    med = {a: statistics.median(v) for a, v in by.items()}
    line = {"bench": "relay_cpu_features", "run": run, "git": recs[0].get("git"),
            "baseline_daemon": next((r["daemon_binary"] for r in recs if r["label"].endswith(" baseline")), None),
            "door": door, "streams": streams,
            "daemon_worker_us_per_token": med,
            "samples": {a: len(v) for a, v in by.items()},
            "off_over_baseline": med["traces off"] / med["baseline"] if med.get("baseline") and "traces off" in med else None,
            "on_over_off": med["traces on"] / med["traces off"] if med.get("traces off") and "traces on" in med else None}
    out.write(json.dumps(line) + "\n")
    ratio = lambda r: "-" if r is None else f"{r:.3f}"
    print(f"  {door:<7} {streams:>3} streams: " + "  ".join(f"{a} {v:.1f}" for a, v in sorted(med.items()))
          + f"  off/baseline {ratio(line['off_over_baseline'])}  on/off {ratio(line['on_over_off'])}")
EOF
