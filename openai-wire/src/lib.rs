//! The OpenAI wire format, written once. The daemon's OpenAI front door
//! (`daemon/src/api/openai/`) writes these shapes to its clients and
//! tt-worker-openai (`openai-worker/src/openai.rs`) reads the same shapes
//! from its engine (vLLM, llama-server), so both sides of each shape live
//! in one file here and its tests read back what it writes.
//!
//! # Layout
//!
//! - [`Endpoint`] (`endpoint.rs`): `/v1/completions` and
//!   `/v1/chat/completions`, their paths, `object` names and id prefixes.
//! - [`chunk`]: a completion or chat completion object (`id`, `object`,
//!   `created`, `model`, `choices`, `usage`), streamed or collected:
//!   written by the door ([`chunk::Head`], [`chunk::Writer`] straight into
//!   SSE bytes) and read from an engine's stream ([`chunk::Chunk`], by the
//!   fast path without a JSON tree or the general one, which agree).
//! - [`finish`]: OpenAI's `finish_reason` words and the protocol's
//!   `FinishReason`, both ways.
//! - [`Usage`] (`usage.rs`): `usage` with `prompt_tokens_details`, written
//!   from a final chunk and read from an engine's usage chunk.
//! - [`logprobs`]: the completions shape (parallel lists) and the chat
//!   shape (`content` entries), written from and read into the protocol's
//!   `TokenLogprob`.
//! - [`tool_calls`]: a chat delta's `tool_calls` pieces, written and read,
//!   and joined into a collected answer's `message.tool_calls`.
//! - [`request`]: a request's body, read by the door into the protocol's
//!   `GenerateRequest` (strictly: unknown fields and parameters no engine
//!   honours refused by name, [`request::Refused`]) and written from one
//!   by the worker for its engine ([`request::write`]).
//! - [`ResponseFormat`] (`response_format.rs`): a chat's
//!   `response_format`, both ways.
//! - [`error`]: an error as OpenAI sends it, written by the door (its
//!   answers, and the event that ends a stream) and read from an engine in
//!   both vLLM shapes.
//! - [`cut`]: engine text quoted in an error, cut to a length.

pub mod chunk;
mod endpoint;
pub mod error;
pub mod finish;
pub mod logprobs;
pub mod request;
mod response_format;
pub mod tool_calls;
mod usage;

pub use endpoint::Endpoint;
pub use response_format::{JsonSchema, ResponseFormat};
pub use usage::{PromptTokensDetails, Usage, UsageIn};

/// `s` cut to at most `max` bytes on a character boundary, with a mark.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}
