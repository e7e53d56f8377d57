//! The OpenAI-compatible HTTP front door (`[openai] listen`): what every
//! SDK, chat UI, agent framework and benchmark harness in this field
//! already speaks, in front of the same router, queues, `[limits]`, bearer
//! tokens, TLS, metrics and cancellation as the gRPC port.
//!
//! Layout:
//! - The bodies are `tt_openai_wire`'s: requests read strictly
//!   (`tt_openai_wire::request`: an unknown field, or a parameter no
//!   engine honours, is refused by name), answers written by it too.
//! - `errors`: [`crate::router::RouteError`] and refused fields as OpenAI's
//!   error JSON with the matching HTTP status and `Retry-After`.
//! - `generate`: the two generation endpoints, streamed as Server-Sent
//!   Events exactly as OpenAI sends them, or collected.
//! - `tls`: rustls on the front door, from `inference.tls_cert`/`tls_key`.
//! - `connections`: accepting, capping and timing connections, plain or
//!   TLS (`[openai]` `header_read_timeout_secs`, `idle_timeout_secs`,
//!   `max_connections`, `max_connections_per_peer`).
//!
//! axum (on hyper) does routing, extraction and SSE framing; nothing here
//! parses HTTP. A client that disconnects drops its response stream, which
//! drops the router's stream and cancels the sequence at the worker.

mod connections;
mod errors;
mod generate;
mod tls;

use crate::shutdown::Shutdown;
use crate::slots::SlotState;
use crate::state::DaemonState;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use errors::ApiError;
use std::sync::Arc;
use tokio::net::TcpListener;
use tt_openai_wire::Endpoint;

pub use generate::SAMPLING_HEADER;
pub use tls::HttpTls;

/// Everything a handler reads.
#[derive(Clone)]
struct Front {
    state: Arc<DaemonState>,
    tokens: super::tokens::TokenCheck,
}

/// Serve the front door on `listener` until shutdown.
pub async fn serve(
    listener: TcpListener,
    state: Arc<DaemonState>,
    tokens: super::tokens::TokenCheck,
    tls: Option<HttpTls>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    // Bodies beyond the longest prompt plus room for the other fields are
    // refused while reading (413), before any JSON is parsed.
    let max_body = usize::try_from(state.config().limits.max_prompt_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(1 << 20);
    let front = Front { state, tokens };
    let authenticated = Router::new()
        .route("/v1/models", get(models))
        .route(Endpoint::Completions.path(), post(generate::completions))
        .route(Endpoint::Chat.path(), post(generate::chat))
        .route_layer(axum::middleware::from_fn_with_state(
            front.clone(),
            authenticate,
        ));
    // `[openai]` is read once: a reload leaves it for the next start.
    let limits = connections::Limits::of(&front.state.config().openai);
    let app = Router::new()
        .route("/health", get(health))
        .merge(authenticated)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(front);
    connections::serve(listener, app, tls, limits, shutdown).await
}

/// Bearer tokens, when configured, in front of everything but `/health`
/// (load balancers probe it without credentials).
/// The key's name goes with the request for the usage counts.
async fn authenticate(State(front): State<Front>, mut request: Request, next: Next) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or(""));
    match front.tokens.check_http(authorization) {
        Ok(name) => {
            request.extensions_mut().insert(name);
            next.run(request).await
        }
        Err(why) => {
            tracing::debug!(reason = %why, "refused an unauthenticated request on the OpenAI front door");
            ApiError::unauthenticated(why).into_response()
        }
    }
}

async fn not_found(request: Request) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found_error",
        format!(
            "no {} {} here; the OpenAI front door serves GET /v1/models, POST /v1/completions, POST /v1/chat/completions and GET /health",
            request.method(),
            crate::echo::echo(request.uri().path())
        ),
    )
    .into_response()
}

/// The context length every ready replica can give (the smallest any of
/// them reported); None while none is ready.
fn max_model_len(slots: &[crate::slots::SlotView], model: &str) -> Option<u32> {
    slots
        .iter()
        .filter(|s| s.model == model && s.state == SlotState::Ready && s.context_length > 0)
        .map(|s| s.context_length)
        .min()
}

/// `GET /v1/models`: every configured model, with its ready replicas and
/// `max_model_len` from the workers.
async fn models(State(front): State<Front>) -> Response {
    let config = front.state.config();
    let slots = front.state.slots();
    let created = tt_serving_proto::time::unix_ms(front.state.started()) / 1000;
    let data: Vec<serde_json::Value> = config
        .models
        .iter()
        .map(|(name, m)| {
            let ready: Vec<&crate::slots::SlotView> = slots
                .iter()
                .filter(|s| &s.model == name && s.state == SlotState::Ready)
                .collect();
            serde_json::json!({
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "tt-serving",
                "max_model_len": max_model_len(&slots, name),
                "replicas": m.card_sets().len(),
                "ready_replicas": ready.len(),
                "supported_parameters": super::inference::supported_parameters(&ready),
                "host_sampling_parameters": super::inference::host_sampling_parameters(&ready),
            })
        })
        .collect();
    axum::Json(serde_json::json!({ "object": "list", "data": data })).into_response()
}

/// `?model=` on `/health`.
#[derive(serde::Deserialize)]
struct HealthQuery {
    model: Option<String>,
}

/// `GET /health[?model=NAME]`: 200 when the named model (or, without one,
/// any model) has a Ready replica; 503 with the state and a short reason
/// otherwise, and a `Retry-After` when a recovery is under way. Open
/// without a token, like gRPC health, so it names each slot's state and
/// never why: a slot's reason can hold host paths, tt-smi's output and
/// operator commands (issue 46). The reasons stay on the control socket
/// (`ttctl status`).
async fn health(State(front): State<Front>, Query(q): Query<HealthQuery>) -> Response {
    let config = front.state.config();
    if let Some(model) = &q.model {
        if !config.models.contains_key(model) {
            return errors::unknown_model(model, &config).into_response();
        }
    }
    let slots = front.state.slots();
    let wanted = |s: &&crate::slots::SlotView| q.model.as_ref().is_none_or(|m| &s.model == m);
    let ready: Vec<&str> = slots
        .iter()
        .filter(wanted)
        .filter(|s| s.state == SlotState::Ready)
        .map(|s| s.name.as_str())
        .collect();
    if !ready.is_empty() {
        return axum::Json(serde_json::json!({ "status": "ok", "ready_slots": ready }))
            .into_response();
    }
    let states: Vec<(&str, &str)> = slots
        .iter()
        .filter(wanted)
        .map(|s| (s.name.as_str(), s.state.word()))
        .collect();
    let reason = not_ready_reason(q.model.as_deref(), &states);
    let hint = q.model.as_ref().and_then(|m| {
        crate::retry::RetryHint::for_availability(front.state.slot_manager().availability(m, None))
    });
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(serde_json::json!({ "status": "unavailable", "reason": reason })),
    )
        .into_response();
    errors::set_retry_after(&mut response, hint.and_then(|h| h.retry_after_secs()));
    response
}

/// The most slots a 503 from `/health` names; the rest are counted.
const HEALTH_SLOTS_NAMED: usize = 8;

/// Why `/health` is 503, from (slot name, state word) pairs: the words of a
/// fixed vocabulary and the configured names, nothing else.
fn not_ready_reason(model: Option<&str>, states: &[(&str, &str)]) -> String {
    let subject = match model {
        Some(model) => format!("no slot of model {model} is ready"),
        None => "no slot is ready".to_string(),
    };
    if states.is_empty() {
        return match model {
            Some(_) => subject,
            None => "no model is configured".to_string(),
        };
    }
    let mut named: Vec<String> = states
        .iter()
        .take(HEALTH_SLOTS_NAMED)
        .map(|(name, state)| format!("slot {name} is {state}"))
        .collect();
    if states.len() > HEALTH_SLOTS_NAMED {
        named.push(format!("{} more", states.len() - HEALTH_SLOTS_NAMED));
    }
    format!("{subject} ({})", named.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_health_reason_names_states_only_and_stays_short() {
        assert_eq!(
            not_ready_reason(Some("m"), &[("m", "failed")]),
            "no slot of model m is ready (slot m is failed)"
        );
        assert_eq!(not_ready_reason(None, &[]), "no model is configured");
        let many: Vec<(String, &str)> = (0..40).map(|i| (format!("m/{i}"), "starting")).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        let reason = not_ready_reason(None, &many);
        assert!(reason.ends_with("; 32 more)"), "{reason}");
        assert!(reason.len() < 256, "{reason}");
    }
}
