//! tt-worker-openai: the tt-serving worker for OpenAI-compatible engines.
//!
//! It honours the same contract towards the daemon as `tt-worker`
//! (engine.proto on `TT_WORKER_SOCKET`, the same environment, death with
//! the daemon, a bounded drain) and runs the real engine as its child:
//! vLLM with the Tenstorrent plugin on a real host, llama.cpp's
//! `llama-server` in tests and on machines without cards. The engine's
//! HTTP API is reached on a loopback port the worker picks; its output
//! passes through to the worker's, where the daemon reads banners.
//!
//! # Layout
//!
//! - [`cli`]: options before `--`, the engine's command line after it, the
//!   environment contract, and where the kernel cache goes.
//! - [`worker`]: the life: bind, start the engine, wait for readiness,
//!   serve, stop or report the death, as phases.
//! - [`engine`]: the engine process: own process group, parent-death
//!   signal, reaping (the worker is a subreaper), stopping the group
//!   (SIGTERM, bounded, SIGKILL), containers, the cause of a death.
//! - [`output`]: the engine's stdout and stderr passed through line by
//!   line, read for load progress, banners and vLLM's EngineCore death.
//! - [`ready`]: the readiness probe (health path, `/v1/models`, context
//!   length, version).
//! - [`server`]: the `Engine` gRPC service; `Generate` relays one streamed
//!   HTTP request per call and closes it when the call is dropped.
//! - [`status`]: phase, in-flight requests and the drain, the engine's load
//!   from its metrics.
//! - [`openai`]: the engine's side of the OpenAI API: requests, stream
//!   chunks, models (the shapes the daemon's door reads or writes too, the
//!   request body, `response_format`, the chunks and their choices,
//!   `usage`, logprobs, finish reasons and tool call pieces, are
//!   `tt_openai_wire`'s; the engine's rules on
//!   top of the body, such as vLLM's one more logprob, are here).
//! - [`http`]: the HTTP/1.1 client (one connection per request) and the SSE
//!   framing.
//! - [`metrics`]: reading gauges from a Prometheus text exposition.
//! - [`identity`]: the identity step: the worker's build and the engine
//!   Python's package versions, for the daemon's cache key.

pub mod cli;
pub mod engine;
pub mod http;
pub mod identity;
pub mod metrics;
pub mod openai;
pub mod output;
pub mod ready;
pub mod server;
pub mod status;
pub mod tt;
pub mod worker;
