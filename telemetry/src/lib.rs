//! OpenTelemetry traces for tt-serving, written once for the daemon and
//! its workers.
//!
//! - [`start`] installs the exporter: spans go over OTLP/gRPC (the
//!   maintained `opentelemetry-otlp` crate on tonic) to a collector, in
//!   batches sent every [`EXPORT_EVERY`].
//! - [`Span`] is a handle that is empty while no exporter runs: every call
//!   on it is then a branch on `None`, so tracing off costs nothing
//!   measurable (no context, no attributes built, no clock read).
//! - W3C trace context (`traceparent`, `tracestate`) is read from a
//!   client's HTTP headers or gRPC metadata ([`Span::root`]) and written on
//!   the calls that go further ([`Span::inject_grpc`], [`Span::traceparent`]),
//!   so a worker's span is a child of the daemon's, and an engine that reads
//!   `traceparent` (vLLM) continues the same trace.
//!
//! Spans end when [`Span::end`] is called or when the last handle to them
//! is dropped (a request cut short still ends its span).

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracer};
use std::sync::OnceLock;
use std::time::Duration;

pub use opentelemetry::trace::SpanKind as Kind;
pub use opentelemetry::KeyValue as Attribute;

/// How often finished spans are sent (the SDK's default is 5 s; a person
/// looking for a request they just sent should not wait that long, and a
/// batch a second is still a handful of spans).
pub const EXPORT_EVERY: Duration = Duration::from_secs(1);

/// How long [`Exporter::shutdown`] waits for the last batch.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// The W3C trace context header of a span (and the gRPC metadata key).
pub const TRACEPARENT: &str = "traceparent";
/// The W3C vendor state header that travels beside it.
pub const TRACESTATE: &str = "tracestate";

/// Attribute names: OpenTelemetry's generative-AI conventions where they
/// have one, `tt.*` for ours.
pub mod attr {
    /// The model a request names.
    pub const MODEL: &str = "gen_ai.request.model";
    /// Prompt tokens.
    pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    /// Prompt tokens the engine's prefix cache supplied.
    pub const CACHED_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
    /// Generated tokens.
    pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// Why generation ended (`stop`, `length`, `tool_calls`, `cancelled`).
    pub const FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    /// The engine-side request id.
    pub const REQUEST_ID: &str = "gen_ai.response.id";
    /// The slot that served a request, or whose lifecycle a span is.
    pub const SLOT: &str = "tt.slot";
    /// The API key's name (never the secret).
    pub const KEY: &str = "tt.key";
    /// The door a request came in by (`grpc`, `openai`, `control`).
    pub const DOOR: &str = "tt.door";
    /// The request's priority (lower is sooner).
    pub const PRIORITY: &str = "tt.priority";
    /// How the router placed it among replicas (`affine`, `spilled`, ...).
    pub const AFFINITY: &str = "tt.affinity";
    /// How a request ended, as the daemon's metrics count it.
    pub const OUTCOME: &str = "tt.outcome";
    /// The cards of a slot or a reset, by PCI address.
    pub const CARDS: &str = "tt.cards";
}

/// The tracer of this process, once [`start`] ran.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("otlp_endpoint `{endpoint}` is not usable: {why}")]
    Endpoint { endpoint: String, why: String },
    #[error("the OTLP exporter could not be built: {0}")]
    Build(String),
    #[error("an OTLP exporter is already running in this process")]
    AlreadyStarted,
}

/// Checks an OTLP endpoint before anything starts: `http://host:port`
/// (OTLP over gRPC without TLS, a collector on this host or a trusted
/// network). Returns what is wrong and how to fix it.
pub fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let uri: http::Uri = endpoint.parse().map_err(|e| {
        format!("it is not a URL ({e}); write it as http://HOST:PORT, e.g. http://127.0.0.1:4317")
    })?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(
                "https is not supported (the exporter is built without TLS); run a local collector and point this at it over http://, e.g. http://127.0.0.1:4317"
                    .into(),
            )
        }
        _ => {
            return Err(
                "it needs the scheme http://, e.g. http://127.0.0.1:4317 (OTLP over gRPC)".into(),
            )
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("it names no host; e.g. http://127.0.0.1:4317".into());
    }
    if uri.port_u16().is_none() {
        return Err(
            "it names no port; OTLP over gRPC listens on 4317 by convention, e.g. http://127.0.0.1:4317"
                .into(),
        );
    }
    Ok(())
}

/// The running exporter; [`Exporter::shutdown`] sends what is still queued.
pub struct Exporter {
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

/// Start exporting this process's spans to `endpoint` (see
/// [`check_endpoint`]) under the service name `service`, with `resource`
/// attributes (the slot, the host). Call from within a tokio runtime: the
/// gRPC channel lives on it. The connection is made lazily, so a collector
/// that is not up yet is not an error; spans that cannot be sent are
/// dropped with a log line from the SDK, never blocking a request.
pub fn start(endpoint: &str, service: &str, resource: Vec<KeyValue>) -> Result<Exporter, Error> {
    check_endpoint(endpoint).map_err(|why| Error::Endpoint {
        endpoint: endpoint.to_string(),
        why,
    })?;
    if TRACER.get().is_some() {
        return Err(Error::AlreadyStarted);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| Error::Build(e.to_string()))?;
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(EXPORT_EVERY)
                .build(),
        )
        .build();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_string())
                .with_attributes(resource)
                .build(),
        )
        .build();
    use opentelemetry::trace::TracerProvider as _;
    let tracer = provider.tracer("tt-serving");
    TRACER.set(tracer).map_err(|_| Error::AlreadyStarted)?;
    Ok(Exporter { provider })
}

impl Exporter {
    /// Send the spans still queued and stop. Blocks up to a few seconds:
    /// call it from a blocking context (`spawn_blocking`), not a runtime
    /// thread the export itself may need.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_WAIT) {
            tracing::warn!(error = %e, "the last OpenTelemetry spans may not have been sent");
        }
    }
}

/// Whether spans are exported by this process.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// A span, or nothing while tracing is off. Clones share the span.
#[derive(Clone, Default)]
pub struct Span {
    cx: Option<Context>,
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.traceparent() {
            Some(tp) => write!(f, "Span({tp})"),
            None => f.write_str("Span(off)"),
        }
    }
}

/// W3C trace context read from a header map.
struct Headers<'a> {
    traceparent: Option<&'a str>,
    tracestate: Option<&'a str>,
}

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => self.traceparent,
            TRACESTATE => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// W3C trace context written out.
#[derive(Default)]
struct Written {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl Injector for Written {
    fn set(&mut self, key: &str, value: String) {
        match key {
            TRACEPARENT => self.traceparent = Some(value),
            TRACESTATE if !value.is_empty() => self.tracestate = Some(value),
            _ => {}
        }
    }
}

impl Span {
    /// The empty span (tracing off, or nothing to trace).
    pub fn none() -> Span {
        Span { cx: None }
    }

    /// A span that starts a unit of work in this process: a child of the
    /// caller's trace when `traceparent` is a valid W3C header (with its
    /// `tracestate`), else the first span of a new trace (an invalid header
    /// is ignored, as W3C Trace Context says a receiver must).
    pub fn root(
        name: &'static str,
        kind: SpanKind,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> Span {
        let Some(tracer) = TRACER.get() else {
            return Span::none();
        };
        let parent = match traceparent {
            Some(tp) => TraceContextPropagator::new().extract(&Headers {
                traceparent: Some(tp),
                tracestate,
            }),
            None => Context::new(),
        };
        Span::start(tracer, name, kind, &parent)
    }

    /// A root span read from HTTP headers.
    pub fn from_http(name: &'static str, kind: SpanKind, headers: &http::HeaderMap) -> Span {
        if !enabled() {
            return Span::none();
        }
        let get = |key: &str| headers.get(key).and_then(|v| v.to_str().ok());
        Span::root(name, kind, get(TRACEPARENT), get(TRACESTATE))
    }

    /// A root span read from gRPC metadata.
    pub fn from_grpc(
        name: &'static str,
        kind: SpanKind,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Span {
        if !enabled() {
            return Span::none();
        }
        let get = |key: &str| metadata.get(key).and_then(|v| v.to_str().ok());
        Span::root(name, kind, get(TRACEPARENT), get(TRACESTATE))
    }

    fn start(tracer: &SdkTracer, name: &'static str, kind: SpanKind, parent: &Context) -> Span {
        let span = tracer
            .span_builder(name)
            .with_kind(kind)
            .start_with_context(tracer, parent);
        Span {
            cx: Some(parent.with_span(span)),
        }
    }

    /// A span inside this one (nothing when this one is nothing).
    pub fn child(&self, name: &'static str, kind: SpanKind) -> Span {
        match (&self.cx, TRACER.get()) {
            (Some(cx), Some(tracer)) => Span::start(tracer, name, kind, cx),
            _ => Span::none(),
        }
    }

    /// Whether this span records (build costly attributes only then).
    pub fn is_recording(&self) -> bool {
        self.cx.is_some()
    }

    /// Set attributes, built only when the span records.
    pub fn set_with(&self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.cx {
            cx.span().set_attributes(attributes());
        }
    }

    /// Set one attribute.
    pub fn set(&self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        if let Some(cx) = &self.cx {
            cx.span().set_attribute(KeyValue::new(key, value));
        }
    }

    /// Add an event now, its attributes built only when the span records.
    pub fn event(&self, name: &'static str, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.cx {
            cx.span().add_event(name, attributes());
        }
    }

    /// Mark the span failed, with what went wrong.
    pub fn fail(&self, message: impl FnOnce() -> String) {
        if let Some(cx) = &self.cx {
            cx.span().set_status(Status::error(message()));
        }
    }

    /// End the span now (later calls, and dropping it, do nothing more).
    pub fn end(&self) {
        if let Some(cx) = &self.cx {
            cx.span().end();
        }
    }

    /// The `first_token` event: the first generated token is here.
    pub fn first_token(&self) {
        self.event("first_token", Vec::new);
    }

    /// The `last_token` event, with the generation's counts (see
    /// [`Span::counts`]) on it and on the span.
    pub fn last_token(
        &self,
        finish_reason: &'static str,
        prompt: u32,
        cached: u32,
        completion: u32,
    ) {
        if self.cx.is_some() {
            self.event("last_token", || {
                counts(finish_reason, prompt, cached, completion)
            });
            self.counts(finish_reason, prompt, cached, completion);
        }
    }

    /// A generation's counts as attributes: why it ended, prompt tokens,
    /// those the prefix cache supplied, generated tokens.
    pub fn counts(&self, finish_reason: &'static str, prompt: u32, cached: u32, completion: u32) {
        self.set_with(|| counts(finish_reason, prompt, cached, completion));
    }

    /// The span's W3C `traceparent` (and `tracestate`, when there is one),
    /// for a call that continues the trace elsewhere.
    pub fn trace_context(&self) -> Option<(String, Option<String>)> {
        let cx = self.cx.as_ref()?;
        let mut written = Written::default();
        TraceContextPropagator::new().inject_context(cx, &mut written);
        Some((written.traceparent?, written.tracestate))
    }

    /// The span's W3C `traceparent` header value.
    pub fn traceparent(&self) -> Option<String> {
        self.trace_context().map(|(tp, _)| tp)
    }

    /// Put the span's trace context on a gRPC call's metadata, so the
    /// callee's spans are its children.
    pub fn inject_grpc(&self, metadata: &mut tonic::metadata::MetadataMap) {
        let Some((traceparent, tracestate)) = self.trace_context() else {
            return;
        };
        if let Ok(v) = traceparent.parse() {
            metadata.insert(TRACEPARENT, v);
        }
        if let Some(Ok(v)) = tracestate.map(|s| s.parse()) {
            metadata.insert(TRACESTATE, v);
        }
    }
}

/// See [`Span::counts`].
fn counts(finish_reason: &'static str, prompt: u32, cached: u32, completion: u32) -> Vec<KeyValue> {
    vec![
        KeyValue::new(
            attr::FINISH_REASONS,
            opentelemetry::Value::Array(
                vec![opentelemetry::StringValue::from(finish_reason)].into(),
            ),
        ),
        KeyValue::new(attr::INPUT_TOKENS, i64::from(prompt)),
        KeyValue::new(attr::CACHED_INPUT_TOKENS, i64::from(cached)),
        KeyValue::new(attr::OUTPUT_TOKENS, i64::from(completion)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked_with_the_fix_named() {
        assert!(check_endpoint("http://127.0.0.1:4317").is_ok());
        assert!(check_endpoint("http://collector.internal:4317").is_ok());
        let https = check_endpoint("https://127.0.0.1:4317").unwrap_err();
        assert!(https.contains("https is not supported"), "{https}");
        let bare = check_endpoint("127.0.0.1:4317").unwrap_err();
        assert!(bare.contains("http://"), "{bare}");
        let no_port = check_endpoint("http://127.0.0.1").unwrap_err();
        assert!(no_port.contains("no port"), "{no_port}");
        let junk = check_endpoint("http://[::1").unwrap_err();
        assert!(junk.contains("not a URL"), "{junk}");
    }

    #[test]
    fn spans_are_nothing_while_no_exporter_runs() {
        // No exporter in this test process: every span is empty, and
        // nothing goes on a call.
        let span = Span::root(
            "request",
            Kind::Server,
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            None,
        );
        assert!(!span.is_recording());
        assert_eq!(span.child("inner", Kind::Internal).traceparent(), None);
        let mut metadata = tonic::metadata::MetadataMap::new();
        span.inject_grpc(&mut metadata);
        assert!(metadata.is_empty());
    }
}
