//! Routing client inference to slots.
//!
//! Validation first (unknown model: NOT_FOUND listing the known ones; bad
//! fields, and prompts or `max_tokens` beyond `[limits]`: INVALID_ARGUMENT
//! naming the field and the limit), then admission through the
//! model's bounded queue (full: RESOURCE_EXHAUSTED with a retry hint, never
//! an unbounded wait), then a Ready slot: with several, the one that most
//! likely holds the request's prefix in its engine's cache, within a load
//! bound (`affinity.rs`; the model's `prefix_affinity`), else the
//! least-loaded. The chosen slot's engine must list every optional
//! parameter the request sets (else INVALID_ARGUMENT naming the parameter
//! and the engine). The worker's stream
//! is forwarded chunk by chunk; a client that goes away drops the worker
//! stream, which cancels the sequence in the worker at once; a worker that
//! dies mid-stream ends the client's stream with UNAVAILABLE saying so.
//!
//! A model with no Ready slot but one on its way back (restarting after a
//! crash or kill) keeps the request in its queue until a slot is Ready, up
//! to the model's `recovery_wait_secs` and never past the request's
//! deadline, so that one outage costs clients a delay rather than a burst
//! of failures. A request that cannot wait (the wait is off, the recovery
//! is expected to outlast what it may wait, or nothing is on its way back)
//! gets UNAVAILABLE at once. An UNAVAILABLE carries a [`RetryHint`] from
//! the recovery's progress (none while a slot is draining or stopped: a
//! restart may follow, or not).

mod affinity;
mod buffer;
mod error;
mod keys;
mod queue;
mod relay;
mod validate;

pub use buffer::{buffer, Buffered, Client, Item};
pub use error::{Outcome, RouteError};
pub use relay::ChunkStream;
#[cfg(any(test, feature = "fuzzing"))]
pub use validate::CHAT_ROLES;
pub use validate::{check_engines, validate_request};

use crate::config::ModelConfig;
use crate::retry::RetryHint;
use crate::slots::{Availability, Candidate, SlotManager};
use crate::usage::KeyName;
use affinity::{Key, Placement, Ring};
use queue::{Queue, Ticket};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tt_serving_proto::v1 as pb;
use tt_serving_telemetry::{attr, Attribute, Kind, Span};

/// Routes requests; one per daemon.
pub struct Router {
    slots: Arc<SlotManager>,
    /// Per model: its queue (`queue.rs`: priority, then keys in turn).
    queues: std::sync::Mutex<BTreeMap<String, Arc<Queue>>>,
    /// Per model: the consistent-hash ring of its replicas (prefix
    /// affinity), grown as replicas are met.
    rings: std::sync::Mutex<BTreeMap<String, Ring>>,
    next_id: AtomicU64,
}

/// Decrements a slot's in-flight count when the request ends, however it
/// ends, and tells the model's queue how long the place was held.
struct InFlight {
    counter: Arc<std::sync::atomic::AtomicU32>,
    slots: Arc<SlotManager>,
    queue: Arc<Queue>,
    since: Instant,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::Relaxed);
        self.queue.held(self.since.elapsed());
        self.slots.changed.notify_waiters();
    }
}

impl Router {
    /// A router over these slots.
    pub fn new(slots: Arc<SlotManager>) -> Router {
        let router = Router {
            slots,
            queues: std::sync::Mutex::new(BTreeMap::new()),
            rings: std::sync::Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
        };
        router.sync_queues();
        router
    }

    /// Make the queues match the config in force (after a reload): a model
    /// whose `max_queue` changed keeps its queue with the new capacity
    /// (requests waiting keep their places and order), removed models lose
    /// theirs (and their rings; their waiting requests keep the old queue
    /// until they end).
    pub fn sync_queues(&self) {
        let config = self.slots.config();
        self.rings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| config.models.contains_key(name));
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.retain(|name, _| config.models.contains_key(name));
        for (name, m) in &config.models {
            queues
                .entry(name.clone())
                .or_insert_with(|| Queue::new(m.max_queue))
                .set_capacity(m.max_queue);
        }
    }

    /// Requests waiting in each model's queue.
    pub fn waiting(&self) -> Vec<(String, u32)> {
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues
            .iter()
            .map(|(model, queue)| (model.clone(), queue.len()))
            .collect()
    }

    /// Requests waiting in each model's queue by priority (only the
    /// priorities some request waits at).
    pub fn waiting_by_priority(&self) -> Vec<(String, i32, u32)> {
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues
            .iter()
            .flat_map(|(model, queue)| {
                queue
                    .waiting()
                    .into_iter()
                    .map(|(priority, n)| (model.clone(), priority, n))
            })
            .collect()
    }

    fn queue(&self, model: &str) -> Option<Arc<Queue>> {
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.get(model).cloned()
    }

    /// UNAVAILABLE for a model without a Ready slot: each slot's state and
    /// for how long, why the request does not wait (longer), and the retry
    /// hint.
    fn not_ready(
        &self,
        model: &str,
        availability: Availability,
        why: Option<String>,
    ) -> RouteError {
        let states: Vec<String> = self
            .slots
            .snapshot()
            .into_iter()
            .filter(|s| s.model == model)
            .map(|s| {
                let since = s.since.elapsed().map(|d| d.as_secs()).unwrap_or(0);
                // The state, not its reason: the reason holds host paths and
                // tools' output, and this message reaches anyone who may
                // send a request; `ttctl status` shows it.
                format!("slot {} is {:?} for {since}s", s.name, s.state)
            })
            .collect();
        let mut message = format!(
            "model `{model}` has no ready slot ({}; `ttctl status` shows why)",
            states.join("; ")
        );
        if let Some(why) = why {
            message = format!("{message}; {why}");
        }
        RouteError::unavailable(message, RetryHint::for_availability(availability))
    }

    /// What a request that found no free place does next: wait for a place
    /// on a Ready slot (until its deadline, as any queued request), wait for
    /// a recovering slot (until its deadline or `recovery_wait_secs` after
    /// it arrived, whichever comes first), or be refused with UNAVAILABLE.
    /// A recovery expected to end after the wait would is not waited for:
    /// the client learns at once, with the hint, instead of at its
    /// deadline.
    fn plan_wait(
        &self,
        model: &str,
        m: &ModelConfig,
        availability: Availability,
        arrived: tokio::time::Instant,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Wait, RouteError> {
        let eta = match availability {
            Availability::Ready => return Ok(Wait::ForPlace(deadline)),
            Availability::Stopped | Availability::Down => {
                return Err(self.not_ready(model, availability, None))
            }
            Availability::Retrying { .. } => {
                return Err(self.not_ready(
                    model,
                    availability,
                    Some("no slot has served yet and its start failed, so requests do not wait for the next attempt".into()),
                ))
            }
            Availability::Recovering { eta } => eta,
        };
        let refuse = |why: String| Err(self.not_ready(model, availability, Some(why)));
        if m.recovery_wait_secs == 0 {
            return refuse(
                "this model does not wait for recovering slots (recovery_wait_secs = 0)".into(),
            );
        }
        let now = tokio::time::Instant::now();
        let recovery_end = arrived + Duration::from_secs(m.recovery_wait_secs);
        if now >= recovery_end {
            return refuse(format!(
                "waited {:.1} s for a slot to recover (recovery_wait_secs = {})",
                now.duration_since(arrived).as_secs_f64(),
                m.recovery_wait_secs
            ));
        }
        let (end, bound) = match deadline {
            Some(d) if d < recovery_end => (d, "this request's deadline"),
            _ => (recovery_end, "recovery_wait_secs"),
        };
        if let Some(eta) = eta.filter(|eta| now + *eta > end) {
            return refuse(format!(
                "the first slot back is expected in about {:.1} s, after {bound} ({:.1} s from now)",
                eta.as_secs_f64(),
                end.saturating_duration_since(now).as_secs_f64()
            ));
        }
        Ok(Wait::ForRecovery(end))
    }

    /// Route one request and return the stream of chunks for the client.
    /// Every request is counted in the metrics by model (configured models
    /// only, so labels stay bounded) and outcome, and in the usage of the
    /// API key `key` it came with. `trace` is the door's span of it (empty
    /// while traces are off): the queue wait and the worker's call are its
    /// children, and it ends with the stream.
    pub async fn generate(
        &self,
        request: pb::GenerateRequest,
        timeout: Option<Duration>,
        key: KeyName,
        trace: Span,
    ) -> Result<ChunkStream, RouteError> {
        trace.set_with(|| {
            vec![
                Attribute::new(attr::MODEL, request.model.clone()),
                Attribute::new(attr::KEY, key.to_string()),
                Attribute::new(attr::PRIORITY, i64::from(request.priority)),
            ]
        });
        let model = crate::usage::model_label(&self.slots.config(), &request.model).to_string();
        // A client that goes away while its request waits for admission
        // (or gRPC's own deadline firing first) drops this future; the guard
        // still counts the request.
        let mut unanswered = Unanswered {
            model: &model,
            key: &key,
            arrived: Instant::now(),
            timeout,
            armed: true,
        };
        let result = self.admit(request, timeout, key.clone(), &trace).await;
        unanswered.armed = false;
        if let Err(e) = &result {
            crate::usage::request(&key, &model, e.outcome().label());
            trace.set(attr::OUTCOME, e.outcome().label());
            trace.fail(|| e.message().to_string());
        }
        result
    }

    /// Which of the candidates takes a request with this affinity key
    /// (None: affinity off for the model, or no key): the key's replica
    /// within the load bound, else the least-loaded one with room; with the
    /// placement to count when there was a choice.
    fn place(
        &self,
        model: &str,
        key: Option<Key>,
        candidates: &[Candidate<'_>],
        limit: u32,
    ) -> Option<(usize, Option<Placement>)> {
        let Some(key) = key.filter(|_| candidates.len() > 1) else {
            return affinity::least_loaded(candidates, limit).map(|i| (i, None));
        };
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let ring = rings.entry(model.to_string()).or_default();
        ring.add(candidates.iter().map(|c| c.slot));
        affinity::choose(ring, key, candidates, limit)
    }

    /// Wait (holding the request's queue place, `ticket`) until it is the
    /// queue's next and a Ready slot of the model has room, a recovering
    /// one is worth waiting for no longer, or the deadline passes; the
    /// slot's in-flight count is taken. Without a ticket (a request routed
    /// again after a replica refused it) it does not wait its turn.
    #[allow(clippy::too_many_arguments)]
    async fn route(
        &self,
        model: &str,
        m: &ModelConfig,
        key: Option<Key>,
        refused: &[String],
        started: tokio::time::Instant,
        deadline: Option<tokio::time::Instant>,
        ticket: Option<(&Queue, &Ticket)>,
    ) -> Result<(crate::slots::Route, Option<Placement>), RouteError> {
        // A place must come within the model's queue wait, if it sets one.
        let queue_end = (m.max_queue_wait_secs > 0)
            .then(|| started + Duration::from_secs(m.max_queue_wait_secs));
        loop {
            let notified = self.slots.changed.notified();
            // The head leaving (routed, refused, gone) makes another the
            // next: woken by the queue as by a slot change.
            let moved = ticket.map(|(queue, _)| queue.moved.notified());
            let notified = async move {
                match moved {
                    Some(moved) => {
                        tokio::select! {
                            () = notified => {}
                            () = moved => {}
                        }
                    }
                    None => notified.await,
                }
            };
            let mut placement = None;
            // Not its turn: another request is served first.
            let turn = ticket.is_none_or(|(_, t)| t.is_next());
            let picked = turn
                .then(|| {
                    self.slots.pick(model, |all| {
                        // Slots that refused this request are passed over while
                        // another can take it.
                        let (index, candidates): (Vec<usize>, Vec<Candidate<'_>>) = all
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| !refused.iter().any(|r| r == c.slot))
                            .map(|(i, c)| (i, *c))
                            .unzip();
                        let (index, candidates) = if candidates.is_empty() {
                            ((0..all.len()).collect(), all.to_vec())
                        } else {
                            (index, candidates)
                        };
                        let (chosen, how) = self.place(model, key, &candidates, m.max_in_flight)?;
                        placement = how;
                        index.get(chosen).copied()
                    })
                })
                .flatten();
            if let Some(route) = picked {
                return Ok((route, placement));
            }
            let availability = self.slots.availability(model, None);
            let wait = self.plan_wait(model, m, availability, started, deadline)?;
            let until = match wait {
                Wait::ForPlace(until) => earliest(until, queue_end),
                Wait::ForRecovery(until) => Some(until),
            };
            let Some(until) = until else {
                notified.await;
                continue;
            };
            // Woken by any slot change; at `until` the deadline has passed
            // or the queue wait is over (both below), or the recovery wait
            // is, which the next round's plan refuses, saying what the
            // request waited for.
            if tokio::time::timeout_at(until, notified).await.is_ok() {
                continue;
            }
            let now = tokio::time::Instant::now();
            if deadline.is_none_or(|d| now < d) {
                if matches!(wait, Wait::ForPlace(_)) && queue_end.is_some_and(|q| now >= q) {
                    return Err(RouteError::Overloaded {
                        message: format!(
                            "model `{model}` had no free place for this request within {} s (models.{model}.max_queue_wait_secs); its slots are saturated",
                            m.max_queue_wait_secs
                        ),
                        hint: Some(RetryHint::After(Duration::from_secs(1))),
                    });
                }
                continue;
            }
            return Err(match wait {
                Wait::ForPlace(_) => RouteError::Deadline {
                    message: format!(
                        "the deadline passed while waiting for a free slot of model `{model}`"
                    ),
                    hint: None,
                },
                Wait::ForRecovery(_) => RouteError::Deadline {
                    message: format!(
                        "the deadline passed while waiting for a slot of model `{model}` to recover"
                    ),
                    hint: RetryHint::for_availability(self.slots.availability(model, None)),
                },
            });
        }
    }

    async fn admit(
        &self,
        request: pb::GenerateRequest,
        timeout: Option<Duration>,
        caller: KeyName,
        trace: &Span,
    ) -> Result<ChunkStream, RouteError> {
        validate_request(&self.slots.config(), &request)?;
        // Fail closed: a priority more urgent than the key may ask is
        // refused, never clamped (the client would believe it was served
        // as asked).
        if request.priority < caller.min_priority() {
            // Requests without a token (the control socket's too) have no
            // line in the tokens file to change: only a key's may be lowered.
            let fix = if caller.as_str() == crate::usage::ANONYMOUS {
                "send the request with the token of a key whose min_priority allows it"
            } else {
                "ask the operator to lower the key's min_priority"
            };
            return Err(RouteError::Invalid(format!(
                "priority: {} is more urgent than key `{caller}` may ask (lower is sooner; its limit is min_priority={} in the daemon's inference.tokens_file); ask {} or more, or {fix}",
                request.priority,
                caller.min_priority(),
                caller.min_priority()
            )));
        }
        let arrived = Instant::now();
        let model = request.model.clone();
        let config = self.slots.config();
        let (Some(m), Some(queue)) = (config.models.get(&model), self.queue(&model)) else {
            // Removed by a reload between validation and here.
            return Err(RouteError::UnknownModel(format!(
                "unknown model `{model}`: a reload removed it"
            )));
        };
        let started = tokio::time::Instant::now();
        let deadline = timeout.map(|t| started + t);
        // Only a model given `replicas` has more than one.
        let key = if m.prefix_affinity && m.replicas.len() > 1 {
            Key::of(&request)
        } else {
            None
        };
        // Fail closed: a parameter no engine honours is refused, never
        // silently dropped; a `max_tokens` beyond the engine's context
        // unless `limits.max_tokens` bounds them all.
        let by_context = config.limits.max_tokens.is_none();
        // One read of the model's slots decides what is refused before the
        // request takes a place in the queue: one that could not wait
        // anyway (a request that waits for a recovery holds its place like
        // any other, so `max_queue` bounds the waiters too), and one that
        // no Ready replica's engine can serve as asked.
        let standing = self.slots.standing(&model);
        self.plan_wait(&model, m, standing.availability, started, deadline)?;
        check_engines(
            &request,
            standing.ready_engines.iter().map(|e| &**e),
            by_context,
        )?;
        // One key cannot take every place: over its cap it is refused at
        // once, never queued behind its own requests.
        let key_place = keys::take(&caller)?;
        shed(&model, m, &queue, &standing, request.priority, timeout)?;
        // Admission to routed: the wait in the model's queue (and for a
        // recovering slot), ended by the routing decision.
        let queued = trace.child("queue", Kind::Internal);
        let permit = queue.enter(request.priority, &caller).map_err(|full| {
            RouteError::QueueFull(format!(
                "model `{model}` has {} requests waiting, its limit (models.{model}.max_queue = {}); retry in a few seconds",
                full.capacity, full.capacity
            ))
        })?;
        // A replica that began draining between the pick and the call (a
        // rolling restart, a loan) refuses before doing anything, so the
        // request was not started: route it again, a few times at most,
        // passing over the replicas that refused while another can take it
        // (its affinity key would lead it straight back).
        let mut refused: Vec<String> = Vec::new();
        let mut permit = Some(permit);
        let (route, placement, guard, upstream, call) = loop {
            let ticket = permit.as_ref().map(|t| (&*queue, t));
            let (route, placement) = self
                .route(&model, m, key, &refused, started, deadline, ticket)
                .await?;
            // Routed: the request leaves the queue (a retry below routes it
            // again without taking a new place).
            drop(permit.take());
            queued.set_with(|| {
                let mut decided = vec![Attribute::new(attr::SLOT, route.slot.clone())];
                if let Some(p) = placement {
                    decided.push(Attribute::new(attr::AFFINITY, p.word()));
                }
                decided
            });
            queued.end();
            let guard = InFlight {
                counter: route.in_flight.clone(),
                slots: self.slots.clone(),
                queue: queue.clone(),
                since: Instant::now(),
            };
            // Replicas may run different engines: the chosen one decides.
            check_engines(&request, [&*route.engine_facts], by_context)?;
            let engine_request = pb::EngineGenerateRequest {
                request: Some(request.clone()),
                request_id: format!("req-{}", self.next_id.fetch_add(1, Ordering::Relaxed)),
            };
            // The worker's call, whose span the worker's own is a child of.
            let call = trace.child("worker generate", Kind::Client);
            call.set_with(|| {
                vec![
                    Attribute::new(attr::SLOT, route.slot.clone()),
                    Attribute::new(attr::REQUEST_ID, engine_request.request_id.clone()),
                ]
            });
            let mut engine_request = tonic::Request::new(engine_request);
            call.inject_grpc(engine_request.metadata_mut());
            match route.engine.clone().generate(engine_request).await {
                Ok(upstream) => break (route, placement, guard, upstream.into_inner(), call),
                Err(status) if status.code() == tonic::Code::Unavailable && refused.len() < 3 => {
                    call.fail(|| format!("refused before starting: {}", status.message()));
                    call.end();
                    refused.push(route.slot.clone());
                    tracing::debug!(slot = %route.slot, message = %status.message(), "worker refused a request before starting it; routing it again");
                }
                Err(status) => {
                    call.fail(|| status.message().to_string());
                    let slots = self.slots.clone();
                    return Err(worker_error(&route.slot, status, || {
                        lost_worker_hint(&slots, &model, &route.slot)
                    }));
                }
            }
        };
        if let Some(placement) = placement {
            crate::metrics::get().affinity_routed(&model, &route.slot, placement.word());
            route.stats.affinity(placement == Placement::Affine);
        }
        let queued_us = arrived.elapsed().as_micros() as u64;
        let host_sampling = validate::host_sampling(&request, &route.engine_facts);
        for parameter in &host_sampling {
            crate::metrics::get().host_sampling(&model, &route.slot, parameter);
        }
        Ok(ChunkStream::new(relay::Routed {
            upstream,
            deadline,
            guard,
            slots: self.slots.clone(),
            model,
            slot: route.slot.clone(),
            stats: route.stats.clone(),
            arrived,
            queued_us,
            host_sampling,
            key: caller,
            trace: trace.clone(),
            call,
            key_place,
        }))
    }
}

/// The earlier of two optional instants (None: no bound).
fn earliest(
    a: Option<tokio::time::Instant>,
    b: Option<tokio::time::Instant>,
) -> Option<tokio::time::Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Refuse at once a request that the model is not expected to start
/// within its deadline or the model's `max_queue_wait_secs`: overload is
/// answered, with when to come back, rather than held until the client
/// gives up. The expected wait is the departures it must wait for (those
/// ahead of it in the queue, and itself, beyond the free places) at the
/// pace the places free: `places` at a time, each held about as long as
/// requests of the model held theirs lately. Before any request ended
/// nothing is known, and nothing is refused.
fn shed(
    model: &str,
    m: &ModelConfig,
    queue: &Queue,
    standing: &crate::slots::Standing,
    priority: i32,
    timeout: Option<Duration>,
) -> Result<(), RouteError> {
    let places = u32::try_from(standing.ready_engines.len())
        .unwrap_or(u32::MAX)
        .saturating_mul(m.max_in_flight);
    let Some(hold) = queue.hold().filter(|_| places > 0) else {
        return Ok(());
    };
    let ahead = queue.ahead_of(priority);
    let need = (ahead + standing.in_flight + 1).saturating_sub(places);
    if need == 0 {
        return Ok(());
    }
    let expected = hold.mul_f64(f64::from(need) / f64::from(places));
    let queue_wait =
        (m.max_queue_wait_secs > 0).then(|| Duration::from_secs(m.max_queue_wait_secs));
    let (bound, what) = match (timeout, queue_wait) {
        (Some(t), Some(q)) if q < t => (
            q,
            format!(
                "models.{model}.max_queue_wait_secs = {}",
                m.max_queue_wait_secs
            ),
        ),
        (Some(t), _) => (t, format!("this request's deadline ({} ms)", t.as_millis())),
        (None, Some(q)) => (
            q,
            format!(
                "models.{model}.max_queue_wait_secs = {}",
                m.max_queue_wait_secs
            ),
        ),
        (None, None) => return Ok(()),
    };
    if expected <= bound {
        return Ok(());
    }
    Err(RouteError::Overloaded {
        message: format!(
            "model `{model}` is not expected to start this request for about {:.1} s ({ahead} waiting ahead of it, {} running on {places} places, each held about {:.1} s lately), past {what}",
            expected.as_secs_f64(),
            standing.in_flight,
            hold.as_secs_f64()
        ),
        hint: Some(RetryHint::After(expected)),
    })
}

/// Counts a request whose admission never finished because its future was
/// dropped: the client went away (`cancelled`) or gRPC's deadline fired
/// first (`deadline`).
struct Unanswered<'a> {
    model: &'a str,
    key: &'a KeyName,
    arrived: Instant,
    timeout: Option<Duration>,
    armed: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            // gRPC's timer started a moment before `arrived`; a request
            // dropped that close to its deadline was ended by it.
            let margin = Duration::from_millis(250);
            let outcome = if self
                .timeout
                .is_some_and(|t| self.arrived.elapsed() + margin >= t)
            {
                "deadline"
            } else {
                "cancelled"
            };
            crate::usage::request(self.key, self.model, outcome);
        }
    }
}

/// What a request that found no free place waits for, and until when.
enum Wait {
    /// A place on a Ready slot, until the deadline (None: none given).
    ForPlace(Option<tokio::time::Instant>),
    /// A recovering slot to be Ready, until the deadline or the model's
    /// recovery wait, whichever comes first.
    ForRecovery(tokio::time::Instant),
}

/// Map a worker's error for the client. The worker's own validation and
/// admission answers pass through; anything else means the worker died,
/// and `hint` (see [`lost_worker_hint`]) says when to retry. CANCELLED is
/// among the latter: the worker never cancels a request itself (the daemon
/// cancels by dropping the stream, and then reads no status), but the
/// transport reports a connection that closed under a request as
/// "operation was canceled", which the client must not take for its own
/// cancellation.
fn worker_error(
    slot: &str,
    status: tonic::Status,
    hint: impl FnOnce() -> Option<RetryHint>,
) -> RouteError {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument | Code::ResourceExhausted | Code::DeadlineExceeded => {
            RouteError::Worker {
                code: status.code(),
                message: status.message().to_string(),
            }
        }
        _ => RouteError::unavailable(
            format!(
                "the worker of slot {slot} failed mid-request ({}: {}); the slot is recovering",
                status.code(),
                status.message()
            ),
            hint(),
        ),
    }
}

/// The hint after a worker died under a request: its slot counts as
/// recovering even while it still shows Ready (its supervisor has not
/// noticed yet).
fn lost_worker_hint(slots: &SlotManager, model: &str, slot: &str) -> Option<RetryHint> {
    RetryHint::for_availability(slots.availability(model, Some(slot)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_closed_under_a_request_is_unavailable_not_the_clients_cancel() {
        // What hyper reports when the worker's connection closes before its
        // answer: the client must see UNAVAILABLE, with the hint.
        let hint = Some(RetryHint::After(Duration::from_millis(700)));
        let lost = worker_error(
            "m",
            tonic::Status::cancelled("operation was canceled: connection closed"),
            || hint,
        );
        assert!(matches!(lost, RouteError::Unavailable { .. }), "{lost:?}");
        assert!(lost.message().contains("slot m"), "{lost:?}");
        assert_eq!(lost.hint(), hint);
        // The worker's own answers pass through untouched.
        let own = worker_error(
            "m",
            tonic::Status::invalid_argument("max_tokens: too many"),
            || hint,
        );
        assert!(
            matches!(
                own,
                RouteError::Worker {
                    code: tonic::Code::InvalidArgument,
                    ..
                }
            ),
            "{own:?}"
        );
        assert_eq!(own.hint(), None);
    }
}
