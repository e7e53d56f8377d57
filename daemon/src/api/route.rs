//! The router at the gRPC edge: the request's `grpc-timeout` becomes its
//! deadline, and a [`RouteError`] becomes a gRPC status (with the retry
//! hint as `grpc-retry-pushback-ms`, gRFC A6). Both the public Inference
//! service and the control socket's Generate route through here.

use crate::router::{Client, RouteError};
use crate::state::DaemonState;
use crate::usage::KeyName;
use std::time::Duration;
use tokio_stream::{Stream, StreamExt};
use tonic::metadata::MetadataValue;
use tonic::{Code, Request, Status};
use tt_serving_proto::v1 as pb;
use tt_serving_telemetry::{attr, Kind, Span};

/// The gRPC metadata key (gRFC A6 "server pushback").
pub const GRPC_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// Route a gRPC Generate request; the stream's errors are gRPC statuses.
/// `respond` makes the answer of a stream and gets the response metadata
/// that marks a request served on the host sampling path.
pub async fn generate<S>(
    state: &DaemonState,
    door: &'static str,
    request: Request<pb::GenerateRequest>,
    respond: impl FnOnce(
        std::pin::Pin<Box<dyn Stream<Item = Result<pb::GenerateResponse, Status>> + Send + 'static>>,
    ) -> S,
) -> Result<tonic::Response<S>, Status> {
    let timeout = request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout);
    // The public port's token check names the key; the control socket's
    // Generate has none.
    let key = request
        .extensions()
        .get::<KeyName>()
        .cloned()
        .unwrap_or_default();
    // The request's span, a child of the client's trace when it sent one.
    let trace = Span::from_grpc(
        "tt.serving.v1.Inference/Generate",
        Kind::Server,
        request.metadata(),
    );
    trace.set(attr::DOOR, door);
    let peer = request.remote_addr().map(|a| a.ip());
    let stream = state
        .router()
        .generate(request.into_inner(), timeout, key, trace)
        .await
        .map_err(status)?;
    // The engine's pace never waits on this client's HTTP/2 window: the
    // stream is buffered (`router::buffer`).
    let config = state.config();
    let client = Client {
        door,
        timeout_key: "inference.write_timeout_secs",
        write_timeout: Duration::from_secs(config.inference.write_timeout_secs),
        peer,
        cut_by_door: None,
    };
    let stream = crate::router::buffer(stream, config.limits.stream_buffer_chunks as usize, client);
    let sampling = stream.host_sampling().join(",");
    let mut response =
        tonic::Response::new(respond(Box::pin(stream.map(|chunk| chunk.map_err(status)))));
    if !sampling.is_empty() {
        if let Ok(value) = MetadataValue::try_from(format!("host; parameters={sampling}")) {
            response
                .metadata_mut()
                .insert(crate::api::openai::SAMPLING_HEADER, value);
        }
    }
    Ok(response)
}

/// The gRPC status of a router error.
pub fn status(error: RouteError) -> Status {
    let code = match &error {
        RouteError::Invalid(_) => Code::InvalidArgument,
        RouteError::UnknownModel(_) => Code::NotFound,
        RouteError::QueueFull(_)
        | RouteError::Overloaded { .. }
        | RouteError::KeyLimit(_)
        | RouteError::ClientStalled(_) => Code::ResourceExhausted,
        RouteError::Unavailable { .. } => Code::Unavailable,
        RouteError::Deadline { .. } => Code::DeadlineExceeded,
        RouteError::Worker { code, .. } => *code,
    };
    let mut status = Status::new(code, error.message());
    if let Some(hint) = error.hint() {
        if let Ok(value) = MetadataValue::try_from(hint.grpc_pushback_ms()) {
            status.metadata_mut().insert(GRPC_PUSHBACK, value);
        }
    }
    status
}

/// Parse a gRPC `grpc-timeout` header value (`100m`, `5S`, ...).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::RetryHint;

    /// The hint a status carries (what a gRPC client reads).
    fn hint_of(status: &Status) -> Option<RetryHint> {
        let value = status.metadata().get(GRPC_PUSHBACK)?.to_str().ok()?;
        let ms: i64 = value.parse().ok()?;
        Some(match u64::try_from(ms) {
            Ok(ms) => RetryHint::After(Duration::from_millis(ms)),
            Err(_) => RetryHint::NotUntilFixed,
        })
    }

    #[test]
    fn hints_travel_as_pushback_metadata_and_words() {
        let soon = RetryHint::After(Duration::from_millis(2345));
        let s = status(RouteError::unavailable(
            "model `m` has no ready slot",
            Some(soon),
        ));
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(
            s.message(),
            "model `m` has no ready slot; retry in about 2.3 s"
        );
        assert_eq!(hint_of(&s), Some(soon));
        let down = status(RouteError::unavailable("x", Some(RetryHint::NotUntilFixed)));
        assert_eq!(
            down.metadata()
                .get(GRPC_PUSHBACK)
                .and_then(|v| v.to_str().ok()),
            Some("-1")
        );
        assert_eq!(hint_of(&down), Some(RetryHint::NotUntilFixed));
        let plain = status(RouteError::unavailable("model `m` has no ready slot", None));
        assert_eq!(plain.message(), "model `m` has no ready slot");
        assert_eq!(hint_of(&plain), None);
        let worker = status(RouteError::Worker {
            code: Code::InvalidArgument,
            message: "max_tokens: too many".into(),
        });
        assert_eq!(worker.code(), Code::InvalidArgument);
    }

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
    }
}
