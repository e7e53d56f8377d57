#!/usr/bin/env python3
"""Ratios of one bench/engine run, side by side: median and spread (min-max).

The peer is whichever ran: llama-server (the one issue 27's targets name:
>= 1.3x at one stream, >= 2.5x at eight) or llama.cpp in-process. With a
baseline worker in the run, what this build bought is printed too.
"""
import json, statistics, sys


def main():
    path, run = sys.argv[1], sys.argv[2]
    recs = [json.loads(l) for l in open(path) if l.strip()]
    recs = [r for r in recs if r.get("run") == run]

    def vals(engine, metric, key, worker=None, **match):
        return [r[key] for r in recs if r.get("engine") == engine and r.get("metric") == metric
                and (worker is None or r.get("worker", "this") == worker)
                and all(r.get(k) == v for k, v in match.items())]

    def fmt(xs):
        return "n/a" if not xs else f"{statistics.median(xs):.1f} (min {min(xs):.1f}, max {max(xs):.1f}, n={len(xs)})"

    def ratio(a, b):
        return "n/a" if not a or not b else f"{statistics.median(a) / statistics.median(b):.2f}"

    peer = "llama-server" if any(r.get("engine") == "llama-server" for r in recs) else "llama.cpp"
    workers = ["this"] + (["baseline"] if any(r.get("worker") == "baseline" for r in recs) else [])
    single = {w: vals("tt-worker", "single_stream", "decode_tok_s", w, tp=1) for w in workers}
    agg8 = {w: vals("tt-worker", "aggregate", "tok_s", w, tp=1, streams=8) for w in workers}
    peer_single = vals(peer, "single_stream", "decode_tok_s")
    peer_agg8 = vals(peer, "aggregate", "tok_s", streams=8)
    for w in workers:
        print(f"[{w}] single-stream decode tok/s, TP=1: {fmt(single[w])}")
        print(f"[{w}] single-stream decode tok/s, TP=2: {fmt(vals('tt-worker', 'single_stream', 'decode_tok_s', w, tp=2))}")
        print(f"[{w}] TTFT ms, TP=1: {fmt(vals('tt-worker', 'single_stream', 'ttft_ms', w, tp=1))}")
        for s in (1, 4, 8):
            print(f"[{w}] aggregate tok/s, TP=1, {s} streams: {fmt(vals('tt-worker', 'aggregate', 'tok_s', w, tp=1, streams=s))}")
        print(f"[{w}] ratio aggregate@8 / single: {ratio(agg8[w], single[w])} (target >= 2.0)")
        print(f"[{w}] cold/warm load time, TP=1: {fmt(vals('tt-worker', 'load_ms', 'cold_over_warm', w, tp=1))} (target >= 5)")
        print(f"[{w}] peak RSS / GGUF size: {fmt(vals('tt-worker', 'peak_rss', 'rss_over_gguf', w, tp=1))} (target <= 2)")
    print(f"{peer} single-stream decode tok/s: {fmt(peer_single)}")
    if peer_agg8:
        print(f"{peer} aggregate tok/s, 8 streams: {fmt(peer_agg8)}")
    single_target, agg_target = (1.3, 2.5) if peer == "llama-server" else (1.0, None)
    for w in workers:
        print(f"[{w}] single stream tt-worker / {peer}: {ratio(single[w], peer_single)} (target >= {single_target})")
        if agg_target:
            print(f"[{w}] 8 streams tt-worker / {peer}: {ratio(agg8[w], peer_agg8)} (target >= {agg_target})")
    if "baseline" in workers:
        print(f"this / baseline, single stream: {ratio(single['this'], single['baseline'])}; "
              f"8 streams: {ratio(agg8['this'], agg8['baseline'])}")


if __name__ == "__main__":
    main()
