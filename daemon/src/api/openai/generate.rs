//! `POST /v1/completions` and `POST /v1/chat/completions`: parse the body,
//! route it, and answer as OpenAI does, streamed (Server-Sent Events:
//! `data: {chunk}` lines, an optional usage chunk, `data: [DONE]`) or
//! collected into one JSON body.

use super::errors::ApiError;
use super::Front;
use crate::router::{ChunkStream, RouteError};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_stream::StreamExt;
use tt_openai_wire::request::{self, Echo, Parsed};
use tt_openai_wire::{finish, logprobs, tool_calls, Endpoint, Usage};
use tt_serving_proto::v1 as pb;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// `POST /v1/completions`.
pub async fn completions(
    State(front): State<Front>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(front, &headers, body, Endpoint::Completions).await
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(front): State<Front>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(front, &headers, body, Endpoint::Chat).await
}

/// The request header that carries a client's deadline in milliseconds
/// (OpenAI's API has none; gRPC clients send `grpc-timeout`).
pub const TIMEOUT_HEADER: &str = "x-request-timeout-ms";

/// The deadline a client set with [`TIMEOUT_HEADER`], if any.
fn deadline(headers: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(|ms| Some(Duration::from_millis(ms)))
        .ok_or_else(|| {
            ApiError::invalid(
                TIMEOUT_HEADER,
                format!(
                    "{TIMEOUT_HEADER}: give the deadline as a whole number of milliseconds above 0"
                ),
            )
        })
}

async fn answer(
    front: Front,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Response {
    let parsed = match parse(&front, body, endpoint) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    let timeout = match deadline(headers) {
        Ok(timeout) => timeout,
        Err(e) => return e.into_response(),
    };
    let head = Head {
        id: format!(
            "{}-{}-{}",
            endpoint.id_prefix(),
            tt_serving_proto::time::unix_ms(front.state.started()),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        ),
        created: tt_serving_proto::time::now_unix_ms() / 1000,
        model: parsed.request.model.clone(),
        endpoint,
    };
    if parsed.stream {
        return match front.state.router().generate(parsed.request, timeout).await {
            Ok(stream) => streamed(head, stream, parsed.include_usage).into_response(),
            Err(e) => ApiError::route(e, &head.model).into_response(),
        };
    }
    collected(head, &front, parsed, timeout).await
}

/// The body as the endpoint's request, or the error naming what is wrong.
fn parse(
    front: &Front,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Result<Parsed, ApiError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(front.state.config().limits.max_prompt_bytes)
        } else {
            ApiError::invalid("", format!("cannot read the request body: {rejection}"))
        }
    })?;
    let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(
            "",
            format!(
                "the body is not valid JSON ({e}); send a JSON object as the OpenAI API defines it"
            ),
        )
    })?;
    Ok(request::read(value, endpoint)?)
}

/// What every chunk and answer repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
}

impl Head {
    /// A chunk (streamed) or an answer (collected) with these choices.
    fn body(&self, streamed: bool, choices: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "object": self.endpoint.object(streamed),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// One streamed choice: new output (with its tokens' logprobs when
    /// asked for), and the finish reason at the end.
    fn choice(
        &self,
        delta: Option<&pb::TokenDelta>,
        logprobs: serde_json::Value,
        finish: Option<&str>,
    ) -> serde_json::Value {
        match self.endpoint {
            Endpoint::Completions => serde_json::json!([{
                "index": 0,
                "text": delta.map_or("", |d| d.text.as_str()),
                "logprobs": logprobs,
                "finish_reason": finish,
            }]),
            Endpoint::Chat => {
                let delta = delta.map_or_else(|| serde_json::json!({}), chat_delta);
                serde_json::json!([{
                    "index": 0,
                    "delta": delta,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }])
            }
        }
    }

    /// The logprobs of `tokens` in this endpoint's shape; null when none
    /// were asked for. `text_start` is where their text begins in the
    /// answer (completions give offsets).
    fn logprobs(&self, tokens: &[pb::TokenLogprob], text_start: usize) -> serde_json::Value {
        if tokens.is_empty() {
            return serde_json::Value::Null;
        }
        match self.endpoint {
            Endpoint::Completions => logprobs::completion(tokens, text_start),
            Endpoint::Chat => logprobs::chat(tokens),
        }
    }
}

/// A chat chunk's `delta` as OpenAI's SDKs read it: `content` when there
/// is text (or logprobs for it), `reasoning_content` when the engine's
/// reasoning parser split off thinking (the name DeepSeek's API and
/// llama-server use, and vLLM before it renamed it `reasoning`), and
/// `tool_calls` pieces: the first piece of a call with its `id`, `type`
/// and `function.name`, every piece with `index` and
/// `function.arguments`.
fn chat_delta(d: &pb::TokenDelta) -> serde_json::Value {
    let mut delta = serde_json::Map::new();
    if !d.text.is_empty() || (d.reasoning.is_empty() && d.tool_calls.is_empty()) {
        delta.insert("content".into(), serde_json::json!(d.text));
    }
    if !d.reasoning.is_empty() {
        delta.insert("reasoning_content".into(), serde_json::json!(d.reasoning));
    }
    if !d.tool_calls.is_empty() {
        delta.insert("tool_calls".into(), tool_calls::write(&d.tool_calls));
    }
    serde_json::Value::Object(delta)
}

/// One whole SSE event, `data: <json>` and its blank line.
fn event(value: &serde_json::Value) -> Bytes {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"data: ");
    push_json(&mut out, value);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Appends `value` as JSON. Serialising our own values into memory cannot
/// fail; were it ever to, the chunk carries `null` rather than a half
/// value.
fn push_json(out: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    let mark = out.len();
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.truncate(mark);
        out.extend_from_slice(b"null");
    }
}

/// Writes streamed chunks straight into bytes. What every chunk repeats
/// (`data: {"id":..,"object":..,"created":..,"model":..,"choices":`) is
/// rendered once per request; a plain text delta (no logprobs, reasoning
/// or tool calls: nearly every token) is written after it with only its
/// text escaped, so no JSON tree is built and dropped per token. Anything
/// else is rendered from its JSON value, as the collected answer is.
struct ChunkWriter {
    prefix: Vec<u8>,
}

impl ChunkWriter {
    fn new(head: &Head) -> ChunkWriter {
        let mut prefix = Vec::with_capacity(96 + head.id.len() + head.model.len());
        prefix.extend_from_slice(b"data: {\"id\":");
        push_json(&mut prefix, &head.id);
        prefix.extend_from_slice(b",\"object\":");
        push_json(&mut prefix, head.endpoint.object(true));
        prefix.extend_from_slice(b",\"created\":");
        prefix.extend_from_slice(head.created.to_string().as_bytes());
        prefix.extend_from_slice(b",\"model\":");
        push_json(&mut prefix, &head.model);
        prefix.extend_from_slice(b",\"choices\":");
        ChunkWriter { prefix }
    }

    /// One event: the prefix, `choices`, any further top-level fields
    /// (`,"usage":{..}`), and the end.
    fn push(&self, out: &mut Vec<u8>, choices: impl FnOnce(&mut Vec<u8>), rest: &[u8]) {
        out.extend_from_slice(&self.prefix);
        choices(out);
        out.extend_from_slice(rest);
        out.extend_from_slice(b"}\n\n");
    }

    /// A delta's event.
    fn delta(&self, head: &Head, out: &mut Vec<u8>, d: &pb::TokenDelta, text_start: usize) {
        let plain = d.logprobs.is_empty() && d.reasoning.is_empty() && d.tool_calls.is_empty();
        match (plain, head.endpoint) {
            (true, endpoint) => {
                let (open, close): (&[u8], &[u8]) = match endpoint {
                    Endpoint::Completions => (
                        br#"[{"index":0,"text":"#,
                        br#","logprobs":null,"finish_reason":null}]"#,
                    ),
                    Endpoint::Chat => (
                        br#"[{"index":0,"delta":{"content":"#,
                        br#"},"logprobs":null,"finish_reason":null}]"#,
                    ),
                };
                self.push(
                    out,
                    |o| {
                        o.extend_from_slice(open);
                        push_json(o, d.text.as_str());
                        o.extend_from_slice(close);
                    },
                    b"",
                );
            }
            (false, _) => {
                let logprobs = head.logprobs(&d.logprobs, text_start);
                let choice = head.choice(Some(d), logprobs, None);
                self.push(out, |o| push_json(o, &choice), b"");
            }
        }
    }
}

/// Server-Sent Events as OpenAI sends them, rendered as the connection
/// takes them from the router's stream: no task or channel of its own
/// between the router and the socket. When the client goes away the
/// connection drops the body, with it the router's stream, and the worker
/// cancels the sequence.
fn streamed(head: Head, stream: ChunkStream, include_usage: bool) -> Response {
    let sampling = sampling_header(stream.host_sampling());
    let writer = ChunkWriter::new(&head);
    // A chat stream opens with the assistant's role.
    let opening = (head.endpoint == Endpoint::Chat).then(|| {
        let mut out = Vec::new();
        writer.push(
            &mut out,
            |o| {
                o.extend_from_slice(
                    br#"[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]"#,
                )
            },
            b"",
        );
        Bytes::from(out)
    });
    let mut text_len = 0;
    let events = stream.filter_map(move |chunk| {
        let bytes = match chunk {
            Ok(chunk) => chunk_events(&head, &writer, chunk, include_usage, &mut text_len),
            // The status line is sent: the error goes in the stream, as
            // OpenAI's SDKs read it, and the stream ends without [DONE]
            // (the router's stream ends after an error).
            Err(e) => event(&ApiError::route(e, &head.model).event_json()),
        };
        // An empty piece would read as the body's end in chunked framing.
        (!bytes.is_empty()).then_some(Ok::<_, std::convert::Infallible>(bytes))
    });
    let body = axum::body::Body::from_stream(
        tokio_stream::iter(opening.map(Ok::<_, std::convert::Infallible>)).chain(events),
    );
    let mut response = (
        [
            (axum::http::header::CONTENT_TYPE, "text/event-stream"),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response();
    add_sampling_header(&mut response, sampling);
    response
}

/// The response header that marks a request its engine served on the host
/// sampling path, naming the parameters that put it there (Engine.Info
/// `host_sampling_parameters`): `host; parameters=logprobs,min_tokens`.
pub const SAMPLING_HEADER: &str = "x-tt-sampling";

fn sampling_header(parameters: &[&str]) -> Option<axum::http::HeaderValue> {
    if parameters.is_empty() {
        return None;
    }
    axum::http::HeaderValue::try_from(format!("host; parameters={}", parameters.join(","))).ok()
}

fn add_sampling_header(response: &mut Response, value: Option<axum::http::HeaderValue>) {
    if let Some(value) = value {
        response.headers_mut().insert(SAMPLING_HEADER, value);
    }
}

/// The events of one router chunk, in one piece of the body: a text delta,
/// or the finish (then the usage chunk when asked for, then `[DONE]`).
fn chunk_events(
    head: &Head,
    writer: &ChunkWriter,
    chunk: pb::GenerateResponse,
    include_usage: bool,
    text_len: &mut usize,
) -> Bytes {
    let mut out = Vec::new();
    match chunk.chunk {
        Some(pb::generate_response::Chunk::Delta(d))
            if !d.text.is_empty()
                || !d.logprobs.is_empty()
                || !d.reasoning.is_empty()
                || !d.tool_calls.is_empty() =>
        {
            out.reserve(writer.prefix.len() + d.text.len() + 64);
            writer.delta(head, &mut out, &d, *text_len);
            *text_len += d.text.len();
        }
        Some(pb::generate_response::Chunk::Final(f)) => {
            let finish = head.choice(
                None,
                serde_json::Value::Null,
                Some(finish::name(f.finish_reason)),
            );
            writer.push(&mut out, |o| push_json(o, &finish), b"");
            if include_usage {
                let mut usage = b",\"usage\":".to_vec();
                push_json(&mut usage, &Usage::of(&f));
                writer.push(&mut out, |o| o.extend_from_slice(b"[]"), &usage);
            }
            out.extend_from_slice(b"data: [DONE]\n\n");
        }
        _ => {}
    }
    Bytes::from(out)
}

/// One prompt's answer, read to its end.
struct Collected {
    text: String,
    reasoning: String,
    tool_calls: tool_calls::Joined,
    logprobs: Vec<pb::TokenLogprob>,
    /// The prompt's logprobs, when asked for (`echo`).
    prompt: Vec<pb::TokenLogprob>,
    last: pb::GenerationFinal,
    /// The parameters that put it on the host sampling path.
    host_sampling: Vec<&'static str>,
}

async fn collect(mut stream: ChunkStream, model: &str) -> Result<Collected, ApiError> {
    let mut c = Collected {
        host_sampling: stream.host_sampling().to_vec(),
        text: String::new(),
        reasoning: String::new(),
        tool_calls: tool_calls::Joined::default(),
        logprobs: Vec::new(),
        prompt: Vec::new(),
        last: pb::GenerationFinal::default(),
    };
    let mut finished = false;
    while let Some(chunk) = stream.next().await {
        match chunk.map_err(|e| ApiError::route(e, model))?.chunk {
            Some(pb::generate_response::Chunk::Delta(d)) => {
                c.text.push_str(&d.text);
                c.reasoning.push_str(&d.reasoning);
                c.tool_calls.add(&d.tool_calls);
                c.logprobs.extend(d.logprobs);
            }
            Some(pb::generate_response::Chunk::PromptLogprobs(p)) => c.prompt = p.tokens,
            Some(pb::generate_response::Chunk::Final(f)) => {
                c.last = f;
                finished = true;
            }
            None => {}
        }
    }
    if !finished {
        return Err(ApiError::route(
            RouteError::unavailable("the worker's stream ended without its final chunk", None),
            model,
        ));
    }
    Ok(c)
}

/// The whole answer as one JSON body: every prompt of a batch routed side
/// by side, each its own choice; with `echo`, the prompt first.
async fn collected(
    head: Head,
    front: &Front,
    parsed: Parsed,
    timeout: Option<Duration>,
) -> Response {
    let echo = parsed.echo;
    let requests: Vec<pb::GenerateRequest> =
        std::iter::once(parsed.request).chain(parsed.more).collect();
    let prompt_texts: Vec<Option<String>> = requests
        .iter()
        .map(|r| match &r.input {
            Some(pb::generate_request::Input::Prompt(text)) => Some(text.clone()),
            _ => None,
        })
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, request) in requests.into_iter().enumerate() {
        let state = front.state.clone();
        tasks.spawn(async move {
            let model = request.model.clone();
            let answer = match state.router().generate(request, timeout).await {
                Ok(stream) => collect(stream, &model).await,
                Err(e) => Err(ApiError::route(echo_refusal(e, echo), &model)),
            };
            (i, answer)
        });
    }
    let mut answers: Vec<Option<Collected>> = prompt_texts.iter().map(|_| None).collect();
    // The first failure answers the whole request (dropping the set ends
    // the other prompts' streams).
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((i, Ok(c))) => answers[i] = Some(c),
            Ok((_, Err(e))) => return e.into_response(),
            Err(e) => {
                tracing::warn!(error = %e, "OpenAI front door: a prompt's request ended abnormally");
                return ApiError::route(
                    RouteError::unavailable("a prompt's request ended abnormally", None),
                    &head.model,
                )
                .into_response();
            }
        }
    }
    let mut choices = Vec::with_capacity(answers.len());
    let mut total = pb::GenerationFinal::default();
    let mut host_sampling: Vec<&'static str> = Vec::new();
    for (index, (c, prompt_text)) in answers.into_iter().zip(prompt_texts).enumerate() {
        let Some(c) = c else {
            continue;
        };
        for p in &c.host_sampling {
            if !host_sampling.contains(p) {
                host_sampling.push(p);
            }
        }
        add_usage(&mut total, &c.last);
        choices.push(choice(&head, index, echo, prompt_text, c));
    }
    let mut body = head.body(false, serde_json::Value::Array(choices));
    body["usage"] = serde_json::json!(Usage::of(&total));
    let mut response = axum::Json(body).into_response();
    add_sampling_header(&mut response, sampling_header(&host_sampling));
    response
}

/// A refusal of `prompt_logprobs` said in the terms of the OpenAI request
/// that asked for it: `echo` with `logprobs` (or with a prompt of token
/// ids, whose text only the engine's prompt logprobs carry). vLLM-TT
/// refuses the prompt's logprobs ("Not yet supporting prompt_logprobs on
/// tt").
fn echo_refusal(e: RouteError, echo: Echo) -> RouteError {
    match e {
        RouteError::Invalid(m) if echo != Echo::Off && m.starts_with("prompt_logprobs:") => {
            RouteError::Invalid(format!(
                "echo: needs the prompt's logprobs (with \"logprobs\", or a prompt given as token ids), and {m} (answer without \"echo\", or without \"logprobs\" and with a text prompt)"
            ))
        }
        other => other,
    }
}

/// A batch's usage: the sum of its prompts'.
fn add_usage(total: &mut pb::GenerationFinal, last: &pb::GenerationFinal) {
    let u = last.usage.unwrap_or_default();
    let t = total.usage.get_or_insert_with(Default::default);
    t.prompt_tokens = t.prompt_tokens.saturating_add(u.prompt_tokens);
    t.completion_tokens = t.completion_tokens.saturating_add(u.completion_tokens);
    let cached = last.timings.map_or(0, |t| t.cached_prompt_tokens);
    let tt = total.timings.get_or_insert_with(Default::default);
    tt.cached_prompt_tokens = tt.cached_prompt_tokens.saturating_add(cached);
}

/// One choice of a collected answer.
fn choice(
    head: &Head,
    index: usize,
    echo: Echo,
    prompt_text: Option<String>,
    c: Collected,
) -> serde_json::Value {
    let finish = finish::name(c.last.finish_reason);
    match head.endpoint {
        Endpoint::Completions => {
            let (text, logprobs) = match echo {
                Echo::Off => (c.text, head.logprobs(&c.logprobs, 0)),
                Echo::Text | Echo::WithLogprobs => {
                    // A token-id prompt's text is its tokens' bytes.
                    let prompt = prompt_text.unwrap_or_else(|| {
                        let bytes: Vec<u8> =
                            c.prompt.iter().flat_map(|t| t.bytes.clone()).collect();
                        String::from_utf8_lossy(&bytes).into_owned()
                    });
                    let logprobs = if echo == Echo::WithLogprobs {
                        logprobs::echo(&c.prompt, &c.logprobs)
                    } else {
                        head.logprobs(&c.logprobs, prompt.len())
                    };
                    (prompt + &c.text, logprobs)
                }
            };
            serde_json::json!({
                "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
            })
        }
        Endpoint::Chat => {
            // OpenAI's message: `content` null when the turn is only tool
            // calls; `reasoning_content` and `tool_calls` only when there
            // are some.
            let calls = c.tool_calls.json();
            let mut message = serde_json::json!({
                "role": "assistant",
                "content": if c.text.is_empty() && calls.is_some() {
                    serde_json::Value::Null
                } else {
                    serde_json::json!(c.text)
                },
            });
            if !c.reasoning.is_empty() {
                message["reasoning_content"] = serde_json::json!(c.reasoning);
            }
            if let Some(calls) = calls {
                message["tool_calls"] = calls;
            }
            serde_json::json!({
                "index": index,
                "message": message,
                "logprobs": head.logprobs(&c.logprobs, 0),
                "finish_reason": finish,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_deltas_carry_reasoning_and_tool_calls_as_openai_sdks_read_them() {
        let text = pb::TokenDelta {
            text: "hi".into(),
            ..Default::default()
        };
        assert_eq!(chat_delta(&text), serde_json::json!({"content": "hi"}));
        let thinking = pb::TokenDelta {
            reasoning: "hmm".into(),
            ..Default::default()
        };
        assert_eq!(
            chat_delta(&thinking),
            serde_json::json!({"reasoning_content": "hmm"})
        );
        // Only tool calls: no `content` (their pieces' shape is
        // tt_openai_wire::tool_calls').
        let calls = pb::TokenDelta {
            tool_calls: vec![pb::ToolCallDelta {
                index: 0,
                id: "call-1".into(),
                name: "weather".into(),
                arguments: String::new(),
            }],
            ..Default::default()
        };
        assert_eq!(
            chat_delta(&calls),
            serde_json::json!({"tool_calls": tool_calls::write(&calls.tool_calls)})
        );
    }
}
