//! The HTTP client side: a streamed chat turn as an OpenAI client makes
//! it, and the few plain requests around it (a token count, a health
//! check, a metrics scrape).

use crate::workload::Target;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// An HTTP/1 client. Every request goes out with `connection: close`, a
/// new connection each (as bench-openai does): a pooled connection that
/// llama-server closed while idle between rounds fails the next request
/// that picks it up, and a loopback connect costs both arms the same
/// ~0.1 ms.
pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

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
    let (mut body, mut pending) = (
        post(client, target, "/v1/chat/completions", &body).await,
        Vec::new(),
    );
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("reading the SSE body").into_data() else {
            continue;
        };
        pending.extend_from_slice(&data);
        // Whole events only: `data: {...}\n\n`.
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            let payload = event.strip_prefix(b"data: ").unwrap_or(&event);
            let Ok(chunk) = serde_json::from_slice::<Value>(payload) else {
                continue; // [DONE]
            };
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
        }
    }
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
    let body = post(client, target, "/v1/completions", &body).await;
    let answer: Value = serde_json::from_slice(&body.collect().await.expect("body").to_bytes())
        .expect("a JSON completion");
    answer["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{}: no usage.prompt_tokens in {answer}", target.base)) as u32
}

/// The status and body of a GET, or None when nothing answers.
pub async fn get(client: &HttpClient, url: &str) -> Option<(u16, String)> {
    let request = hyper::Request::get(url)
        .header("connection", "close")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let response = client.request(request).await.ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

async fn post(
    client: &HttpClient,
    target: &Target,
    path: &str,
    body: &Value,
) -> hyper::body::Incoming {
    let request = hyper::Request::post(format!("{}{path}", target.base))
        .header("content-type", "application/json")
        .header("connection", "close")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let response = client
        .request(request)
        .await
        .unwrap_or_else(|e| panic!("POST {}{path}: {e}", target.base));
    let status = response.status();
    let body = response.into_body();
    if status != 200 {
        let text = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        panic!(
            "POST {}{path}: HTTP {status}: {}",
            target.base,
            String::from_utf8_lossy(&text)
        );
    }
    body
}
