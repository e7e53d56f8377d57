//! The gRPC contracts of tt-serving, generated from `proto/tt/serving/v1/`.
//!
//! Layout:
//! - `generation.proto`: the request and streamed response types shared by
//!   the client API and the worker API, so the daemon forwards without
//!   translating.
//! - `inference.proto`: `Inference`, the client-facing service.
//! - `control.proto`: `Control`, the operator's service on the local socket.
//! - `engine.proto`: `Engine`, the daemon-to-worker contract.
//! - [`json`]: how the Control messages read as JSON (ttctl's `--json`
//!   output) and the words ttctl prints for their enums ([`Word`]).
//! - [`CacheMode`]: `TT_CACHE_MODE`, the one worker-environment value
//!   both the daemon and the worker interpret.
//! - [`time`]: timestamps as the protocols carry them (Unix ms).
//! - [`uds`]: gRPC over unix sockets: the quiet stream, the server's
//!   incoming connections, a client channel.
//! - [`echo`]: quoting client input in errors and logs, bounded (the
//!   daemon's and the OpenAI wire format's refusals).
//! - [`parameters`]: the optional `GenerateRequest` parameters, by the names
//!   engines list in `Info`, and which of them a request asks for.

pub mod accuracy;
pub mod echo;
pub mod json;
pub mod parameters;
pub mod time;
pub mod uds;

/// How a worker starts on its cache variant (`TT_CACHE_MODE`), as the
/// daemon decides it and the worker obeys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// The variant is complete: the worker maps its files and never reads
    /// the checkpoint's tensor data.
    Warm,
    /// The variant is (re)built: the worker reads the checkpoint, writes
    /// every file, and the daemon marks the variant complete once the
    /// worker passed readiness.
    Cold,
}

impl CacheMode {
    /// `warm` or `cold`: the value of `TT_CACHE_MODE`, and what status,
    /// logs, metrics and `Info` say.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheMode::Warm => "warm",
            CacheMode::Cold => "cold",
        }
    }
}

pub use json::Word;

/// Package `tt.serving.v1`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("tt.serving.v1");
}

/// Encoded `FileDescriptorSet` of every tt-serving proto, for server
/// reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tt_serving_descriptor.bin"));

/// A finish reason as traces and logs name it: `stop`, `length`,
/// `cancelled`, `tool_calls` (`unspecified` for a chunk that set none).
pub fn finish_reason_name(reason: v1::FinishReason) -> &'static str {
    match reason {
        v1::FinishReason::Stop => "stop",
        v1::FinishReason::Length => "length",
        v1::FinishReason::Cancelled => "cancelled",
        v1::FinishReason::ToolCalls => "tool_calls",
        v1::FinishReason::Unspecified => "unspecified",
    }
}
