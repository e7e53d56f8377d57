//! tt-worker: the reference model engine (see issue: GGUF Llama, TP=1/TP=2).
