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

pub mod json;

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
