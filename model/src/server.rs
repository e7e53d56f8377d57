//! The `Engine` gRPC service (engine.proto) on the worker's unix socket.
//!
//! The socket is bound before the model loads, so `Info` and `Health` answer
//! with `LOADING` and the load progress from the first second; `Generate`
//! answers `UNAVAILABLE` until the engine is ready and again once draining.

use crate::banners::Banners;
use crate::chat_template::{ChatTemplate, Turn};
use crate::sampling::Penalties;
use crate::sampling::SamplingConfig;
use crate::scheduler::{EngineHandle, Event, Finish, Params, Submission, SubmitError};
use crate::state::{Phase, Status};
use crate::tokenizer::Tokenizer;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status as RpcStatus};
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_server::Engine;

/// What the server needs once the model is loaded.
pub struct Ready {
    /// The engine thread.
    pub engine: EngineHandle,
    /// Text to ids.
    pub tokenizer: Arc<Tokenizer>,
    /// Chat rendering.
    pub template: ChatTemplate,
    /// Tokens per sequence.
    pub context: usize,
    /// `max_tokens` when a request leaves it 0.
    pub default_max_tokens: usize,
}

/// Facts known before loading, reported by `Info`.
#[derive(Debug, Clone)]
pub struct Identity {
    /// TP degree.
    pub tp: u32,
    /// Card BDF per rank.
    pub bdfs: Vec<String>,
    /// `warm` or `cold`.
    pub cache_mode: String,
    /// The optional GenerateRequest parameters honoured (Info's
    /// `supported_parameters`; the rest are refused).
    pub supported_parameters: Vec<String>,
}

/// Engine name and version, as Info reports it and refusals name it.
pub fn engine_version() -> String {
    format!("tt-worker {}", env!("CARGO_PKG_VERSION"))
}

/// The most alternatives `logprobs` may ask for per token (as OpenAI's
/// `top_logprobs` and vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: u32 = 20;

/// The most `stop_token_ids` a request may give.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;

/// The service.
pub struct EngineService {
    identity: Identity,
    status: Arc<Status>,
    banners: Arc<Banners>,
    ready: Arc<OnceLock<Ready>>,
    /// Fired once a `Shutdown` call has drained the engine.
    shutdown: Arc<tokio::sync::Notify>,
}

impl EngineService {
    /// A service reporting `status`; `ready` is filled when loading ends.
    pub fn new(
        identity: Identity,
        status: Arc<Status>,
        banners: Arc<Banners>,
        ready: Arc<OnceLock<Ready>>,
        shutdown: Arc<tokio::sync::Notify>,
    ) -> Self {
        Self {
            identity,
            status,
            banners,
            ready,
            shutdown,
        }
    }
}

fn worker_state(p: Phase) -> i32 {
    match p {
        Phase::Loading => pb::WorkerState::Loading as i32,
        Phase::Ready => pb::WorkerState::Ready as i32,
        Phase::Draining => pb::WorkerState::Draining as i32,
    }
}

fn progress(status: &Status) -> pb::LoadProgress {
    let p = status.progress();
    pb::LoadProgress {
        done: p.done,
        total: p.total,
        message: p.message,
    }
}

fn finish_reason(f: Finish) -> i32 {
    match f {
        Finish::Stop => pb::FinishReason::Stop as i32,
        Finish::Length => pb::FinishReason::Length as i32,
        Finish::Cancelled => pb::FinishReason::Cancelled as i32,
    }
}

fn to_response(tokenizer: &Tokenizer, ev: Event) -> Result<pb::GenerateResponse, RpcStatus> {
    let chunk = match ev {
        Event::Delta {
            text,
            ids,
            logprobs,
        } => pb::generate_response::Chunk::Delta(pb::TokenDelta {
            text,
            token_ids: ids,
            logprobs: logprobs
                .into_iter()
                .map(|l| {
                    let bytes = tokenizer.token_bytes(l.token);
                    pb::TokenLogprob {
                        token_id: l.token,
                        token: String::from_utf8_lossy(bytes).into_owned(),
                        bytes: bytes.to_vec(),
                        logprob: l.logprob,
                        top_logprobs: l
                            .top
                            .into_iter()
                            .map(|(id, logprob)| {
                                let bytes = tokenizer.token_bytes(id);
                                pb::TopLogprob {
                                    token_id: id,
                                    token: String::from_utf8_lossy(bytes).into_owned(),
                                    bytes: bytes.to_vec(),
                                    logprob,
                                }
                            })
                            .collect(),
                    }
                })
                .collect(),
            ..Default::default()
        }),
        Event::Final(f) => pb::generate_response::Chunk::Final(pb::GenerationFinal {
            finish_reason: finish_reason(f.reason),
            usage: Some(pb::Usage {
                prompt_tokens: f.prompt_tokens,
                completion_tokens: f.completion_tokens,
            }),
            timings: Some(pb::Timings {
                queue_us: f.queue_us,
                prefill_us: f.prefill_us,
                decode_us: f.decode_us,
                time_to_first_token_us: f.ttft_us,
                cached_prompt_tokens: f.cached_prompt_tokens,
            }),
            slot: String::new(),
        }),
        Event::Error(e) => return Err(RpcStatus::internal(format!("engine failure: {e}"))),
    };
    Ok(pb::GenerateResponse { chunk: Some(chunk) })
}

/// Checks sampling settings and maps them.
fn sampling(p: Option<&pb::SamplingParams>) -> Result<SamplingConfig, RpcStatus> {
    let Some(p) = p else {
        return Ok(SamplingConfig::GREEDY);
    };
    if !p.temperature.is_finite() || p.temperature < 0.0 {
        return Err(RpcStatus::invalid_argument(format!(
            "sampling.temperature must be >= 0, got {}",
            p.temperature
        )));
    }
    if !(0.0..=1.0).contains(&p.top_p) {
        return Err(RpcStatus::invalid_argument(format!(
            "sampling.top_p must be within [0, 1], got {}",
            p.top_p
        )));
    }
    Ok(SamplingConfig {
        temperature: p.temperature,
        top_k: p.top_k as usize,
        top_p: p.top_p,
        seed: p.seed,
    })
}

/// `field: value is outside [lo, hi]` when a penalty is out of its range.
fn check_range(field: &str, value: f32, lo: f32, hi: f32, fix: &str) -> Result<(), RpcStatus> {
    if value.is_finite() && (lo..=hi).contains(&value) {
        return Ok(());
    }
    Err(RpcStatus::invalid_argument(format!(
        "{field}: {value} is outside [{lo}, {hi}]; {fix}"
    )))
}

/// Checks the optional parameters (refusing one this engine does not list
/// in `supported`, and values out of range) and maps them. `max_tokens` is
/// the number the sequence may generate, `vocab` the tokenizer's size.
fn params(
    g: &pb::GenerateRequest,
    supported: &[String],
    max_tokens: usize,
    vocab: usize,
) -> Result<Params, RpcStatus> {
    if g.n > 1 {
        return Err(RpcStatus::invalid_argument(format!(
            "n: {} completions per request are not supported; send n = 1 (or leave it out) and send parallel requests for more",
            g.n
        )));
    }
    if let Some(name) = tt_serving_proto::parameters::requested(g)
        .into_iter()
        .find(|p| !supported.iter().any(|s| s == p))
    {
        return Err(RpcStatus::invalid_argument(format!(
            "{name}: not supported by engine {}; leave it out",
            engine_version()
        )));
    }
    check_range(
        "presence_penalty",
        g.presence_penalty,
        -2.0,
        2.0,
        "use 0 for none",
    )?;
    check_range(
        "frequency_penalty",
        g.frequency_penalty,
        -2.0,
        2.0,
        "use 0 for none",
    )?;
    if !(g.repetition_penalty.is_finite()
        && g.repetition_penalty >= 0.0
        && g.repetition_penalty <= 2.0)
    {
        return Err(RpcStatus::invalid_argument(format!(
            "repetition_penalty: {} is outside (0, 2]; use 1 (or 0) for none, above 1 to discourage repetition",
            g.repetition_penalty
        )));
    }
    let min_tokens = g.min_tokens as usize;
    if min_tokens > max_tokens {
        return Err(RpcStatus::invalid_argument(format!(
            "min_tokens: {min_tokens} is above the {max_tokens} tokens this request may generate (max_tokens, or what the context leaves); lower min_tokens"
        )));
    }
    if g.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(RpcStatus::invalid_argument(format!(
            "stop_token_ids: {} ids is above this engine's limit of {MAX_STOP_TOKEN_IDS}; give fewer",
            g.stop_token_ids.len()
        )));
    }
    if let Some((i, id)) = g
        .stop_token_ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab)
    {
        return Err(RpcStatus::invalid_argument(format!(
            "stop_token_ids[{i}]: {id} is not a token of this model (its vocabulary has {vocab} tokens, ids 0 to {})",
            vocab.saturating_sub(1)
        )));
    }
    if let Some(n) = g.logprobs.filter(|&n| n > MAX_LOGPROBS) {
        return Err(RpcStatus::invalid_argument(format!(
            "logprobs: {n} alternatives per token is above this engine's limit of {MAX_LOGPROBS}; ask for at most {MAX_LOGPROBS}"
        )));
    }
    Ok(Params {
        penalties: Penalties {
            presence: g.presence_penalty,
            frequency: g.frequency_penalty,
            repetition: g.repetition_penalty,
        },
        min_tokens,
        ignore_eos: g.ignore_eos,
        stop_token_ids: g.stop_token_ids.iter().copied().collect(),
        logprobs: g.logprobs.map(|n| n as usize),
    })
}

impl Ready {
    /// Validates and tokenizes a request into a submission.
    fn prepare(
        &self,
        req: pb::EngineGenerateRequest,
        supported: &[String],
        events: mpsc::UnboundedSender<Event>,
        arrived: Instant,
    ) -> Result<Submission, RpcStatus> {
        let g = req.request.ok_or_else(|| {
            RpcStatus::invalid_argument("EngineGenerateRequest.request is missing")
        })?;
        let text = match &g.input {
            Some(pb::generate_request::Input::Prompt(p)) => p.clone(),
            Some(pb::generate_request::Input::Chat(c)) => {
                let turns: Vec<Turn> = c
                    .messages
                    .iter()
                    .map(|m| Turn {
                        role: m.role.clone(),
                        content: m.content.clone(),
                    })
                    .collect();
                self.template
                    .render(&turns)
                    .map_err(|e| RpcStatus::invalid_argument(e.to_string()))?
            }
            None => {
                return Err(RpcStatus::invalid_argument(
                    "request has neither `prompt` nor `chat`",
                ))
            }
        };
        let prompt = self
            .tokenizer
            .encode(&text)
            .map_err(|e| RpcStatus::invalid_argument(e.to_string()))?;
        if prompt.is_empty() {
            return Err(RpcStatus::invalid_argument("the prompt is empty"));
        }
        let ctx = self.context;
        if prompt.len() >= ctx {
            return Err(RpcStatus::invalid_argument(format!(
                "the prompt has {} tokens but the context length is {ctx} tokens (prompt plus output); shorten the prompt",
                prompt.len()
            )));
        }
        let max_tokens = if g.max_tokens == 0 {
            self.default_max_tokens.min(ctx - prompt.len())
        } else {
            let want = g.max_tokens as usize;
            if prompt.len() + want > ctx {
                return Err(RpcStatus::invalid_argument(format!(
                    "prompt ({} tokens) plus max_tokens ({want}) exceeds the context length of {ctx} tokens; lower max_tokens to at most {}",
                    prompt.len(),
                    ctx - prompt.len()
                )));
            }
            want
        };
        let params = params(&g, supported, max_tokens, self.tokenizer.vocab_size())?;
        Ok(Submission {
            request_id: req.request_id,
            prompt,
            max_tokens,
            sampling: sampling(g.sampling.as_ref())?,
            stop: g.stop,
            params,
            arrived,
            events,
        })
    }
}

type GenerateStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::GenerateResponse, RpcStatus>> + Send + 'static>,
>;

#[tonic::async_trait]
impl Engine for EngineService {
    async fn info(
        &self,
        _: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, RpcStatus> {
        let loaded = self.status.loaded().cloned().unwrap_or_default();
        Ok(Response::new(pb::InfoResponse {
            model_name: loaded.model_name,
            architecture: loaded.architecture,
            parameter_count: loaded.parameter_count,
            tp: self.identity.tp,
            ranks: self
                .identity
                .bdfs
                .iter()
                .enumerate()
                .map(|(rank, bdf)| pb::RankBinding {
                    rank: rank as u32,
                    bdf: bdf.clone(),
                })
                .collect(),
            context_length: loaded.context_length,
            cache_mode: self.identity.cache_mode.clone(),
            cache_files_read: loaded.cache_files_read,
            cache_files_written: loaded.cache_files_written,
            load_time_ms: loaded.load_time_ms,
            banners_engaged: self.banners.engaged(),
            engine_version: engine_version(),
            state: worker_state(self.status.phase()),
            progress: Some(progress(&self.status)),
            supported_parameters: self.identity.supported_parameters.clone(),
            kv_cache: self.status.loaded().map(|l| pb::KvCacheInfo {
                budget_bytes: l.kv.budget_bytes,
                block_tokens: crate::kv::BLOCK_TOKENS as u32,
                blocks_total: l.kv.blocks,
                prefix_cache: l.kv.prefix_cache,
            }),
            // Every file tt-worker writes is a weights file.
            runtime_cache_files: Vec::new(),
        }))
    }

    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, RpcStatus> {
        use std::sync::atomic::Ordering;
        Ok(Response::new(pb::HealthResponse {
            state: worker_state(self.status.phase()),
            active_sequences: self.status.active.load(Ordering::Acquire),
            queued_sequences: self.status.queued(),
            last_progress_unix_ms: self.status.last_step_unix_ms.load(Ordering::Acquire),
            progress: Some(progress(&self.status)),
            prefill_tokens: self.status.prefill_tokens.load(Ordering::Acquire),
            kv_blocks_in_use: self.status.kv_blocks_in_use.load(Ordering::Acquire),
            kv_blocks_cached: self.status.kv_blocks_cached.load(Ordering::Acquire),
        }))
    }

    type GenerateStream = GenerateStream;

    async fn generate(
        &self,
        request: Request<pb::EngineGenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, RpcStatus> {
        let arrived = Instant::now();
        match self.status.phase() {
            Phase::Loading => {
                return Err(RpcStatus::unavailable(
                    "the worker is still loading the model",
                ))
            }
            Phase::Draining => return Err(RpcStatus::unavailable("the worker is shutting down")),
            Phase::Ready => {}
        }
        let ready = self
            .ready
            .get()
            .ok_or_else(|| RpcStatus::unavailable("the worker is still loading the model"))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let sub = ready.prepare(
            request.into_inner(),
            &self.identity.supported_parameters,
            tx,
            arrived,
        )?;
        ready.engine.submit(sub).map_err(|e| match e {
            SubmitError::Full(_) => RpcStatus::resource_exhausted(e.to_string()),
            SubmitError::Stopped => RpcStatus::unavailable(e.to_string()),
        })?;
        let tokenizer = ready.tokenizer.clone();
        let stream = UnboundedReceiverStream::new(rx).map(move |ev| to_response(&tokenizer, ev));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn shutdown(
        &self,
        request: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, RpcStatus> {
        let timeout = Duration::from_millis(request.into_inner().drain_timeout_ms as u64);
        let report = drain(&self.status, &self.ready, timeout).await;
        self.shutdown.notify_one();
        Ok(Response::new(pb::ShutdownResponse {
            finished: report.finished,
            cancelled: report.cancelled,
        }))
    }
}

/// Stops admitting work and drains the engine (if it was started).
pub async fn drain(
    status: &Status,
    ready: &OnceLock<Ready>,
    timeout: Duration,
) -> crate::scheduler::DrainReport {
    status.set_phase(Phase::Draining);
    let report = match ready.get() {
        Some(r) => r.engine.drain(timeout).await,
        None => Default::default(),
    };
    if report.engine_stuck {
        status.engine_stuck.store(true, Ordering::Release);
    }
    report
}
