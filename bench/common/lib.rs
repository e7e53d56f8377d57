//! What the benchmark drivers share: one HTTP client for the OpenAI door
//! (requests, server-sent events), one gRPC stream reader, the engine
//! behind a worker, the host's description for the records, and ttctl's
//! statistics. Each driver keeps only its workload and its report.

pub mod grpc;
pub mod host;
pub mod http;

/// Quantiles by nearest rank: ttctl's definition, so a driver's p50 is
/// the p50 `ttctl bench` prints.
pub use ttctl::stats;
