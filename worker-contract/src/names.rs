//! The contract's names: the environment the daemon sets for every worker
//! and the exit statuses it reads back. The daemon and every worker use
//! these constants, so a rename is one edit and a compile error elsewhere.

/// The unix socket the worker serves engine.proto on.
pub const SOCKET: &str = "TT_WORKER_SOCKET";
/// The checkpoint (a path for tt-worker; whatever the engine takes for
/// tt-worker-openai).
pub const MODEL: &str = "TT_WORKER_MODEL";
/// Tensor-parallel degree: ranks, one card each.
pub const TP: &str = "TT_WORKER_TP";
/// The cache variant's directory.
pub const CACHE_DIR: &str = "TT_CACHE_DIR";
/// `warm` or `cold` ([`tt_serving_proto::CacheMode`]).
pub const CACHE_MODE: &str = "TT_CACHE_MODE";
/// The slot's cards by PCI address, comma-separated, rank order.
pub const VISIBLE_DEVICES: &str = "TT_VISIBLE_DEVICES";
/// The slot's cards' device nodes, comma-separated, rank order, resolved
/// at each start (card numbers can change across a reset).
pub const DEVICES: &str = "TT_WORKER_DEVICES";
/// The mesh shape vLLM-TT reads (`(1,1)`, `(1,2)`).
pub const MESH_DEVICE: &str = "MESH_DEVICE";
/// The model's `[models.X.tt]` table as a JSON object, set only when the
/// table is: the settings vLLM-TT takes as `--additional-config
/// '{"tt": ...}'` (tt-worker-openai `--engine vllm-tt` passes them; a
/// worker that does not know the variable must refuse to start, so the
/// settings are never dropped silently).
pub const TT_CONFIG: &str = "TT_WORKER_TT_CONFIG";
/// The worker's log filter (tracing's `EnvFilter` syntax; default `info`).
pub const LOG: &str = "TT_WORKER_LOG";

/// The OTLP/gRPC collector the worker exports its spans to
/// (`http://HOST:PORT`), set only while the daemon's `[tracing]
/// otlp_endpoint` is. A worker's span for a request is a child of the
/// daemon's: the trace context comes as `traceparent` on the call.
pub const OTLP_ENDPOINT: &str = "TT_WORKER_OTLP_ENDPOINT";
/// OpenTelemetry's own resource variable (the SDKs read it): the daemon
/// puts `tt.slot=<slot>,tt.model=<model>` in front of a model's own
/// value beside [`OTLP_ENDPOINT`].
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// Set to `1` by the daemon for the identity step: the worker prints one
/// line, [`IDENTITY_PREFIX`] and a JSON object of strings naming the engine
/// it would run (versions, build), and exits 0 without binding a socket or
/// touching a card. The daemon puts the answer in the cache variant's key,
/// so an engine upgrade never starts warm on another engine's cache.
pub const IDENTIFY: &str = "TT_WORKER_IDENTIFY";
/// How the identity line starts.
pub const IDENTITY_PREFIX: &str = "TT_WORKER_IDENTITY ";

/// Every variable the daemon sets for a worker: a model's flags and env
/// tables may not override them, and a banner rule never counts them as
/// feature flags.
pub const RESERVED: &[&str] = &[
    VISIBLE_DEVICES,
    MESH_DEVICE,
    SOCKET,
    MODEL,
    TP,
    CACHE_DIR,
    CACHE_MODE,
    DEVICES,
    IDENTIFY,
    TT_CONFIG,
    OTLP_ENDPOINT,
];

/// Exit status of a worker that served and drained (or was stopped
/// before it served) cleanly: its cards are clean.
pub const EXIT_OK: u8 = 0;
/// Exit status of a worker that failed: the daemon treats its cards as
/// dirty and resets them.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status for bad arguments or environment: the start is refused
/// before any card is touched (clap exits with it too).
pub const EXIT_USAGE: u8 = 2;
