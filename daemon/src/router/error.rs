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
            RouteError::Unavailable { hint, .. } | RouteError::Deadline { hint, .. } => *hint,
            _ => None,
        }
    }

    /// The message a client reads: the hint's words follow it.
    pub fn message(&self) -> String {
        let (text, hint) = match self {
            RouteError::Invalid(m) | RouteError::UnknownModel(m) | RouteError::QueueFull(m) => {
                (m.as_str(), None)
            }
            RouteError::Unavailable { message, hint } | RouteError::Deadline { message, hint } => {
                (message.as_str(), *hint)
            }
            RouteError::Worker { message, .. } => (message.as_str(), None),
        };
        match hint {
            Some(hint) => format!("{text}; {}", hint.describe()),
            None => text.to_string(),
        }
    }

    /// The request's outcome in the metrics (`tt_serving_requests_total`).
    pub fn outcome(&self) -> &'static str {
        match self {
            RouteError::Invalid(_) => "invalid",
            RouteError::UnknownModel(_) => "unknown_model",
            RouteError::QueueFull(_) => "queue_full",
            RouteError::Unavailable { .. } => "unavailable",
            RouteError::Deadline { .. } => "deadline",
            RouteError::Worker { code, .. } => match code {
                tonic::Code::InvalidArgument => "invalid",
                tonic::Code::ResourceExhausted => "queue_full",
                tonic::Code::DeadlineExceeded => "deadline",
                _ => "worker_error",
            },
        }
    }
}

impl std::fmt::Display for RouteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for RouteError {}
