//! Continuous batching: one engine thread decodes every active sequence
//! together, one batched step per token.
//!
//! Each step stacks the last token of every decoding sequence with a bounded
//! chunk of any prompt still being prefilled, so a long new prompt delays the
//! running streams by at most one chunk per step instead of its whole length.
//! New sequences join between steps; finished or cancelled ones (the client
//! dropped its stream) leave at once and free their KV slot.
//!
//! Admission is bounded: at most `max_batch` sequences in the batch and
//! `max_queue` waiting; beyond that [`EngineHandle::submit`] refuses, which
//! the server answers with `RESOURCE_EXHAUSTED`.

use crate::banners::Banners;
use crate::faults::Faults;
use crate::model::StepSeq;
use crate::output::{OutputText, Pushed};
use crate::sampling::{self, History, Logprobs, Penalties, Sampler, SamplingConfig};
use crate::state::{unix_ms, Status};
use crate::tokenizer::Tokenizer;
use crate::tp::Ranks;
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc as ampsc, oneshot};

/// Batching limits.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Sequences decoded together (KV slots).
    pub max_batch: usize,
    /// Sequences allowed to wait for a slot.
    pub max_queue: usize,
    /// Prompt tokens prefilled per step while other sequences decode.
    pub prefill_chunk: usize,
    /// Prompt tokens prefilled per step when nothing else is decoding.
    pub prefill_chunk_idle: usize,
    /// Tokens per sequence (prompt plus output).
    pub context: usize,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// End-of-generation token or stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Client went away or the worker is draining.
    Cancelled,
}

/// The end of one generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalInfo {
    /// Why it ended.
    pub reason: Finish,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Waiting for a batch slot.
    pub queue_us: u64,
    /// From admission to the first token.
    pub prefill_us: u64,
    /// After the first token.
    pub decode_us: u64,
    /// From arrival to the first token.
    pub ttft_us: u64,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_prompt_tokens: u32,
}

/// The log-probability of one generated token (when the request asked).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its logprob.
    pub logprob: f32,
    /// The most likely tokens and their logprobs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What a generation stream carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New text and the tokens it came from.
    Delta {
        /// Text (may be empty while a character or stop string is pending).
        text: String,
        /// Token ids.
        ids: Vec<u32>,
        /// One per id when the request asked for logprobs, else empty.
        logprobs: Vec<TokenLogprob>,
    },
    /// The end.
    Final(FinalInfo),
    /// The engine failed while running this sequence.
    Error(String),
}

/// The optional generation parameters (`GenerateRequest`'s fields of the
/// same names), validated; all off by default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Params {
    /// Presence, frequency and repetition penalties.
    pub penalties: Penalties,
    /// End-of-generation and stop tokens are suppressed before this many
    /// tokens.
    pub min_tokens: usize,
    /// End-of-generation tokens are never generated (those also listed in
    /// `stop_token_ids` excepted).
    pub ignore_eos: bool,
    /// Tokens that end the generation.
    pub stop_token_ids: HashSet<u32>,
    /// `Some(n)`: report each token's logprob and the n most likely.
    pub logprobs: Option<usize>,
}

/// One generation request, tokenized and validated.
#[derive(Debug)]
pub struct Submission {
    /// The daemon's request id, for logs.
    pub request_id: String,
    /// Prompt tokens (non-empty, shorter than the context).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampling: SamplingConfig,
    /// Stop strings.
    pub stop: Vec<String>,
    /// The optional parameters.
    pub params: Params,
    /// When the request reached the worker.
    pub arrived: Instant,
    /// Where the stream goes; dropping its receiver cancels the sequence.
    pub events: ampsc::UnboundedSender<Event>,
}

/// Why a submission was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    /// Batch and queue are full.
    #[error("the worker is at capacity ({0} sequences in the batch and queue); retry later")]
    Full(usize),
    /// The engine thread is gone.
    #[error("the engine is not running")]
    Stopped,
}

/// What a drain did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Sequences that finished normally during the drain.
    pub finished: u32,
    /// Sequences cancelled at the deadline.
    pub cancelled: u32,
    /// The engine thread did not answer by the deadline (stuck in a step):
    /// its sequences are abandoned with the process.
    pub engine_stuck: bool,
}

/// How long past a drain's deadline the engine thread may take to answer
/// (it checks the deadline between steps, so one step's worth).
const DRAIN_ANSWER_GRACE: Duration = Duration::from_secs(1);

enum Command {
    Submit(Submission),
    Drain {
        deadline: Instant,
        done: oneshot::Sender<DrainReport>,
    },
}

/// The way into the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    status: Arc<Status>,
    capacity: usize,
}

impl EngineHandle {
    /// Queues a sequence, or refuses when batch and queue are full.
    pub fn submit(&self, sub: Submission) -> Result<(), SubmitError> {
        let cap = self.capacity as u32;
        self.status
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .map_err(|_| SubmitError::Full(self.capacity))?;
        self.tx.send(Command::Submit(sub)).map_err(|_| {
            self.status.in_flight.fetch_sub(1, Ordering::AcqRel);
            SubmitError::Stopped
        })
    }

    /// Finishes in-flight sequences until `timeout`, then cancels the rest.
    pub async fn drain(&self, timeout: Duration) -> DrainReport {
        let (done, rx) = oneshot::channel();
        let cmd = Command::Drain {
            deadline: Instant::now() + timeout,
            done,
        };
        if self.tx.send(cmd).is_err() {
            return DrainReport::default();
        }
        // The engine thread enforces the deadline between steps; a step that
        // never ends (a hung device) must not keep the worker from exiting,
        // or a SIGTERM (or the parent's death) would leave it holding its
        // cards.
        match tokio::time::timeout(timeout + DRAIN_ANSWER_GRACE, rx).await {
            Ok(report) => report.unwrap_or_default(),
            Err(_) => {
                tracing::warn!(
                    "the engine thread did not answer the drain within {:?}; exiting without it",
                    timeout + DRAIN_ANSWER_GRACE
                );
                DrainReport {
                    engine_stuck: true,
                    ..DrainReport::default()
                }
            }
        }
    }
}

/// Features whose banner the first step proves (flag names).
#[derive(Debug, Clone, Default)]
pub struct Engaged {
    /// Flags whose feature runs in every step.
    pub flags: Vec<&'static str>,
}

struct Seq {
    sub: Submission,
    slot: usize,
    /// Tokens already in the KV cache.
    fed: usize,
    generated: Vec<u32>,
    sampler: Sampler,
    /// What the penalties look at.
    history: History,
    text: OutputText,
    admitted: Instant,
    first_token: Option<Instant>,
}

impl Seq {
    fn prefilling(&self) -> bool {
        self.fed < self.sub.prompt.len()
    }
}

struct Engine {
    rx: mpsc::Receiver<Command>,
    ranks: Ranks,
    tokenizer: Arc<Tokenizer>,
    cfg: SchedulerConfig,
    status: Arc<Status>,
    banners: Arc<Banners>,
    engaged: Engaged,
    faults: Faults,
    waiting: VecDeque<Submission>,
    running: Vec<Seq>,
    free_slots: Vec<usize>,
    drain: Option<(Instant, oneshot::Sender<DrainReport>, DrainReport)>,
    tokens_generated: u64,
    stepped: bool,
}

/// Starts the engine thread.
pub fn spawn(
    ranks: Ranks,
    tokenizer: Arc<Tokenizer>,
    cfg: SchedulerConfig,
    status: Arc<Status>,
    banners: Arc<Banners>,
    engaged: Engaged,
    faults: Faults,
) -> std::io::Result<EngineHandle> {
    let (tx, rx) = mpsc::channel();
    let capacity = cfg.max_batch + cfg.max_queue;
    let engine = Engine {
        rx,
        ranks,
        tokenizer,
        free_slots: (0..cfg.max_batch).rev().collect(),
        cfg,
        status: status.clone(),
        banners,
        engaged,
        faults,
        waiting: VecDeque::new(),
        running: Vec::new(),
        drain: None,
        tokens_generated: 0,
        stepped: false,
    };
    std::thread::Builder::new()
        .name("tt-engine".into())
        .spawn(move || {
            // A dead engine thread would leave a worker that answers RPCs but
            // never generates; die instead, so the daemon sees it and restarts.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.run())).is_err() {
                eprintln!("tt-worker: the engine thread panicked; aborting");
                std::process::abort();
            }
        })?;
    Ok(EngineHandle {
        tx,
        status,
        capacity,
    })
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

impl Engine {
    fn run(mut self) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                if let Some((_, done, report)) = self.drain.take() {
                    let _ = done.send(report);
                }
                // Idle: block until there is work.
                match self.rx.recv() {
                    Ok(cmd) => self.command(cmd),
                    Err(_) => return,
                }
            }
            while let Ok(cmd) = self.rx.try_recv() {
                self.command(cmd);
            }
            self.reap_cancelled();
            self.enforce_drain_deadline();
            self.admit();
            self.publish_counts();
            if self.running.is_empty() {
                continue;
            }
            self.step();
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(sub) => {
                tracing::debug!(request_id = %sub.request_id, prompt = sub.prompt.len(), "queued");
                self.waiting.push_back(sub);
            }
            Command::Drain { deadline, done } => {
                self.drain = Some((deadline, done, DrainReport::default()));
            }
        }
    }

    fn release(&mut self) {
        self.status.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn reap_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].sub.events.is_closed() {
                let seq = self.running.swap_remove(i);
                tracing::debug!(request_id = %seq.sub.request_id, "client went away; cancelled");
                self.free_slots.push(seq.slot);
                self.release();
            } else {
                i += 1;
            }
        }
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.events.is_closed());
        for _ in self.waiting.len()..before {
            self.release();
        }
    }

    fn enforce_drain_deadline(&mut self) {
        let Some((deadline, _, _)) = &self.drain else {
            return;
        };
        if Instant::now() < *deadline {
            return;
        }
        let running = std::mem::take(&mut self.running);
        for seq in running {
            self.free_slots.push(seq.slot);
            self.finish_seq(seq, Finish::Cancelled, String::new());
        }
        while let Some(sub) = self.waiting.pop_front() {
            let now = Instant::now();
            let seq = self.make_seq(sub, usize::MAX, now);
            self.finish_seq(seq, Finish::Cancelled, String::new());
        }
    }

    fn make_seq(&self, sub: Submission, slot: usize, now: Instant) -> Seq {
        let sampler = Sampler::new(sub.sampling);
        let text = OutputText::new(sub.stop.clone());
        let history = History::new(sub.params.penalties, &sub.prompt);
        Seq {
            sub,
            slot,
            fed: 0,
            generated: Vec::new(),
            sampler,
            history,
            text,
            admitted: now,
            first_token: None,
        }
    }

    fn admit(&mut self) {
        while !self.free_slots.is_empty() {
            let Some(sub) = self.waiting.pop_front() else {
                break;
            };
            let slot = self.free_slots.pop().unwrap_or_default();
            let seq = self.make_seq(sub, slot, Instant::now());
            self.running.push(seq);
        }
    }

    fn publish_counts(&self) {
        self.status
            .active
            .store(self.running.len() as u32, Ordering::Release);
        self.publish_prefill();
    }

    /// Publish (and return) the prompt tokens the batch has still to feed.
    fn publish_prefill(&self) -> usize {
        let pending: usize = self
            .running
            .iter()
            .filter(|s| s.prefilling())
            .map(|s| s.sub.prompt.len() - s.fed)
            .sum();
        self.status
            .prefill_tokens
            .store(pending as u64, Ordering::Release);
        pending
    }

    fn step(&mut self) {
        let decoding = self.running.iter().any(|s| !s.prefilling());
        let mut budget = if decoding {
            self.cfg.prefill_chunk
        } else {
            self.cfg.prefill_chunk_idle
        };
        let mut batch = Vec::with_capacity(self.running.len());
        // Index into `running` of each batch entry.
        let mut members = Vec::with_capacity(self.running.len());
        for (i, s) in self.running.iter().enumerate() {
            if s.prefilling() {
                if budget == 0 {
                    continue;
                }
                let n = budget.min(s.sub.prompt.len() - s.fed);
                budget -= n;
                batch.push(StepSeq {
                    slot: s.slot,
                    start_pos: s.fed,
                    tokens: s.sub.prompt[s.fed..s.fed + n].to_vec(),
                    want_logits: s.fed + n == s.sub.prompt.len(),
                });
            } else {
                let last = s.generated.last().copied().unwrap_or_default();
                batch.push(StepSeq {
                    slot: s.slot,
                    start_pos: s.fed,
                    tokens: vec![last],
                    want_logits: true,
                });
            }
            members.push(i);
        }
        let fed: Vec<(usize, usize, bool)> = batch
            .iter()
            .zip(&members)
            .map(|(b, &i)| (i, b.tokens.len(), b.want_logits))
            .collect();

        let pending = self.publish_prefill();
        if let Some(ms) = self.faults.prefill_stall_ms.filter(|_| pending > 0) {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let logits = match self.ranks.step(batch) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("forward step failed: {e}");
                for seq in std::mem::take(&mut self.running) {
                    let _ = seq.sub.events.send(Event::Error(e.to_string()));
                    self.free_slots.push(seq.slot);
                    self.release();
                }
                return;
            }
        };
        self.status
            .last_step_unix_ms
            .store(unix_ms(), Ordering::Release);
        if !self.stepped {
            self.stepped = true;
            // The features behind these flags ran in this step: say so now,
            // and only now (a banner before the first step would be a claim).
            for flag in &self.engaged.flags {
                self.banners.engage(flag);
            }
            if let Some(extra) = &self.faults.extra_banner {
                self.banners.engage(extra);
            }
        }

        let mut rows = logits.into_iter();
        let mut done = Vec::new();
        for (i, n, want) in fed {
            self.running[i].fed += n;
            if !want {
                continue;
            }
            let Some(mut row) = rows.next() else {
                break;
            };
            if let Some(reason) = self.on_logits(i, &mut row) {
                done.push((i, reason));
            }
        }
        // Remove from the back so earlier indices stay valid.
        done.sort_by_key(|d| std::cmp::Reverse(d.0));
        for (i, (reason, rest)) in done {
            let seq = self.running.swap_remove(i);
            self.free_slots.push(seq.slot);
            self.finish_seq(seq, reason, rest);
        }
        self.publish_counts();
    }

    /// Samples the next token of `running[i]`; returns why it ended, if it
    /// did, with the text still to send. The penalties and suppressions
    /// change the logits first (greedy too); logprobs are read from them
    /// before temperature, top-k and top-p.
    fn on_logits(&mut self, i: usize, logits: &mut [f32]) -> Option<(Finish, String)> {
        let tokenizer = self.tokenizer.clone();
        let seq = &mut self.running[i];
        let params = &seq.sub.params;
        seq.history.apply(logits);
        let early = seq.generated.len() < params.min_tokens;
        if params.ignore_eos || early {
            sampling::suppress(
                logits,
                tokenizer
                    .end_of_generation_ids()
                    .into_iter()
                    .filter(|t| early || !params.stop_token_ids.contains(t)),
            );
        }
        if early {
            sampling::suppress(logits, params.stop_token_ids.iter().copied());
        }
        let dist = params.logprobs.map(|n| Logprobs::new(logits, n));
        let tok = seq.sampler.sample(logits);
        let logprobs: Vec<TokenLogprob> = dist
            .map(|d| TokenLogprob {
                token: tok,
                logprob: d.of(logits, tok),
                top: d.top().to_vec(),
            })
            .into_iter()
            .collect();
        seq.history.push(tok);
        self.count_token();
        let ctx = self.cfg.context;
        let seq = &mut self.running[i];
        let now = Instant::now();
        seq.first_token.get_or_insert(now);
        seq.generated.push(tok);
        if tokenizer.is_end_of_generation(tok) || seq.sub.params.stop_token_ids.contains(&tok) {
            let _ = seq.sub.events.send(Event::Delta {
                text: String::new(),
                ids: vec![tok],
                logprobs,
            });
            return Some((Finish::Stop, seq.text.finish()));
        }
        match seq.text.push(tokenizer.token_bytes(tok)) {
            Pushed::Stopped(text) => {
                let _ = seq.sub.events.send(Event::Delta {
                    text,
                    ids: vec![tok],
                    logprobs,
                });
                return Some((Finish::Stop, String::new()));
            }
            Pushed::Text(text) => {
                let _ = seq.sub.events.send(Event::Delta {
                    text,
                    ids: vec![tok],
                    logprobs,
                });
            }
        }
        let total = seq.sub.prompt.len() + seq.generated.len();
        if seq.generated.len() >= seq.sub.max_tokens || total >= ctx {
            return Some((Finish::Length, seq.text.finish()));
        }
        None
    }

    fn count_token(&mut self) {
        self.tokens_generated += 1;
        let n = self.tokens_generated;
        if self.faults.crash_after_tokens.is_some_and(|c| n >= c) {
            eprintln!("tt-worker: test fault TTW_FAULT_CRASH_AFTER_TOKENS reached after {n} tokens; aborting");
            std::process::abort();
        }
        if self.faults.hang_after_tokens.is_some_and(|h| n >= h) {
            eprintln!("tt-worker: test fault TTW_FAULT_HANG_AFTER_TOKENS reached after {n} tokens; hanging");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }

    fn finish_seq(&mut self, mut seq: Seq, reason: Finish, rest: String) {
        if !rest.is_empty() {
            let _ = seq.sub.events.send(Event::Delta {
                text: rest,
                ids: Vec::new(),
                logprobs: Vec::new(),
            });
        }
        let now = Instant::now();
        let first = seq.first_token;
        let info = FinalInfo {
            reason,
            prompt_tokens: seq.sub.prompt.len() as u32,
            completion_tokens: seq.generated.len() as u32,
            queue_us: micros(seq.admitted.saturating_duration_since(seq.sub.arrived)),
            prefill_us: first.map_or(0, |f| micros(f - seq.admitted)),
            decode_us: first.map_or(0, |f| micros(now - f)),
            ttft_us: first.map_or(0, |f| micros(f - seq.sub.arrived)),
            cached_prompt_tokens: 0,
        };
        tracing::debug!(request_id = %seq.sub.request_id, ?reason, tokens = info.completion_tokens, "finished");
        let _ = seq.sub.events.send(Event::Final(info));
        seq.text = OutputText::default();
        if let Some((_, _, report)) = &mut self.drain {
            if reason == Finish::Cancelled {
                report.cancelled += 1;
            } else {
                report.finished += 1;
            }
        }
        self.release();
    }
}
