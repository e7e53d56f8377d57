//! One routed request's stream: the worker's chunks passed to the client as
//! the client's connection pulls them, counted on the way (time to first
//! token, inter-token gaps, usage, the slot's statistics), with the
//! request's deadline, and its outcome recorded once when it ends or is
//! dropped.
//!
//! A stream rather than a task with a channel: the connection that sends
//! the chunks polls the worker's stream itself, so a token costs no task
//! wake-up and no channel hop in the daemon (bench/cpu measures it). When
//! the client goes away its connection drops this stream, which drops the
//! worker's and cancels the sequence there.

use super::error::Outcome;
use super::{lost_worker_hint, worker_error, InFlight, RouteError};
use crate::metrics::{InterToken, Metrics};
use crate::slots::stats::SlotStats;
use crate::slots::SlotManager;
use crate::usage::KeyName;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio_stream::Stream;
use tt_serving_proto::v1 as pb;
use tt_serving_telemetry::{attr, Span};

/// See the module doc.
pub struct ChunkStream {
    upstream: tonic::Streaming<pb::GenerateResponse>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    _guard: InFlight,
    slots: Arc<SlotManager>,
    model: String,
    slot: String,
    stats: Arc<SlotStats>,
    metrics: &'static Metrics,
    inter_token: InterToken,
    arrived: Instant,
    queued_us: u64,
    last_tokens: Option<Instant>,
    /// The parameters of the request that its engine honours on the host
    /// sampling path (Engine.Info host_sampling_parameters).
    host_sampling: Vec<&'static str>,
    /// The final chunk went to the client: the request was answered.
    finished: bool,
    /// How it ended, once it has; recorded in the metrics on drop.
    outcome: Option<Outcome>,
    /// The API key it is counted under.
    key: KeyName,
    /// The door's span of the request and the span of the worker's call
    /// (both empty while traces are off).
    trace: Span,
    call: Span,
    /// The request's place among its key's `max_in_flight`.
    _key_place: Option<super::keys::KeyPlace>,
}

/// What `ChunkStream::new` needs of the routing.
pub(super) struct Routed {
    pub upstream: tonic::Streaming<pb::GenerateResponse>,
    pub deadline: Option<tokio::time::Instant>,
    pub guard: InFlight,
    pub slots: Arc<SlotManager>,
    pub model: String,
    pub slot: String,
    pub stats: Arc<SlotStats>,
    pub arrived: Instant,
    pub queued_us: u64,
    pub host_sampling: Vec<&'static str>,
    pub key: KeyName,
    pub trace: Span,
    pub call: Span,
    pub key_place: Option<super::keys::KeyPlace>,
}

impl ChunkStream {
    pub(super) fn new(r: Routed) -> ChunkStream {
        let metrics = crate::metrics::get();
        ChunkStream {
            upstream: r.upstream,
            deadline: r.deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
            _guard: r.guard,
            inter_token: metrics.inter_token(&r.model),
            slots: r.slots,
            model: r.model,
            slot: r.slot,
            stats: r.stats,
            metrics,
            arrived: r.arrived,
            queued_us: r.queued_us,
            host_sampling: r.host_sampling,
            last_tokens: None,
            finished: false,
            outcome: None,
            key: r.key,
            trace: r.trace,
            call: r.call,
            _key_place: r.key_place,
        }
    }

    /// The model it was routed to.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// End it here with `outcome` (it is dropped next), unless it was
    /// answered already.
    pub fn end_as(&mut self, outcome: Outcome) {
        if !self.finished && self.outcome.is_none() {
            self.outcome = Some(outcome);
        }
    }

    /// The parameters of this request that put it on its engine's host
    /// sampling path (empty: none did).
    pub fn host_sampling(&self) -> &[&'static str] {
        &self.host_sampling
    }

    /// Counts a chunk on its way to the client.
    fn account(&mut self, chunk: &mut pb::GenerateResponse) {
        match chunk.chunk.as_mut() {
            Some(pb::generate_response::Chunk::Delta(d)) => {
                let now = Instant::now();
                let n = d.token_ids.len().max(1);
                match self.last_tokens {
                    None => {
                        self.call.first_token();
                        self.metrics
                            .first_token(&self.model, self.arrived.elapsed());
                        self.stats.first_token(self.arrived.elapsed());
                        self.stats.tokens(None, n);
                    }
                    Some(previous) => {
                        self.inter_token.observe(now - previous, n);
                        self.stats.tokens(Some(now - previous), n);
                    }
                }
                self.last_tokens = Some(now);
            }
            // Passed on as it is: no tokens were generated.
            Some(pb::generate_response::Chunk::PromptLogprobs(_)) => {}
            Some(pb::generate_response::Chunk::Final(f)) => {
                f.slot = self.slot.clone();
                if let Some(t) = f.timings.as_mut() {
                    t.queue_us += self.queued_us;
                }
                let usage = f.usage.unwrap_or_default();
                // An engine cannot reuse more than the prompt; a count
                // that says so would put the hit rate over 100%.
                let cached = f
                    .timings
                    .map_or(0, |t| t.cached_prompt_tokens)
                    .min(usage.prompt_tokens);
                self.metrics
                    .tokens(&self.model, usage.prompt_tokens, usage.completion_tokens);
                self.metrics
                    .prefix_cache(&self.model, &self.slot, usage.prompt_tokens, cached);
                crate::usage::tokens(
                    &self.key,
                    &self.model,
                    usage.prompt_tokens,
                    cached,
                    usage.completion_tokens,
                );
                self.stats.prompt(usage.prompt_tokens, cached);
                if self.call.is_recording() {
                    let finish = tt_serving_proto::finish_reason_name(f.finish_reason());
                    self.call.last_token(
                        finish,
                        usage.prompt_tokens,
                        cached,
                        usage.completion_tokens,
                    );
                    self.trace.set(attr::SLOT, self.slot.clone());
                    self.trace
                        .counts(finish, usage.prompt_tokens, cached, usage.completion_tokens);
                }
                self.metrics.end_to_end(&self.model, self.arrived.elapsed());
                self.stats.finished();
                self.finished = true;
            }
            None => {}
        }
    }
}

impl Stream for ChunkStream {
    type Item = Result<pb::GenerateResponse, RouteError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.outcome.is_some() {
            return Poll::Ready(None);
        }
        // The worker first: a chunk that is there when the deadline passes
        // still goes out.
        match Pin::new(&mut this.upstream).poll_next(cx) {
            Poll::Ready(Some(Ok(mut chunk))) => {
                this.account(&mut chunk);
                return Poll::Ready(Some(Ok(chunk)));
            }
            Poll::Ready(None) => {
                // Without its final chunk the stream ended early.
                this.outcome = Some(if this.finished {
                    Outcome::Ok
                } else {
                    Outcome::WorkerError
                });
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Err(status))) => {
                let (slots, model, slot) = (&this.slots, &this.model, &this.slot);
                let error = worker_error(slot, status, || lost_worker_hint(slots, model, slot));
                // Mid-stream, anything but a deadline is the worker's
                // failure, whatever the client is told.
                this.outcome = Some(match error.outcome() {
                    Outcome::Deadline => Outcome::Deadline,
                    _ => Outcome::WorkerError,
                });
                return Poll::Ready(Some(Err(error)));
            }
            Poll::Pending => {}
        }
        if let Some(deadline) = this.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                this.outcome = Some(Outcome::Deadline);
                return Poll::Ready(Some(Err(RouteError::Deadline {
                    message: "the request's deadline passed during generation".into(),
                    hint: None,
                })));
            }
        }
        Poll::Pending
    }
}

impl Drop for ChunkStream {
    fn drop(&mut self) {
        // Dropped before its end: the client went away (once it had the
        // final chunk, the request was answered).
        let outcome = self.outcome.unwrap_or(if self.finished {
            Outcome::Ok
        } else {
            Outcome::Cancelled
        });
        crate::usage::request(&self.key, &self.model, outcome.label());
        if self.trace.is_recording() {
            self.trace.set(attr::OUTCOME, outcome.label());
            if outcome != Outcome::Ok {
                self.call
                    .fail(|| format!("the request ended: {}", outcome.label()));
                self.trace
                    .fail(|| format!("the request ended: {}", outcome.label()));
            }
            self.call.end();
        }
    }
}
