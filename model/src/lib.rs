//! tt-worker: the reference model engine of tt-serving.
//!
//! It serves `engine.proto` on the unix socket the daemon names, and runs a
//! real Llama-family model from a GGUF checkpoint on the CPU: real weights,
//! real tokens, tensor parallelism across ranks (one per card), continuous
//! batching, and a tensor cache with cold and warm starts. A production site
//! plugs a tt-metal engine into the same contract; see [`cli`] for it.
//!
//! # Layout
//!
//! - [`cli`]: the command-line and environment contract, validated (exit 2).
//! - [`worker`]: the life of the process: bind early, load, serve, drain, exit.
//! - [`server`]: the `Engine` gRPC service (Info, Health, Generate, Shutdown).
//! - [`state`]: lifecycle phase, load progress and health counters, shared
//!   by the loader, the engine thread and the RPC handlers.
//! - [`gguf`]: reading a checkpoint's header: hyperparameters, tokenizer
//!   data, chat template, tensor directory.
//! - [`tokenizer`]: byte-level BPE from the GGUF metadata, and incremental
//!   detokenization that never splits a UTF-8 character.
//! - [`chat_template`]: rendering chats with the checkpoint's Jinja template.
//! - [`weights`]: the shard plan (which rank holds which rows or columns, in
//!   which dtype) and the load through the cache.
//! - [`cache`]: the tensor cache files: naming, writing (temp + rename),
//!   mapping and checking.
//! - [`model`]: one rank's forward pass (RMSNorm, RoPE, GQA over the paged
//!   KV pool, SwiGLU MLP) over our kernels (Q4_1, Q8_0) or candle's
//!   quantized matmuls (other dtypes).
//! - [`attention`]: causal attention over the paged KV pool, in units of
//!   (sequence, token tile, KV head, span of keys) with long histories'
//!   partial softmaxes merged.
//! - [`kv`]: the KV block pool's bookkeeping and the prefix cache (blocks
//!   indexed by their tokens, reference counts, LRU eviction).
//! - [`kernels`]: our AVX2 Q4_1 and Q8_0 matmuls (plain, and interleaved by 8
//!   rows at the cold build): batched, the same bits alone or in a batch,
//!   with a scalar fallback.
//! - [`lanes`]: the loops between the matmuls (attention's dot products
//!   and weighted sums, f16 KV conversions, norms, SwiGLU), compiled for
//!   baseline x86-64 and for AVX2 + FMA + F16C and picked at start with
//!   the kernels' instruction set; the same bits either way.
//! - [`pool`]: the threads a matmul, and attention, are split over (yielding
//!   waits).
//! - [`tp`]: rank threads and the all-reduce between them.
//! - [`scheduler`]: continuous batching on the engine thread, bounded
//!   admission, prefix reuse, preemption when the KV pool runs out, drain.
//! - [`sampling`]: greedy, temperature, top-k, top-p, seeded; the presence,
//!   frequency and repetition penalties; logprobs.
//! - [`output`]: streaming text with stop strings.
//! - [`banners`]: `<FLAG> engaged`, printed when a feature actually runs.
//! - [`faults`]: TEST-ONLY fault modes, behind `TTW_TEST_FAULTS=1`.
//! - [`testmodel`]: a tiny deterministic Llama GGUF for tests.

pub mod attention;
pub mod banners;
pub mod cache;
pub mod chat_template;
pub mod cli;
pub mod faults;
pub mod gguf;
pub mod kernels;
pub mod kv;
pub mod lanes;
pub mod model;
pub mod output;
pub mod pool;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod state;
pub mod testmodel;
pub mod tokenizer;
pub mod tp;
pub mod weights;
pub mod worker;
