//! The chat workload's requests: a streamed chat turn as an OpenAI client
//! makes it, and a token count (over tt_bench's HTTP client, which also
//! does the health checks and metrics scrapes).

use crate::workload::Target;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tt_bench::http::{for_each_event, post, post_json, Connection};
pub use tt_bench::http::{get, HttpClient};

/// What one streamed chat turn returned.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    /// The answer's text, deltas joined: the next turn's assistant message.
    pub text: String,
    /// From sending the request to the first chunk with text.
    pub ttft: Duration,
    /// `usage.completion_tokens`.
    pub completion_tokens: u32,
    /// `usage.prompt_tokens`: the whole rendered conversation.
    pub prompt_tokens: u32,
    /// `usage.prompt_tokens_details.cached_tokens`, when the server sends it.
    pub cached_tokens: Option<u32>,
    /// llama-server's own count of prompt tokens it took from its cache
    /// (`timings.cache_n` of the last chunk), when the server sends it.
    pub timings_cache_n: Option<u32>,
}

/// One streamed `/v1/chat/completions` turn: greedy, `max_tokens` long
/// (`ignore_eos`), with the usage chunk at the end.
pub async fn chat_once(
    client: &HttpClient,
    target: &Target,
    messages: &[Value],
    max_tokens: u32,
) -> Reply {
    let body = json!({
        "model": target.model, "messages": messages, "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true},
    });
    let start = Instant::now();
    let mut reply = Reply::default();
    let mut ttft = None;
    let url = format!("{}/v1/chat/completions", target.base);
    let body = post(client, &url, &body, Connection::Close).await;
    for_each_event(body, |chunk| {
        if let Some(error) = chunk.get("error") {
            panic!(
                "{} answered with an error in the stream: {error}",
                target.base
            );
        }
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            if !text.is_empty() {
                ttft.get_or_insert_with(|| start.elapsed());
                reply.text.push_str(text);
            }
        }
        let usage = &chunk["usage"];
        if let Some(n) = usage["completion_tokens"].as_u64() {
            reply.completion_tokens = n as u32;
            reply.prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0) as u32;
            reply.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .map(|n| n as u32);
        }
        if let Some(n) = chunk["timings"]["cache_n"].as_u64() {
            reply.timings_cache_n = Some(n as u32);
        }
    })
    .await;
    assert!(
        reply.completion_tokens > 0,
        "{}: a chat stream ended without a usage chunk",
        target.base
    );
    reply.ttft = ttft.unwrap_or_else(|| start.elapsed());
    reply
}

/// How many tokens `text` is to the server: `usage.prompt_tokens` of a
/// one-token `/v1/completions` on it, with no chat template around it.
pub async fn prompt_tokens(client: &HttpClient, target: &Target, text: &str) -> u32 {
    let body = json!({
        "model": target.model, "prompt": text, "max_tokens": 1, "temperature": 0,
    });
    let url = format!("{}/v1/completions", target.base);
    let answer = post_json(client, &url, &body).await;
    answer["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{}: no usage.prompt_tokens in {answer}", target.base)) as u32
}
