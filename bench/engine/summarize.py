#!/usr/bin/env python3
"""Ratios of one bench/engine run, side by side: median and spread (min-max).

With a third argument (a file), also appends one summary record with an
`id` (`engine-<run>`) holding every median printed, so a document can cite
them (`ttctl bench cite`).

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

    figures = {}

    def keep(name, xs):
        if xs:
            figures[name] = {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4),
                             "max": round(max(xs), 4), "n": len(xs)}

    def keep_ratio(name, a, b):
        if a and b:
            figures[name] = round(statistics.median(a) / statistics.median(b), 4)

    def fmt(xs):
        return "n/a" if not xs else f"{statistics.median(xs):.1f} (min {min(xs):.1f}, max {max(xs):.1f}, n={len(xs)})"

    def ratio(a, b):
        return "n/a" if not a or not b else f"{statistics.median(a) / statistics.median(b):.2f}"

    peer = "llama-server" if any(r.get("engine") == "llama-server" for r in recs) else "llama.cpp"
    workers = ["this"] + [w for w in ("native", "baseline") if any(r.get("worker") == w for r in recs)]
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
    keep("peer_single_tok_s", peer_single)
    keep("peer_agg8_tok_s", peer_agg8)
    for w in workers:
        keep(f"{w}_single_tok_s", single[w])
        keep(f"{w}_agg8_tok_s", agg8[w])
        keep_ratio(f"{w}_single_over_peer", single[w], peer_single)
        keep_ratio(f"{w}_agg8_over_peer", agg8[w], peer_agg8)
    for w in workers:
        print(f"[{w}] single stream tt-worker / {peer}: {ratio(single[w], peer_single)} (target >= {single_target})")
        if agg_target:
            print(f"[{w}] 8 streams tt-worker / {peer}: {ratio(agg8[w], peer_agg8)} (target >= {agg_target})")
    # Prefill, timed at the client (request_ms, one token out) for both
    # engines: unique prompts as tok/s, repeated ones as the request time.
    def prefill(engine, words, phase, worker=None):
        return [r["prompt_tokens"] / (r["request_ms"] / 1e3) if phase == "unique" else r["request_ms"]
                for r in recs if r.get("engine") == engine and r.get("metric") == "prefill"
                and r.get("tp") == 1 and r.get("prompt_words") == words and r.get("phase") == phase
                and (worker is None or r.get("worker", "this") == worker)]
    lengths = sorted({r["prompt_words"] for r in recs if r.get("metric") == "prefill"})
    for words in lengths:
        peer_u, peer_r = prefill(peer, words, "unique"), prefill(peer, words, "repeated")
        print(f"{peer} prefill tok/s, {words}-word prompt: {fmt(peer_u)}; repeated, request ms: {fmt(peer_r)}")
        keep(f"peer_prefill{words}_tok_s", peer_u)
        keep(f"peer_repeated{words}_ms", peer_r)
        for w in workers:
            u, rr = prefill("tt-worker", words, "unique", w), prefill("tt-worker", words, "repeated", w)
            print(f"[{w}] prefill tok/s, {words}-word prompt: {fmt(u)}; tt-worker / {peer}: {ratio(u, peer_u)} (target >= 1.0)")
            print(f"[{w}] repeated prompt, request ms: {fmt(rr)}; tt-worker / {peer}: {ratio(rr, peer_r)} (target <= 1.0)")
            keep(f"{w}_prefill{words}_tok_s", u)
            keep(f"{w}_repeated{words}_ms", rr)
            keep_ratio(f"{w}_prefill{words}_over_peer", u, peer_u)
            keep_ratio(f"{w}_repeated{words}_over_peer", rr, peer_r)
    if "native" in workers:
        print(f"portable / native, single stream: {ratio(single['this'], single['native'])}; "
              f"8 streams: {ratio(agg8['this'], agg8['native'])} (target >= 0.97)")
        keep_ratio("single_portable_over_native", single["this"], single["native"])
        keep_ratio("agg8_portable_over_native", agg8["this"], agg8["native"])
        for words in lengths:
            u, n = prefill("tt-worker", words, "unique", "this"), prefill("tt-worker", words, "unique", "native")
            print(f"portable / native, prefill {words} words: {ratio(u, n)} (target >= 0.97)")
            keep_ratio(f"prefill{words}_portable_over_native", u, n)
    if "baseline" in workers:
        print(f"this / baseline, single stream: {ratio(single['this'], single['baseline'])}; "
              f"8 streams: {ratio(agg8['this'], agg8['baseline'])}")
        keep_ratio("single_this_over_baseline", single["this"], single["baseline"])
        keep_ratio("agg8_this_over_baseline", agg8["this"], agg8["baseline"])
        for words in lengths:
            keep_ratio(f"prefill{words}_this_over_baseline", prefill("tt-worker", words, "unique", "this"),
                       prefill("tt-worker", words, "unique", "baseline"))
    if len(sys.argv) > 3:
        first = recs[0] if recs else {}
        summary = {"id": f"engine-{run}", "run": run, "git": first.get("git"), "peer": peer,
                   "model": first.get("model"), "cpus": first.get("cpus"), "max_tokens": first.get("max_tokens"),
                   "builds": sorted({r.get("build", "") for r in recs if r.get("engine") == "tt-worker"}),
                   "figures": figures}
        with open(sys.argv[3], "a") as out:
            out.write(json.dumps(summary, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
