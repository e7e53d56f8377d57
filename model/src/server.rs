//! tt-worker as a [`Backend`] of the worker contract: Info's model facts,
//! Health's counters, Generate's validation and tokenization into a
//! submission to the engine thread, and the drain. The contract's service
//! does the rest (phase gating, ranks, Shutdown, gRPC statuses).

use crate::banners::Banners;
use crate::chat_template::{ChatTemplate, Turn};
use crate::sampling::Penalties;
use crate::sampling::SamplingConfig;
use crate::scheduler::{EngineHandle, Event, Finish, Params, Submission, SubmitError};
use crate::state::{Phase, Status};
use crate::tokenizer::Tokenizer;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;
use tt_serving_proto::v1 as pb;
use tt_worker_contract::service::LOADING;
use tt_worker_contract::{Backend, DrainReport, GenerateError, TokenStream};

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

/// Engine name and version, as Info reports it and refusals name it.
pub fn engine_version() -> String {
    format!("tt-worker {}", env!("CARGO_PKG_VERSION"))
}

/// The most alternatives `logprobs` may ask for per token (as OpenAI's
/// `top_logprobs` and vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: u32 = 20;

/// The most `stop_token_ids` a request may give.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;

/// The backend: the engine once loaded, and the status the loader and the
/// engine thread keep.
pub struct TtWorker {
    /// The optional GenerateRequest parameters honoured (Info's
    /// `supported_parameters`; the rest are refused).
    supported_parameters: Vec<String>,
    status: Arc<Status>,
    banners: Arc<Banners>,
    ready: OnceLock<Ready>,
}

impl TtWorker {
    /// A loading worker reporting `status`.
    pub fn new(
        supported_parameters: Vec<String>,
        status: Arc<Status>,
        banners: Arc<Banners>,
    ) -> Self {
        Self {
            supported_parameters,
            status,
            banners,
            ready: OnceLock::new(),
        }
    }

    /// The load is done: serve `ready` from now on.
    pub fn set_ready(&self, ready: Ready) {
        let _ = self.ready.set(ready);
        self.status.set_phase(Phase::Ready);
    }
}

fn invalid(message: impl Into<String>) -> GenerateError {
    GenerateError::Invalid(message.into())
}

fn finish_reason(f: Finish) -> i32 {
    match f {
        Finish::Stop => pb::FinishReason::Stop as i32,
        Finish::Length => pb::FinishReason::Length as i32,
        Finish::Cancelled => pb::FinishReason::Cancelled as i32,
    }
}

/// One token's logprob as the protocol carries it, with its text.
fn token_logprob(tokenizer: &Tokenizer, l: crate::scheduler::TokenLogprob) -> pb::TokenLogprob {
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
                    token_id: Some(id),
                    token: String::from_utf8_lossy(bytes).into_owned(),
                    bytes: bytes.to_vec(),
                    logprob,
                }
            })
            .collect(),
    }
}

fn to_response(tokenizer: &Tokenizer, ev: Event) -> Result<pb::GenerateResponse, GenerateError> {
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
                .map(|l| token_logprob(tokenizer, l))
                .collect(),
            ..Default::default()
        }),
        Event::Prompt(tokens) => pb::generate_response::Chunk::PromptLogprobs(pb::PromptLogprobs {
            tokens: tokens
                .into_iter()
                .map(|l| token_logprob(tokenizer, l))
                .collect(),
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
        Event::Error(e) => return Err(GenerateError::Failed(format!("engine failure: {e}"))),
    };
    Ok(pb::GenerateResponse { chunk: Some(chunk) })
}

/// Checks sampling settings and maps them.
fn sampling(p: Option<&pb::SamplingParams>) -> Result<SamplingConfig, GenerateError> {
    let Some(p) = p else {
        return Ok(SamplingConfig::GREEDY);
    };
    if !p.temperature.is_finite() || p.temperature < 0.0 {
        return Err(invalid(format!(
            "sampling.temperature must be >= 0, got {}",
            p.temperature
        )));
    }
    if !(0.0..=1.0).contains(&p.top_p) {
        return Err(invalid(format!(
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
fn check_range(field: &str, value: f32, lo: f32, hi: f32, fix: &str) -> Result<(), GenerateError> {
    if value.is_finite() && (lo..=hi).contains(&value) {
        return Ok(());
    }
    Err(invalid(format!(
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
) -> Result<Params, GenerateError> {
    if g.n > 1 {
        return Err(invalid(format!(
            "n: {} completions per request are not supported; send n = 1 (or leave it out) and send parallel requests for more",
            g.n
        )));
    }
    if let Some(name) = tt_serving_proto::parameters::requested(g)
        .into_iter()
        .find(|p| !supported.iter().any(|s| s == p))
    {
        return Err(invalid(format!(
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
        return Err(invalid(format!(
            "repetition_penalty: {} is outside (0, 2]; use 1 (or 0) for none, above 1 to discourage repetition",
            g.repetition_penalty
        )));
    }
    let min_tokens = g.min_tokens as usize;
    if min_tokens > max_tokens {
        return Err(invalid(format!(
            "min_tokens: {min_tokens} is above the {max_tokens} tokens this request may generate (max_tokens, or what the context leaves); lower min_tokens"
        )));
    }
    if g.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(invalid(format!(
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
        return Err(invalid(format!(
            "stop_token_ids[{i}]: {id} is not a token of this model (its vocabulary has {vocab} tokens, ids 0 to {})",
            vocab.saturating_sub(1)
        )));
    }
    if let Some(n) = g.logprobs.filter(|&n| n > MAX_LOGPROBS) {
        return Err(invalid(format!(
            "logprobs: {n} alternatives per token is above this engine's limit of {MAX_LOGPROBS}; ask for at most {MAX_LOGPROBS}"
        )));
    }
    if let Some(n) = g.prompt_logprobs.filter(|&n| n > MAX_LOGPROBS) {
        return Err(invalid(format!(
            "prompt_logprobs: {n} alternatives per token is above this engine's limit of {MAX_LOGPROBS}; ask for at most {MAX_LOGPROBS}"
        )));
    }
    if g.prompt_only && g.prompt_logprobs.is_none() {
        return Err(invalid(
            "prompt_only: asks for the prompt's logprobs and nothing else; set prompt_logprobs too",
        ));
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
        prompt_logprobs: g.prompt_logprobs.map(|n| n as usize),
        prompt_only: g.prompt_only,
    })
}

impl Ready {
    /// Validates and tokenizes a request into a submission.
    fn prepare(
        &self,
        g: pb::GenerateRequest,
        request_id: String,
        supported: &[String],
        events: mpsc::UnboundedSender<Event>,
        arrived: Instant,
    ) -> Result<Submission, GenerateError> {
        let vocab = self.tokenizer.vocab_size();
        let text = match &g.input {
            Some(pb::generate_request::Input::PromptTokens(t)) => {
                if let Some((i, id)) = t
                    .ids
                    .iter()
                    .enumerate()
                    .find(|(_, &id)| id as usize >= vocab)
                {
                    return Err(invalid(format!(
                        "prompt_tokens.ids[{i}]: {id} is not a token of this model (its vocabulary has {vocab} tokens, ids 0 to {})",
                        vocab.saturating_sub(1)
                    )));
                }
                String::new()
            }
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
                    .map_err(|e| invalid(e.to_string()))?
            }
            None => return Err(invalid("request has neither `prompt` nor `chat`")),
        };
        let prompt = match &g.input {
            Some(pb::generate_request::Input::PromptTokens(t)) => t.ids.clone(),
            _ => self
                .tokenizer
                .encode(&text)
                .map_err(|e| invalid(e.to_string()))?,
        };
        if prompt.is_empty() {
            return Err(invalid("the prompt is empty"));
        }
        let ctx = self.context;
        if prompt.len() >= ctx {
            return Err(invalid(format!(
                "the prompt has {} tokens but the context length is {ctx} tokens (prompt plus output); shorten the prompt",
                prompt.len()
            )));
        }
        let max_tokens = if g.prompt_only {
            0
        } else if g.max_tokens == 0 {
            self.default_max_tokens.min(ctx - prompt.len())
        } else {
            let want = g.max_tokens as usize;
            if prompt.len() + want > ctx {
                return Err(invalid(format!(
                    "prompt ({} tokens) plus max_tokens ({want}) exceeds the context length of {ctx} tokens; lower max_tokens to at most {}",
                    prompt.len(),
                    ctx - prompt.len()
                )));
            }
            want
        };
        let params = params(&g, supported, max_tokens, vocab)?;
        Ok(Submission {
            request_id,
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

impl Backend for TtWorker {
    const SERVICE_NAME: &'static str = "tt-worker";

    fn phase(&self) -> Phase {
        self.status.phase()
    }

    fn progress(&self) -> pb::LoadProgress {
        let p = self.status.progress();
        pb::LoadProgress {
            done: p.done,
            total: p.total,
            message: p.message,
        }
    }

    fn info(&self) -> pb::InfoResponse {
        let loaded = self.status.loaded().cloned().unwrap_or_default();
        pb::InfoResponse {
            model_name: loaded.model_name,
            architecture: loaded.architecture,
            parameter_count: loaded.parameter_count,
            context_length: loaded.context_length,
            cache_files_read: loaded.cache_files_read,
            cache_files_written: loaded.cache_files_written,
            load_time_ms: loaded.load_time_ms,
            banners_engaged: self.banners.engaged(),
            engine_version: engine_version(),
            supported_parameters: self.supported_parameters.clone(),
            kv_cache: self.status.loaded().map(|l| pb::KvCacheInfo {
                budget_bytes: l.kv.budget_bytes,
                block_tokens: crate::kv::BLOCK_TOKENS as u32,
                blocks_total: l.kv.blocks,
                prefix_cache: l.kv.prefix_cache,
            }),
            // Every file tt-worker writes is a weights file.
            runtime_cache_files: Vec::new(),
            ..Default::default()
        }
    }

    fn health(&self) -> pb::HealthResponse {
        pb::HealthResponse {
            active_sequences: self.status.active.load(Ordering::Acquire),
            queued_sequences: self.status.queued(),
            last_progress_unix_ms: self.status.last_step_unix_ms.load(Ordering::Acquire),
            prefill_tokens: self.status.prefill_tokens.load(Ordering::Acquire),
            kv_blocks_in_use: self.status.kv_blocks_in_use.load(Ordering::Acquire),
            kv_blocks_cached: self.status.kv_blocks_cached.load(Ordering::Acquire),
            ..Default::default()
        }
    }

    fn generate(
        &self,
        request: pb::GenerateRequest,
        request_id: String,
        arrived: Instant,
        _trace: tt_serving_telemetry::Span,
    ) -> impl Future<Output = Result<TokenStream, GenerateError>> + Send {
        // All of it happens before the first await: the engine thread
        // takes a submission without waiting.
        let started = self.start(request, request_id, arrived);
        async move { started }
    }

    fn drain(&self, timeout: Duration) -> impl Future<Output = DrainReport> + Send {
        self.status.set_phase(Phase::Draining);
        let status = self.status.clone();
        let engine = self.ready.get().map(|r| r.engine.clone());
        async move {
            let report = match engine {
                Some(engine) => engine.drain(timeout).await,
                None => Default::default(),
            };
            if report.engine_stuck {
                status.engine_stuck.store(true, Ordering::Release);
            }
            DrainReport {
                finished: report.finished,
                cancelled: report.cancelled,
            }
        }
    }
}

impl TtWorker {
    /// Validates, tokenizes and submits one request.
    fn start(
        &self,
        request: pb::GenerateRequest,
        request_id: String,
        arrived: Instant,
    ) -> Result<TokenStream, GenerateError> {
        let ready = self
            .ready
            .get()
            .ok_or_else(|| GenerateError::Unavailable(LOADING.into()))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let sub = ready.prepare(request, request_id, &self.supported_parameters, tx, arrived)?;
        ready.engine.submit(sub).map_err(|e| match e {
            SubmitError::Full(_) => GenerateError::Busy(e.to_string()),
            SubmitError::Stopped => GenerateError::Unavailable(e.to_string()),
        })?;
        let tokenizer = ready.tokenizer.clone();
        let stream = UnboundedReceiverStream::new(rx).map(move |ev| to_response(&tokenizer, ev));
        Ok(Box::pin(stream))
    }
}
