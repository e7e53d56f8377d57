#!/usr/bin/env python3
"""Ratios of one bench/engine run, side by side: median and spread (min-max)."""
import json, statistics, sys

def main():
    path, run = sys.argv[1], sys.argv[2]
    recs = [json.loads(l) for l in open(path) if l.strip()]
    recs = [r for r in recs if r.get("run") == run]
    def vals(engine, metric, key, **match):
        return [r[key] for r in recs if r.get("engine") == engine and r.get("metric") == metric
                and all(r.get(k) == v for k, v in match.items())]
    def fmt(xs):
        return "n/a" if not xs else f"{statistics.median(xs):.1f} (min {min(xs):.1f}, max {max(xs):.1f}, n={len(xs)})"
    ours = vals("tt-worker", "single_stream", "decode_tok_s", tp=1)
    peer = vals("llama.cpp", "single_stream", "decode_tok_s")
    print(f"single-stream decode tok/s, TP=1: {fmt(ours)}")
    print(f"single-stream decode tok/s, TP=2: {fmt(vals('tt-worker', 'single_stream', 'decode_tok_s', tp=2))}")
    print(f"llama.cpp single-stream decode tok/s: {fmt(peer)}")
    if ours and peer:
        print(f"ratio tt-worker/llama.cpp: {statistics.median(ours) / statistics.median(peer):.2f} (target >= 1.0)")
    print(f"TTFT ms, TP=1: {fmt(vals('tt-worker', 'single_stream', 'ttft_ms', tp=1))}")
    for s in (1, 4, 8):
        print(f"aggregate tok/s, TP=1, {s} streams: {fmt(vals('tt-worker', 'aggregate', 'tok_s', tp=1, streams=s))}")
    agg8 = vals("tt-worker", "aggregate", "tok_s", tp=1, streams=8)
    if ours and agg8:
        print(f"ratio aggregate@8 / single: {statistics.median(agg8) / statistics.median(ours):.2f} (target >= 2.0)")
    lr = vals("tt-worker", "load_ms", "cold_over_warm", tp=1)
    print(f"cold/warm load time, TP=1: {fmt(lr)} (target >= 5)")
    print(f"peak RSS / GGUF size: {fmt(vals('tt-worker', 'peak_rss', 'rss_over_gguf', tp=1))} (target <= 2)")

if __name__ == "__main__":
    main()
