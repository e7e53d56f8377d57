#!/usr/bin/env python3
"""What scoring a prompt costs in tt-worker, side by side in one run.

Three requests on the same prompt length through a running daemon's
OpenAI door, interleaved round by round, each prompt unique (a numbered
first line) so that no prefix cache serves one from another:

  generate   max_tokens 1, no logprobs: a prefill and one token
  score      echo, logprobs 0, max_tokens 0: the prompt's logprobs alone
  lm_eval    echo, logprobs 1, max_tokens 1: what lm-eval's
             log-likelihood requests send

Prints the medians and the ratios to `generate`, and appends one JSON
record (kind "prompt_logprobs_cost", with an id for `ttctl bench cite`)
to --out.

  tt-servingd demo &        # or any daemon with an [openai] door
  bench/eval/prompt_logprobs.py --door 127.0.0.1:8000 --model smollm2
"""
import argparse
import json
import statistics
import time
import urllib.request


def post(door, body):
    req = urllib.request.Request(
        f"http://{door}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.load(r)
    return time.perf_counter() - start, answer


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--door", default="127.0.0.1:8000")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--words", type=int, default=400, help="filler words per prompt")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default="bench/eval/records.jsonl")
    a = p.parse_args()
    filler = " ".join(["the river runs past old trees under a quiet sky"] * (a.words // 10))
    arms = {
        "generate": {"max_tokens": 1},
        "score": {"max_tokens": 0, "echo": True, "logprobs": 0},
        "lm_eval": {"max_tokens": 1, "echo": True, "logprobs": 1},
    }
    times = {k: [] for k in arms}
    prompt_tokens = set()
    names = list(arms)
    for r in range(a.rounds + 1):
        order = names[r % 3:] + names[:r % 3]
        for name in order:
            body = {"model": a.model, "prompt": f"{r}-{name}. {filler}", "temperature": 0}
            body.update(arms[name])
            took, answer = post(a.door, body)
            if r == 0:
                continue  # warm-up
            times[name].append(took)
            prompt_tokens.add(answer["usage"]["prompt_tokens"])
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    rec = {
        "kind": "prompt_logprobs_cost",
        "id": "plc-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
        "unix_ms": int(time.time() * 1000),
        "door": a.door,
        "model": a.model,
        "prompt_tokens": sorted(prompt_tokens),
        "rounds": a.rounds,
        "order": "rotated round by round, one warm-up round",
        "median_ms": {k: round(v, 2) for k, v in med.items()},
        "spread_ms": {k: [round(min(v) * 1000, 2), round(max(v) * 1000, 2)] for k, v in times.items()},
        "ratio_to_generate": {k: round(v / med["generate"], 3) for k, v in med.items()},
    }
    print(json.dumps(rec))
    with open(a.out, "a") as f:
        f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
