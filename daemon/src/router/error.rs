//! Why the router could not serve a request, or why a stream it forwarded
//! ended early: a domain error, not a protocol's. Each front door maps it at
//! its edge (gRPC status codes and `grpc-retry-pushback-ms` in `api`; HTTP
//! statuses and `Retry-After` for an OpenAI-style door), so none has to
//! parse another's strings.

use crate::retry::RetryHint;

/// The router's errors. Every message names what was wrong and what to do;
/// client strings in it went through `echo` (bounded).
#[derive(Debug, Clone, PartialEq)]
pub enum RouteError {
    /// A request field is malformed or over a `[limits]` bound; the message
    /// starts with the field's name (`stop[1]: ...`).
    Invalid(String),
    /// No model by that name; the message lists the known ones.
    UnknownModel(String),
    /// The model's queue is full (`max_queue`).
    QueueFull(String),
    /// The request would wait longer for a place than it may (its deadline
    /// or the model's `max_queue_wait_secs`), or did: refused with when to
    /// try again.
    Overloaded {
        /// The wait expected or waited, and the bound.
        message: String,
        /// When a place is expected.
        hint: Option<RetryHint>,
    },
    /// The API key has as many requests admitted as its `max_in_flight`
    /// (the tokens file).
    KeyLimit(String),
    /// The client took nothing of its stream for its door's
    /// `write_timeout_secs` while the stream's buffer was full: the request
    /// was cancelled in its engine.
    ClientStalled(String),
    /// No slot can serve now (none Ready, the wait for a recovery is off or
    /// over, or a worker died under the request); with the retry hint.
    Unavailable {
        /// What happened, each slot's state.
        message: String,
        /// When to try again, if anything honest can be said.
        hint: Option<RetryHint>,
    },
    /// The request's deadline passed, waiting or generating.
    Deadline {
        /// Where the deadline caught it.
        message: String,
        /// When a recovering slot is expected, when it was waiting for one.
        hint: Option<RetryHint>,
    },
    /// The worker refused the request itself (its own validation or
    /// admission), passed through as it said it: the worker speaks gRPC
    /// (engine.proto), so its answer is a gRPC code.
    Worker {
        /// The worker's status code.
        code: tonic::Code,
        /// The worker's message.
        message: String,
    },
}

impl RouteError {
    /// UNAVAILABLE with a hint.
    pub fn unavailable(message: impl Into<String>, hint: Option<RetryHint>) -> RouteError {
        RouteError::Unavailable {
            message: message.into(),
            hint,
        }
    }

    /// The retry hint, if the error carries one.
    pub fn hint(&self) -> Option<RetryHint> {
        match self {
            RouteError::Unavailable { hint, .. }
            | RouteError::Deadline { hint, .. }
            | RouteError::Overloaded { hint, .. } => *hint,
            // A place of the key's frees when one of its requests ends.
            RouteError::KeyLimit(_) => Some(RetryHint::After(std::time::Duration::from_secs(1))),
            _ => None,
        }
    }

    /// The message a client reads: the hint's words follow it.
    pub fn message(&self) -> String {
        let (text, hint) = match self {
            RouteError::Invalid(m)
            | RouteError::UnknownModel(m)
            | RouteError::QueueFull(m)
            | RouteError::KeyLimit(m)
            | RouteError::ClientStalled(m) => (m.as_str(), None),
            RouteError::Unavailable { message, hint }
            | RouteError::Deadline { message, hint }
            | RouteError::Overloaded { message, hint } => (message.as_str(), *hint),
            RouteError::Worker { message, .. } => (message.as_str(), None),
        };
        match hint {
            Some(hint) => format!("{text}; {}", hint.describe()),
            None => text.to_string(),
        }
    }

    /// The request's outcome in the metrics (`tt_serving_requests_total`).
    pub fn outcome(&self) -> Outcome {
        match self {
            RouteError::Invalid(_) => Outcome::Invalid,
            RouteError::UnknownModel(_) => Outcome::UnknownModel,
            RouteError::QueueFull(_) => Outcome::QueueFull,
            RouteError::Overloaded { .. } => Outcome::Overloaded,
            RouteError::KeyLimit(_) => Outcome::KeyLimit,
            RouteError::ClientStalled(_) => Outcome::ClientStalled,
            RouteError::Unavailable { .. } => Outcome::Unavailable,
            RouteError::Deadline { .. } => Outcome::Deadline,
            RouteError::Worker { code, .. } => match code {
                tonic::Code::InvalidArgument => Outcome::Invalid,
                tonic::Code::ResourceExhausted => Outcome::QueueFull,
                tonic::Code::DeadlineExceeded => Outcome::Deadline,
                _ => Outcome::WorkerError,
            },
        }
    }
}

/// How a routed request ended, as `tt_serving_requests_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered to its final chunk.
    Ok,
    /// Refused as sent (by the router, or by its door before routing: a
    /// body that is not a request, a message over the size limit).
    Invalid,
    /// No such model.
    UnknownModel,
    /// The model's queue (or the worker's batch, or the gRPC connection's
    /// `limits.max_streams_per_connection`) was full: RESOURCE_EXHAUSTED.
    QueueFull,
    /// No Ready slot in time.
    Unavailable,
    /// The request's deadline passed.
    Deadline,
    /// The worker failed it or its stream ended early.
    WorkerError,
    /// The client went away first.
    Cancelled,
    /// Refused for want of a place in time: the expected wait (or the
    /// wait) was past the request's deadline or `max_queue_wait_secs`.
    Overloaded,
    /// Refused: its API key had `max_in_flight` requests admitted.
    KeyLimit,
    /// Cut: the client took nothing for `write_timeout_secs` with its
    /// stream's buffer full; cancelled in the engine.
    ClientStalled,
}

impl Outcome {
    /// The metric's label value.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Invalid => "invalid",
            Outcome::UnknownModel => "unknown_model",
            Outcome::QueueFull => "queue_full",
            Outcome::Unavailable => "unavailable",
            Outcome::Deadline => "deadline",
            Outcome::WorkerError => "worker_error",
            Outcome::Cancelled => "cancelled",
            Outcome::Overloaded => "overloaded",
            Outcome::KeyLimit => "key_limit",
            Outcome::ClientStalled => "client_stalled",
        }
    }
}

impl std::fmt::Display for RouteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for RouteError {}
