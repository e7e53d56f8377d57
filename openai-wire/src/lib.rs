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
//! - [`finish`]: OpenAI's `finish_reason` words and the protocol's
//!   `FinishReason`, both ways.
//! - [`Usage`] (`usage.rs`): `usage` with `prompt_tokens_details`, written
//!   from a final chunk and read from an engine's usage chunk.
//! - [`logprobs`]: the completions shape (parallel lists) and the chat
//!   shape (`content` entries), written from and read into the protocol's
//!   `TokenLogprob`.
//! - [`tool_calls`]: a chat delta's `tool_calls` pieces, written and read,
//!   and joined into a collected answer's `message.tool_calls`.
//! - [`cut`]: engine text quoted in an error, cut to a length.

mod endpoint;
pub mod finish;
pub mod logprobs;
pub mod tool_calls;
mod usage;

pub use endpoint::Endpoint;
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
