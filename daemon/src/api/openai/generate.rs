//! `POST /v1/completions` and `POST /v1/chat/completions`: parse the body,
//! route it, and answer as OpenAI does, streamed (Server-Sent Events:
//! `data: {chunk}` lines, an optional usage chunk, `data: [DONE]`) or
//! collected into one JSON body.

use super::connections::Connection;
use super::errors::ApiError;
use super::Front;
use crate::router::{Buffered, ChunkStream, Client, Outcome, RouteError};
use crate::usage::KeyName;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_stream::StreamExt;
use tt_openai_wire::chunk::{self, Head, Writer};
use tt_openai_wire::request::{self, Echo, Parsed};
use tt_openai_wire::{finish, logprobs, tool_calls, Endpoint, Usage};
use tt_serving_proto::v1 as pb;
use tt_serving_telemetry::{attr, Kind, Span};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// `POST /v1/completions`.
pub async fn completions(
    State(front): State<Front>,
    key: Option<Extension<KeyName>>,
    connection: Option<Extension<Connection>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let connection = connection.map(|Extension(c)| c);
    answer(
        front,
        key_name(key),
        connection,
        &headers,
        body,
        Endpoint::Completions,
    )
    .await
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(front): State<Front>,
    key: Option<Extension<KeyName>>,
    connection: Option<Extension<Connection>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let connection = connection.map(|Extension(c)| c);
    answer(
        front,
        key_name(key),
        connection,
        &headers,
        body,
        Endpoint::Chat,
    )
    .await
}

/// The key the token check named (anonymous without one).
fn key_name(key: Option<Extension<KeyName>>) -> KeyName {
    key.map(|Extension(k)| k).unwrap_or_default()
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
    key: KeyName,
    connection: Option<Connection>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Response {
    // The request's span, a child of the client's trace when it sent one.
    let trace = Span::from_http(endpoint.span_name(), Kind::Server, headers);
    trace.set(attr::DOOR, "openai");
    // Refused here, before routing: counted under the key as the router
    // counts its refusals (`invalid`), with the body's model when it names
    // a configured one.
    let refused = |e: ApiError, model: &str| {
        let model = crate::usage::model_label(&front.state.config(), model).to_string();
        crate::usage::request(&key, &model, Outcome::Invalid.label());
        trace.set(attr::KEY, key.to_string());
        trace.set(attr::OUTCOME, Outcome::Invalid.label());
        trace.fail(|| e.message().to_string());
        e.into_response()
    };
    let value = match json_body(&front, body) {
        Ok(value) => value,
        Err(e) => return refused(e, ""),
    };
    let model = value
        .get("model")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_string();
    let parsed = match request::read(value, endpoint) {
        Ok(parsed) => parsed,
        Err(e) => return refused(e.into(), &model),
    };
    let timeout = match deadline(headers) {
        Ok(timeout) => timeout,
        Err(e) => return refused(e, &parsed.request.model),
    };
    trace.set("tt.stream", parsed.stream);
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
        return match front
            .state
            .router()
            .generate(parsed.request, timeout, key, trace)
            .await
        {
            Ok(stream) => {
                let config = front.state.config();
                let client = Client {
                    door: "openai",
                    timeout_key: "openai.write_timeout_secs",
                    write_timeout: Duration::from_secs(config.openai.write_timeout_secs),
                    peer: connection.as_ref().map(|c| c.peer),
                    cut_by_door: connection.map(|c| c.cut.clone()),
                };
                let capacity = config.limits.stream_buffer_chunks as usize;
                streamed(
                    head,
                    crate::router::buffer(stream, capacity, client),
                    parsed.include_usage,
                )
                .into_response()
            }
            Err(e) => ApiError::route(e, &head.model).into_response(),
        };
    }
    collected(head, &front, parsed, timeout, key, trace).await
}

/// The body as JSON (the endpoint's request is read from it), or the error
/// naming what is wrong.
fn json_body(
    front: &Front,
    body: Result<Bytes, BytesRejection>,
) -> Result<serde_json::Value, ApiError> {
    let body = body.map_err(|rejection| {
        if super::connections::is_body_timeout(&rejection) {
            ApiError::body_timed_out(front.state.config().openai.body_read_timeout_secs)
        } else if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(front.state.config().limits.max_prompt_bytes)
        } else {
            ApiError::invalid("", format!("cannot read the request body: {rejection}"))
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(
            "",
            format!(
                "the body is not valid JSON ({e}); send a JSON object as the OpenAI API defines it"
            ),
        )
    })
}

/// Server-Sent Events as OpenAI sends them, rendered as the connection
/// takes them from the request's buffer (`router::buffer`: the engine's
/// pace never waits on this socket), every chunk that is ready in one
/// piece of the body. When the client goes away the connection drops the
/// body, the buffer's pump sees it at once, and the worker cancels the
/// sequence.
fn streamed(head: Head, stream: Buffered, include_usage: bool) -> Response {
    let sampling = sampling_header(stream.host_sampling());
    let writer = Writer::new(head);
    // A chat stream opens with the assistant's role.
    let opening = (writer.head().endpoint == Endpoint::Chat).then(|| {
        let mut out = Vec::new();
        writer.role(&mut out);
        Bytes::from(out)
    });
    let body = axum::body::Body::from_stream(Events {
        stream,
        writer,
        include_usage,
        text_len: 0,
        opening,
        ready: Vec::new(),
    });
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

/// Most chunks rendered into one piece of the body: a client far behind
/// gets a few writes of some KiB, not one of megabytes.
const CHUNKS_PER_WRITE: usize = 64;

/// The SSE body of a streamed answer.
struct Events {
    stream: Buffered,
    writer: Writer,
    include_usage: bool,
    /// Text sent so far (logprobs' offsets count from it).
    text_len: usize,
    /// The chat role's event, sent first.
    opening: Option<Bytes>,
    /// The chunks taken from the buffer by this poll (kept to reuse).
    ready: Vec<crate::router::Item>,
}

impl tokio_stream::Stream for Events {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        if let Some(opening) = this.opening.take() {
            return Poll::Ready(Some(Ok(opening)));
        }
        loop {
            this.ready.clear();
            match this
                .stream
                .poll_ready_chunks(cx, &mut this.ready, CHUNKS_PER_WRITE)
            {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(0) => return Poll::Ready(None),
                Poll::Ready(_) => {}
            }
            let mut out = Vec::new();
            for chunk in this.ready.drain(..) {
                match chunk {
                    Ok(chunk) => chunk_events(
                        &this.writer,
                        chunk,
                        this.include_usage,
                        &mut this.text_len,
                        &mut out,
                    ),
                    // The status line is sent: the error goes in the
                    // stream, as OpenAI's SDKs read it, and the stream ends
                    // without [DONE] (the router's stream ends after an
                    // error).
                    Err(e) => out.extend_from_slice(&chunk::event(
                        &ApiError::route(e, &this.writer.head().model).event_json(),
                    )),
                }
            }
            // An empty piece would read as the body's end in chunked
            // framing.
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Bytes::from(out))));
            }
        }
    }
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

/// The events of one router chunk, appended to `out`: a text delta, or
/// the finish (then the usage chunk when asked for, then `[DONE]`).
fn chunk_events(
    writer: &Writer,
    chunk: pb::GenerateResponse,
    include_usage: bool,
    text_len: &mut usize,
    out: &mut Vec<u8>,
) {
    match chunk.chunk {
        Some(pb::generate_response::Chunk::Delta(d))
            if !d.text.is_empty()
                || !d.logprobs.is_empty()
                || !d.reasoning.is_empty()
                || !d.tool_calls.is_empty() =>
        {
            writer.delta(out, &d, *text_len);
            *text_len += d.text.len();
        }
        Some(pb::generate_response::Chunk::Final(f)) => {
            writer.finish(out, f.finish_reason);
            if include_usage {
                writer.usage(out, &Usage::of(&f));
            }
            Writer::done(out);
        }
        _ => {}
    }
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
    key: KeyName,
    trace: Span,
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
        let key = key.clone();
        let trace = trace.clone();
        tasks.spawn(async move {
            let model = request.model.clone();
            let answer = match state.router().generate(request, timeout, key, trace).await {
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
    let mut response = axum::Json(head.answer(choices, &Usage::of(&total))).into_response();
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
            chunk::text_choice(index, text, logprobs, finish)
        }
        Endpoint::Chat => chunk::message_choice(
            index,
            c.text,
            &c.reasoning,
            c.tool_calls.json(),
            head.logprobs(&c.logprobs, 0),
            finish,
        ),
    }
}
