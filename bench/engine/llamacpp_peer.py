#!/usr/bin/env python3
"""llama.cpp on the same GGUF, the reference peer of bench/engine/run.sh.

Greedy (temperature 0, repeat_penalty 1.0) with 2 threads, in-process through
llama-cpp-python, so the figure is llama.cpp's decode speed without HTTP.
Prints JSON lines like bench_engine.
"""
import argparse, json, os, time

PROMPT = "The capital of France is"

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    base = {"engine": "llama.cpp", "model": os.path.basename(a.model), "max_tokens": a.tokens, "cpus": os.cpu_count()}
    try:
        from llama_cpp import Llama
    except ImportError:
        print(json.dumps({**base, "metric": "skipped", "reason": "llama-cpp-python is not installed: pip install 'llama-cpp-python[server]'"}))
        return
    llm = Llama(model_path=a.model, n_threads=2, n_ctx=2048, verbose=False)
    llm(PROMPT, max_tokens=8, temperature=0.0, repeat_penalty=1.0)
    for rep in range(a.repeats):
        llm.reset()
        t0 = time.perf_counter()
        first = None
        n = 0
        for _ in llm(PROMPT, max_tokens=a.tokens, temperature=0.0, repeat_penalty=1.0, stream=True):
            n += 1
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        print(json.dumps({**base, "metric": "single_stream", "tp": 1, "rep": rep, "tokens": n,
                          "decode_tok_s": (n - 1) / max(end - first, 1e-9), "ttft_ms": (first - t0) * 1e3}), flush=True)

if __name__ == "__main__":
    main()
