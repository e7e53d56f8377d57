//! Errors as OpenAI sends them: `{"error": {"message", "type", "param",
//! "code"}}` (written by `tt_openai_wire::error`, which tt-worker-openai
//! reads its engine's errors with) with the matching HTTP status, and `Retry-After` where waiting
//! helps. The router's [`RouteError`] is mapped here, at this door's edge.
//!
//! What a 503 says is short and fixed: the model, that it cannot serve
//! now, and the retry hint. The router's own words for it name each
//! slot's reason, which can hold host paths, tt-smi's output and operator
//! commands (issue 46), and a failing engine's message can hold anything;
//! a client needs none of it, and the door is open to anyone who can reach
//! it when no tokens are set. The detail stays on the control socket
//! (`ttctl status`) and in the daemon's log.

use crate::config::Config;
use crate::router::RouteError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tt_openai_wire::request::Refused;

/// One error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<String>,
    code: Option<&'static str>,
    retry_after_secs: Option<u64>,
    /// Close the connection after the answer (the request's body was not
    /// read to its end).
    close: bool,
}

impl ApiError {
    /// An error of this status and OpenAI type.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after_secs: None,
            close: false,
        }
    }

    /// 408, closing the connection: the body did not arrive within
    /// `openai.body_read_timeout_secs`.
    pub fn body_timed_out(secs: u64) -> ApiError {
        ApiError {
            code: Some("body_read_timeout"),
            close: true,
            ..ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "timeout_error",
                format!(
                    "the request body did not arrive within {secs} s of its head (openai.body_read_timeout_secs); send the body right behind the headers"
                ),
            )
        }
    }

    /// 401: a missing, malformed or wrong bearer token.
    pub fn unauthenticated(why: String) -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", why)
        }
    }

    /// 400 naming the field.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: (!param.is_empty()).then(|| param.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 413: the body is over the limit.
    pub fn too_large(max_prompt_bytes: u64) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "the request body is larger than this server accepts: prompts are limited to {max_prompt_bytes} bytes (limits.max_prompt_bytes), plus 1 MiB for the other fields; shorten the prompt"
            ),
        )
    }

    /// What the error says (the message a client reads).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error as the JSON of an SSE event, for a stream that already
    /// started (its status line is sent).
    pub fn event_json(&self) -> serde_json::Value {
        self.body()
    }

    fn body(&self) -> serde_json::Value {
        tt_openai_wire::error::write(&self.message, self.kind, self.param.as_deref(), self.code)
    }
}

impl From<Refused> for ApiError {
    fn from(r: Refused) -> ApiError {
        ApiError::invalid(&r.param, r.message)
    }
}

impl ApiError {
    /// The router's error for a request for `model`, as its client reads
    /// it.
    pub fn route(e: RouteError, model: &str) -> ApiError {
        let model = crate::echo::echo(model);
        let message = e.message();
        let retry = e.hint().and_then(|h| h.retry_after_secs());
        let then = e
            .hint()
            .map(|h| format!("; {}", h.describe()))
            .unwrap_or_default();
        let mut error = match &e {
            // The router's messages start with the field: `stop[1]: ...`.
            RouteError::Invalid(m) => {
                let param = m.split(':').next().unwrap_or_default();
                ApiError::invalid(param, message)
            }
            RouteError::UnknownModel(_) => ApiError {
                param: Some("model".into()),
                code: Some("model_not_found"),
                ..ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
            },
            RouteError::QueueFull(_) => ApiError {
                // A full queue drains in seconds at this batch size.
                retry_after_secs: Some(1),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            },
            RouteError::KeyLimit(_) => ApiError {
                code: Some("key_in_flight_limit"),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            },
            RouteError::Overloaded { .. } => ApiError {
                code: Some("overloaded"),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable_error",
                    message,
                )
            },
            // Its status line went out long ago: only a stream's last event
            // can carry it, if the client ever reads again.
            RouteError::ClientStalled(_) => {
                ApiError::new(StatusCode::REQUEST_TIMEOUT, "timeout_error", message)
            }
            RouteError::Unavailable { .. } => {
                tracing::debug!(%model, detail = %message, "OpenAI front door: 503, no slot could serve the request");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable_error",
                    format!("model `{model}` has no slot that can serve this request now{then}"),
                )
            }
            RouteError::Deadline { .. } => {
                ApiError::new(StatusCode::GATEWAY_TIMEOUT, "timeout_error", message)
            }
            RouteError::Worker { code, .. } => match code {
                tonic::Code::InvalidArgument => {
                    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
                }
                tonic::Code::ResourceExhausted => {
                    ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
                }
                tonic::Code::DeadlineExceeded => {
                    ApiError::new(StatusCode::GATEWAY_TIMEOUT, "timeout_error", message)
                }
                other => {
                    tracing::info!(%model, code = ?other, detail = %message, "OpenAI front door: the worker failed a request");
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable_error",
                        format!("the engine serving model `{model}` failed this request ({other:?}){then}"),
                    )
                }
            },
        };
        if retry.is_some() {
            error.retry_after_secs = retry;
        }
        error
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        set_retry_after(&mut response, self.retry_after_secs);
        if self.close {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Set `Retry-After` (seconds) when there is a hint.
pub fn set_retry_after(response: &mut Response, secs: Option<u64>) {
    if let Some(value) = secs.and_then(|s| HeaderValue::from_str(&s.to_string()).ok()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
}

/// 404 for a model not in the config, listing the known ones.
pub fn unknown_model(model: &str, config: &Config) -> ApiError {
    let known: Vec<&str> = config.models.keys().map(String::as_str).collect();
    let error = RouteError::UnknownModel(format!(
        "unknown model `{}`; known models: {}",
        crate::echo::echo(model),
        if known.is_empty() {
            "(none configured)".to_string()
        } else {
            known.join(", ")
        }
    ));
    ApiError::route(error, model)
}
