//! The `Engine` gRPC service (engine.proto) on the worker's unix socket,
//! answered from the engine's OpenAI HTTP API.
//!
//! `Generate` sends one streamed HTTP request per call and relays its
//! chunks; the call and the HTTP connection live and die together, so a
//! daemon that drops the call closes the connection, and the engine aborts
//! the request (vLLM and llama-server both abort on disconnect).

use crate::cli::EngineKind;
use crate::http::{self, SseSplitter};
use crate::openai::{self, Endpoint, Event, RequestStyle, Usage};
use crate::status::{InFlight, Phase, Status};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
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

/// An engine's `finish_reason` in our words. vLLM says `abort` for a
/// request it aborted, and both engines `tool_calls` for a turn ended by
/// calling tools; anything else that ended the text (a content filter)
/// ended it like a stop.
fn finish_reason(reason: &str) -> pb::FinishReason {
    match reason {
        "length" => pb::FinishReason::Length,
        "abort" | "cancelled" => pb::FinishReason::Cancelled,
        "tool_calls" => pb::FinishReason::ToolCalls,
        _ => pb::FinishReason::Stop,
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
            ..Default::default()
        }
    }

    async fn generate(
        &self,
        generate: pb::GenerateRequest,
        request_id: String,
        arrived: Instant,
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
        // The answer's head comes once the engine accepted the request (a
        // llama-server sends it with the first token, so this can last a
        // whole prefill); a dropped call drops this future and the
        // connection with it.
        let response = tokio::select! {
            r = http::send(self.identity.port, hyper::Method::POST, path, Some(body)) => r
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
        let (tx, rx) = mpsc::channel(64);
        let relay = Relay {
            endpoint: plan.endpoint,
            logprobs: plan.logprobs,
            status: self.status.clone(),
            tx,
            cancel,
            arrived,
            request_id,
            prefill,
            _in_flight: in_flight,
        };
        tokio::spawn(relay.run(response));
        Ok(Box::pin(ReceiverStream::new(rx)))
    }

    fn drain(&self, timeout: Duration) -> impl Future<Output = DrainReport> + Send {
        let status = self.status.clone();
        async move { status.drain(timeout).await }
    }
}

/// One request's stream: engine SSE in, `GenerateResponse`s out.
struct Relay {
    endpoint: Endpoint,
    /// The log-probabilities asked for.
    logprobs: openai::Logprobs,
    status: Arc<Status>,
    tx: mpsc::Sender<Result<pb::GenerateResponse, GenerateError>>,
    cancel: watch::Receiver<bool>,
    arrived: Instant,
    request_id: String,
    prefill: crate::status::Prefill,
    _in_flight: InFlight,
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

/// Why a relay stops early.
enum Stop {
    /// The daemon dropped the call: close the engine's stream, say nothing.
    Gone,
    /// The stream failed: tell the daemon.
    Failed(GenerateError),
}

impl Relay {
    async fn run(mut self, mut response: http::Response) {
        let mut sse = SseSplitter::default();
        let mut progress = Progress::default();
        let outcome = loop {
            let piece = tokio::select! {
                _ = self.tx.closed() => break Err(Stop::Gone),
                _ = self.cancel.wait_for(|c| *c) => {
                    progress.finish = Some("cancelled".into());
                    break Ok(());
                }
                piece = response.chunk() => piece,
            };
            let ended = piece.is_none();
            let events = match piece {
                Some(Ok(bytes)) => sse
                    .feed(&bytes)
                    .map_err(|e| Stop::Failed(GenerateError::Failed(e))),
                Some(Err(e)) => Err(Stop::Failed(GenerateError::Unavailable(format!(
                    "the engine's stream broke: {e}; the engine may have died"
                )))),
                None => Ok(sse.finish().into_iter().collect()),
            };
            let step = match events {
                Ok(events) => self.handle(events, &mut progress).await,
                Err(stop) => Err(stop),
            };
            match step {
                Err(stop) => break Err(stop),
                Ok(()) if progress.done || ended => break Ok(()),
                Ok(()) => {}
            }
        };
        // Closing the engine's connection now (not when the daemon has read
        // the final chunk) stops a cancelled request at once.
        drop(response);
        match outcome {
            Ok(()) => self.finish(progress).await,
            Err(Stop::Gone) => {
                tracing::debug!(request = %self.request_id, "the daemon dropped the stream; closed the engine's connection");
            }
            Err(Stop::Failed(status)) => {
                tracing::warn!(request = %self.request_id, error = %status, "generation failed");
                let _ = self.tx.send(Err(status)).await;
            }
        }
    }

    async fn handle(&self, events: Vec<String>, progress: &mut Progress) -> Result<(), Stop> {
        for data in events {
            match openai::parse_event(&data, self.endpoint) {
                Ok(Event::Done) => progress.done = true,
                Ok(Event::Chunk(mut chunk)) => {
                    self.cut_logprobs(&mut chunk, progress).await?;
                    if !chunk.text.is_empty()
                        || !chunk.token_ids.is_empty()
                        || !chunk.reasoning.is_empty()
                        || !chunk.tool_calls.is_empty()
                    {
                        progress.first_token.get_or_insert_with(Instant::now);
                        self.prefill.release();
                        progress.ids += chunk.token_ids.len() as u32;
                        progress.deltas += 1;
                        self.status.token_arrived();
                        let delta = pb::GenerateResponse {
                            chunk: Some(pb::generate_response::Chunk::Delta(pb::TokenDelta {
                                text: chunk.text,
                                token_ids: chunk.token_ids,
                                logprobs: chunk.logprobs,
                                reasoning: chunk.reasoning,
                                tool_calls: chunk
                                    .tool_calls
                                    .into_iter()
                                    .map(|c| pb::ToolCallDelta {
                                        index: c.index,
                                        id: c.id,
                                        name: c.name,
                                        arguments: c.arguments,
                                    })
                                    .collect(),
                            })),
                        };
                        if self.tx.send(Ok(delta)).await.is_err() {
                            return Err(Stop::Gone);
                        }
                    }
                    if let Some(reason) = chunk.finish_reason {
                        progress.finish = Some(reason);
                    }
                    if let Some(usage) = chunk.usage {
                        progress.usage = Some(usage);
                    }
                }
                Ok(Event::Error { message, code }) => {
                    let message = format!("the engine failed the request: {message}");
                    return Err(Stop::Failed(match code {
                        Some(400) => GenerateError::Invalid(message),
                        _ => GenerateError::Failed(message),
                    }));
                }
                Err(e) => return Err(Stop::Failed(GenerateError::Failed(e))),
            }
        }
        Ok(())
    }

    /// The chunk's logprobs as asked: ids given, the prompt's sent once
    /// as their own chunk (an echo's first chunk), alternatives cut to the
    /// number asked, none where none were asked, and nothing generated for
    /// a prompt-only request (vLLM runs a step for it).
    async fn cut_logprobs(
        &self,
        chunk: &mut openai::Chunk,
        progress: &mut Progress,
    ) -> Result<(), Stop> {
        let failed = |e: String| Stop::Failed(GenerateError::Failed(e));
        let asked = self.logprobs;
        let echoed = asked.prompt.is_some() && !progress.prompt_logprobs_sent;
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
            if self.tx.send(Ok(message)).await.is_err() {
                return Err(Stop::Gone);
            }
            progress.prompt_logprobs_sent = true;
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

    async fn finish(self, progress: Progress) {
        if self.logprobs.prompt.is_some() && !progress.prompt_logprobs_sent {
            let _ = self
                .tx
                .send(Err(GenerateError::Failed(
                    "the engine ended the stream without the prompt's logprobs (its echo)".into(),
                )))
                .await;
            return;
        }
        let Some(reason) = progress.finish else {
            let _ = self
                .tx
                .send(Err(GenerateError::Unavailable(
                    "the engine ended the stream without a finish reason; it may have died".into(),
                )))
                .await;
            return;
        };
        let now = Instant::now();
        let first = progress.first_token.unwrap_or(now);
        let ttft = first.duration_since(self.arrived);
        // Engines that give no usage (or no ids) are counted by what came.
        let usage = progress.usage.unwrap_or(Usage {
            prompt_tokens: 0,
            completion_tokens: if progress.ids > 0 {
                progress.ids
            } else {
                progress.deltas
            },
            cached_prompt_tokens: 0,
        });
        // vLLM counts the step it ran for a prompt-only request; nothing of
        // it was sent.
        let usage = Usage {
            completion_tokens: if self.logprobs.prompt_only {
                0
            } else {
                usage.completion_tokens
            },
            ..usage
        };
        let last = pb::GenerateResponse {
            chunk: Some(pb::generate_response::Chunk::Final(pb::GenerationFinal {
                finish_reason: finish_reason(&reason) as i32,
                usage: Some(pb::Usage {
                    prompt_tokens: usage.prompt_tokens,
                    completion_tokens: usage.completion_tokens,
                }),
                timings: Some(pb::Timings {
                    queue_us: 0,
                    prefill_us: ttft.as_micros() as u64,
                    decode_us: now.duration_since(first).as_micros() as u64,
                    time_to_first_token_us: ttft.as_micros() as u64,
                    cached_prompt_tokens: usage.cached_prompt_tokens,
                }),
                slot: String::new(),
            })),
        };
        let _ = self.tx.send(Ok(last)).await;
    }
}
