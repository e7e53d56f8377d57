//! The `Engine` gRPC service (engine.proto) on the worker's unix socket,
//! answered from the engine's OpenAI HTTP API.
//!
//! `Generate` sends one streamed HTTP request per call and relays its
//! chunks; the call and the HTTP connection live and die together, so a
//! daemon that drops the call closes the connection, and the engine aborts
//! the request (vLLM and llama-server both abort on disconnect).

use crate::cli::EngineKind;
use crate::http::{self, SseSplitter};
use crate::openai::{self, Endpoint, Event, RequestStyle};
use crate::status::{InFlight, Phase, Status};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tt_openai_wire::Usage;
use tt_serving_proto::v1 as pb;
use tt_worker_contract::service::LOADING;
use tt_worker_contract::{Backend, DrainReport, GenerateError, TokenStream};

/// Facts known before the engine is ready, reported by `Info`.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The engine kind.
    pub kind: EngineKind,
    /// The engine's port on loopback.
    pub port: u16,
    /// The token-ids field and default `max_tokens`.
    pub token_ids_field: Option<String>,
    /// `max_tokens` for requests leaving it 0.
    pub default_max_tokens: Option<u32>,
    /// The optional parameters the engine honours as started
    /// (`openai::supported_parameters`), listed in Info and checked again
    /// on each request.
    pub supported_parameters: Vec<&'static str>,
    /// Those of them that move a batch to host sampling (Info
    /// `host_sampling_parameters`; `tt::Preset::host_sampling_parameters`).
    pub host_sampling_parameters: Vec<&'static str>,
}

/// The backend: the engine's HTTP API behind the worker contract.
pub struct OpenAiBackend {
    identity: Identity,
    status: Arc<Status>,
}

impl OpenAiBackend {
    /// A backend over `status`.
    pub fn new(identity: Identity, status: Arc<Status>) -> Self {
        Self { identity, status }
    }

    fn progress(&self) -> pb::LoadProgress {
        let output = &self.status.output;
        let lines = output.lines();
        let message = match (self.status.phase(), lines) {
            (Phase::Loading, 0) => format!("starting {}", self.identity.kind.name()),
            (Phase::Loading, n) => format!(
                "{} loading ({n} log lines): {}",
                self.identity.kind.name(),
                output.last_line()
            ),
            _ => String::new(),
        };
        pb::LoadProgress {
            done: lines,
            // The engine does not say how many lines a load takes.
            total: 0,
            message,
        }
    }
}

/// An engine's refusal (a non-200 answer) in the contract's terms.
fn refusal(code: hyper::StatusCode, message: &str) -> GenerateError {
    let message = format!("the engine refused the request ({code}): {message}");
    match code.as_u16() {
        400 | 413 | 422 => GenerateError::Invalid(message),
        429 => GenerateError::Busy(message),
        503 => GenerateError::Unavailable(message),
        _ => GenerateError::Failed(message),
    }
}

impl Backend for OpenAiBackend {
    const SERVICE_NAME: &'static str = "tt-worker-openai";

    fn phase(&self) -> Phase {
        self.status.phase()
    }

    fn progress(&self) -> pb::LoadProgress {
        OpenAiBackend::progress(self)
    }

    fn info(&self) -> pb::InfoResponse {
        let loaded = self.status.loaded().cloned().unwrap_or_default();
        let engine = match &loaded.engine_version {
            Some(v) => format!("{} {v}", self.identity.kind.name()),
            None => self.identity.kind.name().to_string(),
        };
        let version = format!("tt-worker-openai {} ({engine})", env!("CARGO_PKG_VERSION"));
        pb::InfoResponse {
            model_name: loaded.model.clone(),
            architecture: String::new(),
            parameter_count: loaded.parameters,
            context_length: loaded.context_length,
            // The engine writes its tensor cache itself; the daemon's
            // cache guard reads the variant dir.
            cache_files_read: Vec::new(),
            cache_files_written: Vec::new(),
            load_time_ms: loaded.load_time.as_millis() as u64,
            banners_engaged: self.status.output.banners(),
            engine_version: version,
            supported_parameters: openai::honoured_parameters(
                self.identity.kind,
                &self.identity.supported_parameters,
                self.status.loaded(),
            )
            .iter()
            .map(|p| p.to_string())
            .collect(),
            kv_cache: loaded.kv_cache,
            runtime_cache_files: self
                .identity
                .kind
                .runtime_cache_files()
                .iter()
                .map(|p| p.to_string())
                .collect(),
            host_sampling_parameters: self
                .identity
                .host_sampling_parameters
                .iter()
                .map(|p| p.to_string())
                .collect(),
            ..Default::default()
        }
    }

    fn health(&self) -> pb::HealthResponse {
        let (running, waiting) = self.status.load(self.identity.port, self.identity.kind);
        pb::HealthResponse {
            active_sequences: running,
            queued_sequences: waiting,
            last_progress_unix_ms: self
                .status
                .last_token_unix_ms
                .load(std::sync::atomic::Ordering::Acquire),
            prefill_tokens: self.status.prefill_tokens(),
            // vLLM's share of blocks in use, from its metrics; it does not
            // export the blocks only its prefix cache holds.
            kv_blocks_in_use: self.status.kv_blocks_in_use(),
            kv_blocks_cached: 0,
            engine_counters: self.status.engine_counters(),
            ..Default::default()
        }
    }

    async fn generate(
        &self,
        generate: pb::GenerateRequest,
        request_id: String,
        arrived: Instant,
        trace: tt_serving_telemetry::Span,
    ) -> Result<TokenStream, GenerateError> {
        let loaded = self
            .status
            .loaded()
            .ok_or_else(|| GenerateError::Unavailable(LOADING.into()))?;
        let style = RequestStyle {
            model: loaded.model.clone(),
            token_ids_field: self.identity.token_ids_field.clone(),
            default_max_tokens: self.identity.default_max_tokens,
            supported_parameters: openai::honoured_parameters(
                self.identity.kind,
                &self.identity.supported_parameters,
                Some(loaded),
            ),
            string_tool_choice_only: self.identity.kind == EngineKind::LlamaServer,
        };
        let plan = openai::plan(&generate, &style).map_err(GenerateError::Invalid)?;
        let body = serde_json::to_vec(&plan.body)
            .map_err(|e| GenerateError::Failed(format!("cannot encode the engine request: {e}")))?;
        let in_flight = self.status.begin_request();
        let prefill = self.status.begin_prefill(prompt_token_bound(&generate));
        let mut cancel = self.status.cancelled();
        let path = plan.endpoint.path();
        // The engine continues the trace: vLLM makes its request span a
        // child of this worker's (when it runs with
        // --otlp-traces-endpoint); one that does not read the header
        // ignores it.
        let trace_headers: Vec<(&'static str, String)> = match trace.trace_context() {
            Some((traceparent, tracestate)) => {
                std::iter::once((tt_serving_telemetry::TRACEPARENT, traceparent))
                    .chain(tracestate.map(|s| (tt_serving_telemetry::TRACESTATE, s)))
                    .collect()
            }
            None => Vec::new(),
        };
        // The answer's head comes once the engine accepted the request (a
        // llama-server sends it with the first token, so this can last a
        // whole prefill); a dropped call drops this future and the
        // connection with it.
        let response = tokio::select! {
            r = http::send_with(self.identity.port, hyper::Method::POST, path, Some(body), &trace_headers) => r
                .map_err(|e| GenerateError::Unavailable(format!("{e}; the engine may have died")))?,
            _ = cancel.wait_for(|c| *c) => {
                return Err(GenerateError::Unavailable(tt_worker_contract::service::DRAINING.into()));
            }
        };
        if !response.status.is_success() {
            let code = response.status;
            let text = tokio::time::timeout(Duration::from_secs(10), response.text(path))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            return Err(refusal(code, &openai::error_message(&text)));
        }
        Ok(Box::pin(Relay::new(
            plan.endpoint,
            plan.logprobs,
            self.status.clone(),
            response,
            (arrived, request_id),
            prefill,
            in_flight,
        )))
    }

    fn drain(&self, timeout: Duration) -> impl Future<Output = DrainReport> + Send {
        let status = self.status.clone();
        async move { status.drain(timeout).await }
    }
}

/// One request's stream: engine SSE in, `GenerateResponse`s out.
///
/// A `Stream` polled by the gRPC call's response body, with no task or
/// channel of its own: the engine's socket wakes the task that encodes the
/// answer, and the engine is read only as fast as the daemon takes the
/// chunks (HTTP/2 flow control is the back-pressure). Events that arrive
/// in one read leave as one delta. Dropping it (the daemon dropped the
/// call) closes the engine's connection, which aborts the request.
struct Relay {
    endpoint: Endpoint,
    /// The log-probabilities asked for.
    logprobs: openai::Logprobs,
    status: Arc<Status>,
    /// The engine's answer; `None` once the relay has ended.
    response: Option<http::Response>,
    /// Ready when the worker cancels what is in flight (a drain's
    /// timeout); `None` once it fired.
    cancel: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    sse: SseSplitter,
    progress: Progress,
    /// Chunks made and not yet taken.
    ready: VecDeque<Result<pb::GenerateResponse, GenerateError>>,
    arrived: Instant,
    request_id: String,
    prefill: crate::status::Prefill,
    /// Counts the request as in flight until the relay ends.
    in_flight: Option<InFlight>,
}

/// An upper bound of a request's prompt tokens without the engine's
/// tokenizer: one per byte (byte-level tokenizers never make more), plus
/// room for the chat template's tokens around each message. The daemon's
/// watchdog grows its stall bound with it, so erring high errs towards
/// patience with a long prefill.
fn prompt_token_bound(request: &pb::GenerateRequest) -> u64 {
    match &request.input {
        Some(pb::generate_request::Input::Prompt(p)) => p.len() as u64 + 8,
        Some(pb::generate_request::Input::PromptTokens(t)) => t.ids.len() as u64,
        Some(pb::generate_request::Input::Chat(c)) => {
            c.messages
                .iter()
                .map(|m| m.content.len() as u64 + m.role.len() as u64 + 16)
                .sum::<u64>()
                + 16
        }
        None => 0,
    }
}

/// Where the relay is.
#[derive(Default)]
struct Progress {
    first_token: Option<Instant>,
    finish: Option<String>,
    usage: Option<Usage>,
    ids: u32,
    deltas: u32,
    done: bool,
    /// The prompt's logprobs went out.
    prompt_logprobs_sent: bool,
}

impl tokio_stream::Stream for Relay {
    type Item = Result<pb::GenerateResponse, GenerateError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let relay = &mut *self;
        loop {
            if let Some(chunk) = relay.ready.pop_front() {
                return Poll::Ready(Some(chunk));
            }
            let Some(response) = relay.response.as_mut() else {
                return Poll::Ready(None);
            };
            if let Some(cancel) = relay.cancel.as_mut() {
                if cancel.as_mut().poll(cx).is_ready() {
                    relay.cancel = None;
                    relay.progress.finish = Some("cancelled".into());
                    relay.end(Ok(()));
                    continue;
                }
            }
            let piece = match response.poll_chunk(cx) {
                Poll::Ready(piece) => piece,
                Poll::Pending => return Poll::Pending,
            };
            relay.take(piece);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.response.is_some() {
            tracing::debug!(request = %self.request_id, "the daemon dropped the stream; closed the engine's connection");
        }
    }
}

impl Relay {
    /// The relay of `response`, an engine's streamed answer to `endpoint`;
    /// `request` is when the call arrived and its id.
    fn new(
        endpoint: Endpoint,
        logprobs: openai::Logprobs,
        status: Arc<Status>,
        response: http::Response,
        request: (Instant, String),
        prefill: crate::status::Prefill,
        in_flight: InFlight,
    ) -> Self {
        let mut cancel = status.cancelled();
        let cancel = Box::pin(async move {
            // A dropped sender (the worker stopping) cancels too.
            let _ = cancel.wait_for(|c| *c).await;
        });
        Self {
            endpoint,
            logprobs,
            status,
            response: Some(response),
            cancel: Some(cancel),
            sse: SseSplitter::default(),
            progress: Progress::default(),
            ready: VecDeque::new(),
            arrived: request.0,
            request_id: request.1,
            prefill,
            in_flight: Some(in_flight),
        }
    }

    /// Takes one piece of the engine's body (`None`: its end) and queues
    /// what it makes; ends the relay when the stream is over or broken.
    fn take(&mut self, piece: Option<Result<hyper::body::Bytes, hyper::Error>>) {
        let ended = piece.is_none();
        let events = match piece {
            Some(Ok(bytes)) => self.sse.feed(&bytes).map_err(GenerateError::Failed),
            Some(Err(e)) => Err(GenerateError::Unavailable(format!(
                "the engine's stream broke: {e}; the engine may have died"
            ))),
            None => Ok(self.sse.finish().into_iter().collect()),
        };
        match events.and_then(|events| self.handle(events)) {
            Err(failed) => self.end(Err(failed)),
            Ok(()) if self.progress.done || ended => self.end(Ok(())),
            Ok(()) => {}
        }
    }

    /// Ends the relay: closes the engine's connection at once (not when
    /// the daemon has read the last chunk, so a cancelled request stops in
    /// the engine now) and queues the final chunk or the failure.
    fn end(&mut self, outcome: Result<(), GenerateError>) {
        self.response = None;
        match outcome {
            Ok(()) => {
                let last = self.finish();
                self.ready.push_back(last);
            }
            Err(failed) => {
                tracing::warn!(request = %self.request_id, error = %failed, "generation failed");
                self.ready.push_back(Err(failed));
            }
        }
        self.in_flight = None;
    }

    /// Queues a chunk; a delta right after a delta joins it, so the events
    /// of one read leave as one message. Only deltas that both carry token
    /// ids join: the daemon counts a delta without ids as one token
    /// (llama-server's have none), so joining those would lose tokens.
    fn queue(&mut self, delta: pb::TokenDelta) {
        if let Some(Ok(pb::GenerateResponse {
            chunk: Some(pb::generate_response::Chunk::Delta(last)),
        })) = self.ready.back_mut()
        {
            if !last.token_ids.is_empty() && !delta.token_ids.is_empty() {
                last.text.push_str(&delta.text);
                last.token_ids.extend(delta.token_ids);
                last.logprobs.extend(delta.logprobs);
                last.reasoning.push_str(&delta.reasoning);
                last.tool_calls.extend(delta.tool_calls);
                return;
            }
        }
        self.ready.push_back(Ok(pb::GenerateResponse {
            chunk: Some(pb::generate_response::Chunk::Delta(delta)),
        }));
    }

    fn handle(&mut self, events: Vec<String>) -> Result<(), GenerateError> {
        for data in events {
            match openai::parse_event(&data, self.endpoint) {
                Ok(Event::Done) => self.progress.done = true,
                Ok(Event::Chunk(mut chunk)) => {
                    self.cut_logprobs(&mut chunk)?;
                    if !chunk.text.is_empty()
                        || !chunk.token_ids.is_empty()
                        || !chunk.reasoning.is_empty()
                        || !chunk.tool_calls.is_empty()
                    {
                        self.progress.first_token.get_or_insert_with(Instant::now);
                        self.prefill.release();
                        self.progress.ids += chunk.token_ids.len() as u32;
                        self.progress.deltas += 1;
                        self.status.token_arrived();
                        self.queue(pb::TokenDelta {
                            text: chunk.text,
                            token_ids: chunk.token_ids,
                            logprobs: chunk.logprobs,
                            reasoning: chunk.reasoning,
                            tool_calls: chunk.tool_calls,
                        });
                    }
                    if let Some(reason) = chunk.finish_reason {
                        self.progress.finish = Some(reason);
                    }
                    if let Some(usage) = chunk.usage {
                        self.progress.usage = Some(usage);
                    }
                }
                Ok(Event::Error { message, code }) => {
                    let message = format!("the engine failed the request: {message}");
                    return Err(match code {
                        Some(400) => GenerateError::Invalid(message),
                        _ => GenerateError::Failed(message),
                    });
                }
                Err(e) => return Err(GenerateError::Failed(e)),
            }
        }
        Ok(())
    }

    /// The chunk's logprobs as asked: ids given, the prompt's sent once
    /// as their own chunk (an echo's first chunk), alternatives cut to the
    /// number asked, none where none were asked, and nothing generated for
    /// a prompt-only request (vLLM runs a step for it).
    fn cut_logprobs(&mut self, chunk: &mut openai::Chunk) -> Result<(), GenerateError> {
        let failed = GenerateError::Failed;
        let asked = self.logprobs;
        let echoed = asked.prompt.is_some() && !self.progress.prompt_logprobs_sent;
        if !chunk.logprobs.is_empty() {
            let ids: Vec<u32> = if echoed {
                chunk
                    .prompt_token_ids
                    .iter()
                    .chain(&chunk.token_ids)
                    .copied()
                    .collect()
            } else {
                chunk.token_ids.clone()
            };
            openai::assign_ids(&mut chunk.logprobs, &ids).map_err(failed)?;
        }
        if let (Some(k), true) = (asked.prompt, echoed && !chunk.prompt_token_ids.is_empty()) {
            let n = chunk.prompt_token_ids.len();
            if chunk.logprobs.len() < n {
                return Err(failed(format!(
                    "the engine echoed logprobs of {} tokens for a prompt of {n}",
                    chunk.logprobs.len()
                )));
            }
            let generated = chunk.logprobs.split_off(n);
            let mut prompt = std::mem::replace(&mut chunk.logprobs, generated);
            for (i, t) in prompt.iter_mut().enumerate() {
                if i == 0 {
                    // Nothing precedes it: no distribution (the protocol's rule).
                    t.logprob = 0.0;
                    t.top_logprobs.clear();
                }
                t.top_logprobs.truncate(k as usize);
            }
            let message = pb::GenerateResponse {
                chunk: Some(pb::generate_response::Chunk::PromptLogprobs(
                    pb::PromptLogprobs { tokens: prompt },
                )),
            };
            self.ready.push_back(Ok(message));
            self.progress.prompt_logprobs_sent = true;
        }
        if asked.prompt_only {
            chunk.text.clear();
            chunk.token_ids.clear();
            chunk.logprobs.clear();
        }
        match asked.generated {
            Some(n) => chunk
                .logprobs
                .iter_mut()
                .for_each(|l| l.top_logprobs.truncate(n as usize)),
            None => chunk.logprobs.clear(),
        }
        Ok(())
    }

    /// The final chunk, or why there is none.
    fn finish(&mut self) -> Result<pb::GenerateResponse, GenerateError> {
        let progress = std::mem::take(&mut self.progress);
        if self.logprobs.prompt.is_some() && !progress.prompt_logprobs_sent {
            return Err(GenerateError::Failed(
                "the engine ended the stream without the prompt's logprobs (its echo)".into(),
            ));
        }
        let Some(reason) = progress.finish else {
            return Err(GenerateError::Unavailable(
                "the engine ended the stream without a finish reason; it may have died".into(),
            ));
        };
        let now = Instant::now();
        let first = progress.first_token.unwrap_or(now);
        let ttft = first.duration_since(self.arrived);
        // Engines that give no usage (or no ids) are counted by what came.
        let usage = progress.usage.unwrap_or(Usage::new(
            0,
            if progress.ids > 0 {
                progress.ids
            } else {
                progress.deltas
            },
            0,
        ));
        // vLLM counts the step it ran for a prompt-only request; nothing of
        // it was sent.
        let completion_tokens = if self.logprobs.prompt_only {
            0
        } else {
            usage.completion_tokens
        };
        let last = pb::GenerateResponse {
            chunk: Some(pb::generate_response::Chunk::Final(pb::GenerationFinal {
                finish_reason: tt_openai_wire::finish::read(&reason) as i32,
                usage: Some(pb::Usage {
                    prompt_tokens: usage.prompt_tokens,
                    completion_tokens,
                }),
                timings: Some(pb::Timings {
                    queue_us: 0,
                    prefill_us: ttft.as_micros() as u64,
                    decode_us: now.duration_since(first).as_micros() as u64,
                    time_to_first_token_us: ttft.as_micros() as u64,
                    cached_prompt_tokens: usage.prompt_tokens_details.cached_tokens,
                }),
                slot: String::new(),
            })),
        };
        Ok(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    /// A vLLM completions event; llama-server's carry no `token_ids`.
    fn event(text: &str, ids: &[u32], finish: Option<&str>) -> String {
        let finish = finish.map_or("null".to_string(), |f| format!("\"{f}\""));
        let ids = if ids.is_empty() {
            String::new()
        } else {
            let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
            format!(",\"token_ids\":[{}]", ids.join(","))
        };
        format!(
            "data: {{\"id\":\"c\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\
             \"choices\":[{{\"index\":0,\"text\":\"{text}\",\"logprobs\":null,\
             \"finish_reason\":{finish}{ids}}}]}}\n\n"
        )
    }

    /// An engine on loopback that answers one request with `sse` as one
    /// HTTP chunk in one write, then waits for the client to close; says
    /// when it closed.
    async fn engine(sse: String) -> (u16, tokio::sync::oneshot::Receiver<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (closed_tx, closed) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 64 << 10];
            let _ = socket.read(&mut buf).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                 transfer-encoding: chunked\r\n\r\n{:x}\r\n{sse}\r\n",
                sse.len()
            );
            socket.write_all(answer.as_bytes()).await.unwrap();
            while socket.read(&mut buf).await.is_ok_and(|n| n > 0) {}
            let _ = closed_tx.send(());
        });
        (port, closed)
    }

    async fn relay(port: u16, status: &Arc<Status>) -> Relay {
        let response = http::send(
            port,
            hyper::Method::POST,
            "/v1/completions",
            Some(b"{}".to_vec()),
        )
        .await
        .unwrap();
        Relay::new(
            Endpoint::Completions,
            openai::Logprobs::default(),
            status.clone(),
            response,
            (Instant::now(), "r1".into()),
            status.begin_prefill(8),
            status.begin_request(),
        )
    }

    #[tokio::test]
    async fn events_that_arrive_together_leave_as_one_delta_then_the_final() {
        let sse = [
            event(" a", &[1], None),
            event(" b", &[2], None),
            event(" c", &[3], None),
            event("", &[4], Some("length")),
            "data: [DONE]\n\n".to_string(),
        ]
        .concat();
        let (port, _closed) = engine(sse).await;
        let status = Arc::new(Status::new(Default::default()));
        let chunks: Vec<_> = relay(port, &status).await.collect().await;
        assert_eq!(chunks.len(), 2, "{chunks:?}");
        let Ok(pb::GenerateResponse {
            chunk: Some(pb::generate_response::Chunk::Delta(delta)),
        }) = &chunks[0]
        else {
            panic!("a delta first: {chunks:?}");
        };
        assert_eq!(delta.text, " a b c");
        assert_eq!(delta.token_ids, [1, 2, 3, 4]);
        let Ok(pb::GenerateResponse {
            chunk: Some(pb::generate_response::Chunk::Final(last)),
        }) = &chunks[1]
        else {
            panic!("the final second: {chunks:?}");
        };
        assert_eq!(last.finish_reason, pb::FinishReason::Length as i32);
        assert_eq!(last.usage.map(|u| u.completion_tokens), Some(4));
        assert_eq!(status.in_flight(), 0, "the request ended with its stream");
    }

    #[tokio::test]
    async fn deltas_without_token_ids_stay_one_per_event() {
        // The daemon counts a delta without ids as one token.
        let sse = [
            event(" a", &[], None),
            event(" b", &[], None),
            event("", &[], Some("stop")),
            "data: [DONE]\n\n".to_string(),
        ]
        .concat();
        let (port, _closed) = engine(sse).await;
        let status = Arc::new(Status::new(Default::default()));
        let chunks: Vec<_> = relay(port, &status).await.collect().await;
        let texts: Vec<&str> = chunks
            .iter()
            .filter_map(|c| match c {
                Ok(pb::GenerateResponse {
                    chunk: Some(pb::generate_response::Chunk::Delta(d)),
                }) => Some(d.text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(texts, [" a", " b"], "{chunks:?}");
        assert_eq!(chunks.len(), 3, "two deltas and the final: {chunks:?}");
    }

    #[tokio::test]
    async fn dropping_the_stream_closes_the_engines_connection() {
        let (port, closed) = engine(event(" a", &[1], None)).await;
        let status = Arc::new(Status::new(Default::default()));
        let mut stream = relay(port, &status).await;
        let first = stream.next().await;
        assert!(
            matches!(
                first,
                Some(Ok(pb::GenerateResponse {
                    chunk: Some(pb::generate_response::Chunk::Delta(_))
                }))
            ),
            "{first:?}"
        );
        assert_eq!(status.in_flight(), 1);
        drop(stream);
        tokio::time::timeout(Duration::from_secs(5), closed)
            .await
            .expect("the engine saw its connection close")
            .unwrap();
        assert_eq!(status.in_flight(), 0);
    }
}
