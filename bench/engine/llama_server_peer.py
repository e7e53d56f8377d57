#!/usr/bin/env python3
"""llama.cpp's llama-server on the same GGUF: the peer of bench/engine/run.sh
that the engine targets are stated against (issue 27).

Started as the other benches start it (`-np 8 -c 8192 -t 2`: both cores, one
slot per stream), greedy (temperature 0, no repetition penalty), driven over
its native `/completion` endpoint with the same prompts, token counts and
stream counts as bench_engine drives tt-worker:

- single_stream: one request, `decode_tok_s` from llama-server's own
  timings (`predicted_per_second`), as tt-worker's comes from its own
  `Timings`; the client's figure is recorded beside it.
- aggregate: N concurrent requests, tokens generated / wall time at the
  client, as bench_engine measures tt-worker.

- prefill: bench_engine's long prompts (the same words from the same
  generator), one token out: a unique prompt, then the same prompt again
  with `cache_prompt: true`, so llama-server answers the repeat from its
  prompt cache as tt-worker answers it from its prefix cache.

Every other request gets `cache_prompt: false`, so a repeat never reuses the
previous one's KV, and `ignore_eos`, so every stream decodes all its tokens
(bench_engine asks tt-worker the same; `--honour-eos` lets both end at EOS).
Prints JSON lines like bench_engine.
"""
import argparse, json, os, socket, subprocess, sys, tempfile, threading, time, urllib.request

# bench_engine's prompts (model/examples/bench_engine.rs), in its order.
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "The quick brown fox",
    "In 1969, the first man on the moon was",
    "The best way to learn a language is",
]


# bench_engine's long-prompt words and generator (long_prompt in
# model/examples/bench_engine.rs): the same text for the same nonce.
WORDS = ["time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
         "school", "state", "family", "student", "group", "country", "problem", "hand", "part",
         "place", "case", "week", "company", "system", "program", "question", "work", "government",
         "number", "night", "point"]
MASK = (1 << 64) - 1


def long_prompt(words, nonce):
    out = [f"Note {nonce}:"]
    x = (nonce * 6364136223846793005 + 1442695040888963407) & MASK
    for _ in range(words):
        x = (x * 6364136223846793005 + 1442695040888963407) & MASK
        out.append(WORDS[x >> 59])
    return " ".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


IGNORE_EOS = True


def completion(port, prompt, tokens, cache_prompt=False):
    return post(port, {"prompt": prompt, "n_predict": tokens, "temperature": 0.0, "repeat_penalty": 1.0,
                       "top_k": 1, "cache_prompt": cache_prompt, "ignore_eos": IGNORE_EOS, "stream": False})


def wait_healthy(port, proc, log, deadline_s=300):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode} before it was ready; its log: {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"llama-server not healthy after {deadline_s} s; its log: {log}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, help="the llama-server binary (scripts/llama-server.sh)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", default="1,4,8", help="aggregate measurements, comma-separated")
    ap.add_argument("--prefill", default="512,2048", help="long-prompt word counts, comma-separated")
    ap.add_argument("--honour-eos", action="store_true", help="streams end at EOS as clients get them")
    a = ap.parse_args()
    global IGNORE_EOS
    IGNORE_EOS = not a.honour_eos
    prefill = [int(s) for s in a.prefill.split(",") if s]
    streams = [int(s) for s in a.streams.split(",") if s]
    if any(s > 8 for s in streams):
        sys.exit("--streams: at most 8 (llama-server runs with -np 8)")
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="llama-server-peer-", suffix=".log", delete=False).name
    # 8 slots of 4096 tokens each: bench_engine's workers get a 4096-token
    # context too (TT_WORKER_MAX_SEQ_LEN).
    args = [a.llama_server, "-m", a.model, "--host", "127.0.0.1", "--port", str(port),
            "-np", "8", "-c", "32768", "-t", str(a.threads)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    base = {"engine": "llama-server", "model": os.path.basename(a.model), "max_tokens": a.tokens,
            "cpus": os.cpu_count(), "threads": a.threads, "args": " ".join(args[3:])}
    try:
        wait_healthy(port, proc, log)
        completion(port, PROMPTS[0], 8)  # warm-up, as bench_engine does
        for rep in range(a.repeats):
            t0 = time.perf_counter()
            r = completion(port, PROMPTS[0], a.tokens)
            wall = time.perf_counter() - t0
            t = r["timings"]
            print(json.dumps({**base, "metric": "single_stream", "tp": 1, "rep": rep,
                              "tokens": r["tokens_predicted"], "decode_tok_s": t["predicted_per_second"],
                              "ttft_ms": t["prompt_ms"], "client_tok_s": r["tokens_predicted"] / wall}), flush=True)
        for n in streams:
            for rep in range(a.repeats):
                results = [None] * n
                errors = []

                def one(i):
                    try:
                        results[i] = completion(port, PROMPTS[i % len(PROMPTS)], a.tokens)
                    except Exception as e:  # noqa: BLE001 - reported below
                        errors.append(f"stream {i}: {e}")

                threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
                t0 = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - t0
                if errors:
                    sys.exit("llama-server: " + "; ".join(errors))
                total = sum(r["tokens_predicted"] for r in results)
                print(json.dumps({**base, "metric": "aggregate", "tp": 1, "streams": n, "rep": rep,
                                  "tokens": total, "wall_s": wall, "tok_s": total / wall}), flush=True)
        for words in prefill:
            for rep in range(a.repeats):
                # bench_engine's nonce for TP=1.
                prompt = long_prompt(words, 1000 * words + rep + 7919)
                for phase in ("unique", "repeated"):
                    t0 = time.perf_counter()
                    r = completion(port, prompt, 1, cache_prompt=True)
                    wall = time.perf_counter() - t0
                    t = r["timings"]
                    total = r.get("tokens_evaluated", 0)
                    print(json.dumps({**base, "metric": "prefill", "tp": 1, "rep": rep, "prompt_words": words,
                                      "phase": phase, "prompt_tokens": total,
                                      "cached_tokens": total - t.get("prompt_n", 0),
                                      "expect_cached": phase == "repeated", "ttft_ms": t["prompt_ms"],
                                      "request_ms": wall * 1e3,
                                      "prefill_tok_s": total / max(t["prompt_ms"] / 1e3, 1e-9)}), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
