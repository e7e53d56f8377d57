//! Continuous batching: one engine thread decodes every active sequence
//! together, one batched step per token.
//!
//! Each step stacks the last token of every decoding sequence with a bounded
//! chunk of any prompt still being prefilled, so a long new prompt delays the
//! running streams by at most one chunk per step instead of its whole length.
//! New sequences join between steps; finished or cancelled ones (the client
//! dropped its stream) leave at once and give back their KV blocks.
//!
//! KV memory is one pool of blocks ([`crate::kv`]) under a budget. A new
//! sequence first takes the blocks of the longest cached prefix of its
//! prompt and computes only the rest. It is admitted when the pool has
//! room for the rest of its prompt; while decoding, blocks are taken as
//! positions fill. When the pool runs out mid-step, the most recently
//! admitted sequence is preempted: its blocks go back (the full ones stay
//! cached), and it waits at the head of the queue to be recomputed, so the
//! oldest sequences always make progress and nothing is refused for memory
//! a finished sequence will give back.
//!
//! Admission is bounded: at most `max_batch` sequences in the batch and
//! `max_queue` waiting; beyond that [`EngineHandle::submit`] refuses, which
//! the server answers with `RESOURCE_EXHAUSTED`.

use crate::banners::Banners;
use crate::faults::Faults;
use crate::kv::{self, BlockPool, BLOCK_TOKENS};
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
    /// Sequences decoded together.
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
    /// The prompt's log-probabilities, one per prompt token (the first
    /// with logprob 0 and no alternatives): sent once, before any delta.
    Prompt(Vec<TokenLogprob>),
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
    /// `Some(n)`: report each prompt token's logprob and the n most likely
    /// (the prefix cache is not used for the prompt, whose every position
    /// is computed).
    pub prompt_logprobs: Option<usize>,
    /// Generate nothing: end after the prompt's logprobs.
    pub prompt_only: bool,
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
    Submit(Box<Submission>),
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
        self.tx.send(Command::Submit(Box::new(sub))).map_err(|_| {
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
    /// Admission order: the youngest is preempted first.
    order: u64,
    /// KV blocks: position `p` is in `blocks[p / BLOCK_TOKENS]`.
    blocks: Vec<u32>,
    /// A cached block the last of `blocks` is to start as a copy of (held
    /// until the copy is made, at this sequence's next step).
    copy_from: Option<kv::Copy>,
    /// Leading blocks already offered to the prefix cache.
    registered: usize,
    /// Prompt tokens the prefix cache supplied at the first admission.
    cached_prompt_tokens: usize,
    /// Tokens already in the KV cache.
    fed: usize,
    /// The prompt, then the generated tokens.
    tokens: Vec<u32>,
    generated: Vec<u32>,
    sampler: Sampler,
    /// What the penalties look at.
    history: History,
    text: OutputText,
    admitted: Instant,
    first_token: Option<Instant>,
    /// The prompt's logprobs gathered so far (the request asked for them
    /// and they are not sent yet).
    prompt_logprobs: Option<Vec<TokenLogprob>>,
}

impl Seq {
    /// Whether this step's rows of the prompt must all be computed: the
    /// prompt's logprobs are asked for, not sent yet, and `fed` is still
    /// inside the prompt.
    fn collects_prompt(&self) -> bool {
        self.prompt_logprobs.is_some() && self.fed < self.sub.prompt.len()
    }

    /// The logprob of prompt token `pos` from the logits that predicted it,
    /// unless it was gathered before (a preempted sequence computes its
    /// prompt again).
    fn prompt_logprob(&mut self, pos: usize, logits: &[f32]) {
        let n = self.sub.params.prompt_logprobs.unwrap_or(0);
        let Some(gathered) = self.prompt_logprobs.as_mut() else {
            return;
        };
        let Some(&token) = self.sub.prompt.get(pos) else {
            return;
        };
        if gathered.len() != pos {
            return;
        }
        let dist = Logprobs::new(logits, n);
        gathered.push(TokenLogprob {
            token,
            logprob: dist.of(logits, token),
            top: dist.top().to_vec(),
        });
    }

    /// Once every prompt token has its logprob, send them (once).
    fn send_prompt_logprobs_when_complete(&mut self) {
        if self
            .prompt_logprobs
            .as_ref()
            .is_some_and(|g| g.len() == self.sub.prompt.len())
        {
            if let Some(all) = self.prompt_logprobs.take() {
                let _ = self.sub.events.send(Event::Prompt(all));
            }
        }
    }

    /// Positions to compute before the next decode step: the prompt, or
    /// after a preemption everything but the last sampled token.
    fn target(&self) -> usize {
        self.tokens.len() - usize::from(!self.generated.is_empty())
    }

    fn prefilling(&self) -> bool {
        self.fed < self.target()
    }

    /// Tokens whose KV a prefix-cache match may supply: at least one
    /// position must be computed for the logits that sample next.
    fn reusable(&self) -> &[u32] {
        &self.tokens[..self.target().min(self.tokens.len() - 1)]
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
    /// Preempted sequences, oldest first: admitted before `waiting`.
    preempted: VecDeque<Seq>,
    running: Vec<Seq>,
    pool: BlockPool,
    admissions: u64,
    drain: Option<(Instant, oneshot::Sender<DrainReport>, DrainReport)>,
    tokens_generated: u64,
    stepped: bool,
}

/// Starts the engine thread.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    ranks: Ranks,
    tokenizer: Arc<Tokenizer>,
    cfg: SchedulerConfig,
    pool: BlockPool,
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
        cfg,
        pool,
        admissions: 0,
        preempted: VecDeque::new(),
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
            if self.running.is_empty() && self.waiting.is_empty() && self.preempted.is_empty() {
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
            if self.faults.held() {
                // Test fault: no step while held, everything else as usual.
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            self.step();
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(sub) => {
                tracing::debug!(request_id = %sub.request_id, prompt = sub.prompt.len(), "queued");
                self.waiting.push_back(*sub);
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
                let mut seq = self.running.swap_remove(i);
                tracing::debug!(request_id = %seq.sub.request_id, "client went away; cancelled");
                self.give_back(&mut seq, true);
                self.release();
            } else {
                i += 1;
            }
        }
        let before = self.preempted.len();
        self.preempted.retain(|s| !s.sub.events.is_closed());
        for _ in self.preempted.len()..before {
            self.release();
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
        for mut seq in running {
            self.give_back(&mut seq, true);
            self.finish_seq(seq, Finish::Cancelled, String::new());
        }
        while let Some(seq) = self.preempted.pop_front() {
            self.finish_seq(seq, Finish::Cancelled, String::new());
        }
        while let Some(sub) = self.waiting.pop_front() {
            let now = Instant::now();
            let seq = self.make_seq(sub, now);
            self.finish_seq(seq, Finish::Cancelled, String::new());
        }
    }

    fn make_seq(&mut self, sub: Submission, now: Instant) -> Seq {
        let sampler = Sampler::new(sub.sampling);
        let text = OutputText::new(sub.stop.clone());
        let history = History::new(sub.params.penalties, &sub.prompt);
        // The first prompt token has nothing before it to be predicted from.
        let prompt_logprobs = sub.params.prompt_logprobs.map(|_| {
            vec![TokenLogprob {
                token: sub.prompt[0],
                logprob: 0.0,
                top: Vec::new(),
            }]
        });
        self.admissions += 1;
        Seq {
            tokens: sub.prompt.clone(),
            sub,
            order: self.admissions,
            blocks: Vec::new(),
            copy_from: None,
            registered: 0,
            cached_prompt_tokens: 0,
            fed: 0,
            generated: Vec::new(),
            sampler,
            history,
            text,
            admitted: now,
            first_token: None,
            prompt_logprobs,
        }
    }

    /// Moves waiting sequences into the batch while it has places and the
    /// pool has room for the part of their prompt the prefix cache does not
    /// hold; preempted sequences first, then in arrival order.
    fn admit(&mut self) {
        while self.running.len() < self.cfg.max_batch {
            let first_time = self.preempted.is_empty();
            let (prefix, fits) = {
                let tokens: &[u32] = match (self.preempted.front(), self.waiting.front()) {
                    // Every prompt position is computed for its logprobs.
                    (Some(seq), _) if seq.prompt_logprobs.is_some() => &[],
                    (Some(seq), _) => seq.reusable(),
                    (None, Some(sub)) if sub.params.prompt_logprobs.is_some() => &[],
                    (None, Some(sub)) => &sub.prompt[..sub.prompt.len() - 1],
                    (None, None) => break,
                };
                let target = tokens.len() + 1;
                let prefix = self.pool.match_prefix(tokens);
                let need = target.div_ceil(BLOCK_TOKENS) - prefix.blocks.len();
                // Headroom of a block per running sequence, so the next
                // steps' growth does not preempt the newcomer at once.
                (prefix, need + self.running.len() <= self.pool.available())
            };
            if !fits {
                // Running sequences will give blocks back.
                self.pool.release(&prefix.blocks);
                if let Some(copy) = prefix.copy {
                    self.pool.release(&[copy.from]);
                }
                break;
            }
            let mut seq = match self.preempted.pop_front() {
                Some(seq) => seq,
                None => match self.waiting.pop_front() {
                    Some(sub) => self.make_seq(sub, Instant::now()),
                    None => break,
                },
            };
            seq.registered = prefix.blocks.len();
            seq.fed = seq.registered * BLOCK_TOKENS;
            seq.blocks = prefix.blocks;
            // A match inside the next block: a block of its own, filled
            // from the cached one at the first step.
            if let Some(copy) = prefix.copy {
                match self.pool.allocate() {
                    Some(to) => {
                        seq.blocks.push(to);
                        seq.fed += copy.positions;
                        seq.copy_from = Some(copy);
                    }
                    None => self.pool.release(&[copy.from]),
                }
            }
            if first_time {
                seq.cached_prompt_tokens = seq.fed;
                if seq.fed > 0 {
                    tracing::debug!(request_id = %seq.sub.request_id, reused = seq.fed, prompt = seq.sub.prompt.len(), "prefix cache hit");
                }
            }
            self.running.push(seq);
        }
    }

    /// Gives every sequence of the plan the blocks its tokens of this step
    /// need, oldest sequence first. When the pool runs out, preempts the
    /// youngest running sequence and returns false (the plan is stale).
    fn grow_tables(&mut self, plan: &[(usize, usize)]) -> bool {
        let mut by_age: Vec<(usize, usize)> = plan.to_vec();
        by_age.sort_by_key(|&(i, _)| self.running[i].order);
        for (i, n) in by_age {
            let need = (self.running[i].fed + n).div_ceil(BLOCK_TOKENS);
            while self.running[i].blocks.len() < need {
                match self.pool.allocate() {
                    Some(id) => self.running[i].blocks.push(id),
                    None => {
                        self.preempt_youngest();
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Sends the most recently admitted running sequence back to wait: its
    /// blocks return to the pool (full ones stay cached, so its
    /// recomputation may find them), its output so far is kept.
    fn preempt_youngest(&mut self) {
        let Some(i) = (0..self.running.len()).max_by_key(|&i| self.running[i].order) else {
            return;
        };
        let mut seq = self.running.swap_remove(i);
        if self.running.is_empty() {
            // Alone and still out of blocks: the context fits the pool by
            // construction, so this is a bookkeeping bug; fail the request
            // rather than loop.
            tracing::error!(request_id = %seq.sub.request_id, "the KV pool cannot hold a single sequence");
            self.give_back(&mut seq, false);
            let _ = seq
                .sub
                .events
                .send(Event::Error("the KV pool cannot hold this sequence".into()));
            self.release();
            return;
        }
        tracing::info!(
            request_id = %seq.sub.request_id,
            positions = seq.fed,
            "KV pool full: preempted the most recent sequence; it will be recomputed"
        );
        self.give_back(&mut seq, true);
        seq.fed = 0;
        seq.registered = 0;
        let at = self
            .preempted
            .iter()
            .position(|p| p.order > seq.order)
            .unwrap_or(self.preempted.len());
        self.preempted.insert(at, seq);
    }

    /// Returns a sequence's blocks to the pool. With `keep_tail`, its
    /// part-filled last block is offered to the prefix cache first (its
    /// positions are computed and will not be written again), when every
    /// block before it is indexed.
    fn give_back(&mut self, seq: &mut Seq, keep_tail: bool) {
        if let Some(copy) = seq.copy_from.take() {
            // Never stepped: the block that was to hold the copy holds
            // nothing yet.
            self.pool.release(&[copy.from]);
        } else if keep_tail {
            let full = seq.fed / BLOCK_TOKENS;
            if !seq.fed.is_multiple_of(BLOCK_TOKENS)
                && seq.registered == full
                && full < seq.blocks.len()
            {
                let parent = full.checked_sub(1).map(|p| seq.blocks[p]);
                let tokens = &seq.tokens[full * BLOCK_TOKENS..seq.fed];
                self.pool.register_tail(parent, seq.blocks[full], tokens);
            }
        }
        self.pool.release(&seq.blocks);
        seq.blocks.clear();
    }

    /// Offers the blocks that filled up to the prefix cache. A block whose
    /// contents another sequence indexed first is swapped for that copy
    /// (full blocks are never written again, so this is safe between
    /// steps).
    fn register_full_blocks(&mut self, i: usize) {
        let seq = &mut self.running[i];
        let full = seq.fed / BLOCK_TOKENS;
        while seq.registered < full {
            let b = seq.registered;
            let parent = b.checked_sub(1).map(|p| seq.blocks[p]);
            let tokens = &seq.tokens[b * BLOCK_TOKENS..(b + 1) * BLOCK_TOKENS];
            match self.pool.register(parent, seq.blocks[b], tokens) {
                Some(held) => seq.blocks[b] = held,
                None => break,
            }
            seq.registered += 1;
        }
    }

    fn publish_counts(&self) {
        self.status
            .active
            .store(self.running.len() as u32, Ordering::Release);
        let kv = self.pool.stats();
        self.status
            .kv_blocks_in_use
            .store(kv.in_use, Ordering::Release);
        self.status
            .kv_blocks_cached
            .store(kv.cached, Ordering::Release);
        self.publish_prefill();
    }

    /// Publish (and return) the prompt tokens the batch has still to feed.
    fn publish_prefill(&self) -> usize {
        let pending: usize = self
            .running
            .iter()
            .filter(|s| s.prefilling())
            .map(|s| s.target() - s.fed)
            .sum();
        self.status
            .prefill_tokens
            .store(pending as u64, Ordering::Release);
        pending
    }

    /// What each running sequence feeds this step: `(index, tokens)`.
    /// Decoding sequences feed their last token; prefilling ones share the
    /// step's prefill budget in batch order.
    fn plan(&self) -> Vec<(usize, usize)> {
        let decoding = self.running.iter().any(|s| !s.prefilling());
        let mut budget = if decoding {
            self.cfg.prefill_chunk
        } else {
            self.cfg.prefill_chunk_idle
        };
        let mut plan = Vec::with_capacity(self.running.len());
        for (i, s) in self.running.iter().enumerate() {
            if s.prefilling() {
                if budget == 0 {
                    continue;
                }
                let n = budget.min(s.target() - s.fed);
                budget -= n;
                plan.push((i, n));
            } else {
                plan.push((i, 1));
            }
        }
        plan
    }

    fn step(&mut self) {
        let plan = loop {
            let plan = self.plan();
            if self.grow_tables(&plan) {
                break plan;
            }
            if self.running.is_empty() {
                self.publish_counts();
                return;
            }
        };
        let mut batch = Vec::with_capacity(plan.len());
        for &(i, n) in &plan {
            let s = &self.running[i];
            batch.push(StepSeq {
                blocks: s.blocks.clone(),
                start_pos: s.fed,
                tokens: s.tokens[s.fed..s.fed + n].to_vec(),
                // The last prompt token, or a decode step (which, after a
                // preemption's recomputation, is the first step that samples).
                want_logits: s.fed + n == s.tokens.len(),
                all_logits: s.collects_prompt(),
                copy_from: s.copy_from.map(|c| c.from),
            });
        }
        let fed: Vec<(usize, usize, bool, bool)> = batch
            .iter()
            .zip(&plan)
            .map(|(b, &(i, _))| (i, b.tokens.len(), b.want_logits, b.all_logits))
            .collect();

        let pending = self.publish_prefill();
        if let Some(ms) = self.faults.prefill_stall_ms.filter(|_| pending > 0) {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let logits = match self.ranks.step(batch) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("forward step failed: {e}");
                for mut seq in std::mem::take(&mut self.running) {
                    let _ = seq.sub.events.send(Event::Error(e.to_string()));
                    self.give_back(&mut seq, false);
                    self.release();
                }
                return;
            }
        };
        // The copies are made: their sources go back to the cache.
        for &(i, _) in &plan {
            if let Some(copy) = self.running[i].copy_from.take() {
                self.pool.release(&[copy.from]);
            }
        }
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
        for (i, n, want, all) in fed {
            let start = self.running[i].fed;
            self.running[i].fed += n;
            self.register_full_blocks(i);
            if all {
                // Row j predicts the token after position start + j.
                for j in 0..n.saturating_sub(usize::from(want)) {
                    let Some(row) = rows.next() else {
                        break;
                    };
                    self.running[i].prompt_logprob(start + j + 1, &row);
                }
                self.running[i].send_prompt_logprobs_when_complete();
            }
            if !want {
                continue;
            }
            let Some(mut row) = rows.next() else {
                break;
            };
            // The last prompt row predicts the first output token: with
            // `prompt_only` there is none.
            if all && self.running[i].sub.params.prompt_only {
                done.push((i, (Finish::Length, String::new())));
                continue;
            }
            if let Some(reason) = self.on_logits(i, &mut row) {
                done.push((i, reason));
            }
        }
        // Remove from the back so earlier indices stay valid.
        done.sort_by_key(|d| std::cmp::Reverse(d.0));
        for (i, (reason, rest)) in done {
            let mut seq = self.running.swap_remove(i);
            self.give_back(&mut seq, true);
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
        seq.tokens.push(tok);
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
        // Health must already count this sequence's blocks as given back
        // when its client sees the end.
        self.publish_counts();
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
            cached_prompt_tokens: seq.cached_prompt_tokens as u32,
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
