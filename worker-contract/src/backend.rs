//! What an engine implements to be a worker: [`Backend`]. Everything else
//! of engine.proto (phase gating, ranks, the cache mode, Shutdown, mapping
//! errors to gRPC statuses) is done once, in [`crate::service`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};
use tt_serving_proto::v1 as pb;

/// Where a worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Loading the model or starting the engine: Info and Health answer,
    /// Generate is UNAVAILABLE.
    Loading = 1,
    /// Serving.
    Ready = 2,
    /// Shutting down: finishing in-flight work, admitting none.
    Draining = 3,
}

impl Phase {
    /// engine.proto's word for it.
    pub fn state(self) -> pb::WorkerState {
        match self {
            Phase::Loading => pb::WorkerState::Loading,
            Phase::Ready => pb::WorkerState::Ready,
            Phase::Draining => pb::WorkerState::Draining,
        }
    }
}

/// A [`Phase`] shared between the life, the engine and the RPC handlers.
#[derive(Debug)]
pub struct PhaseCell(AtomicU8);

impl Default for PhaseCell {
    fn default() -> Self {
        Self(AtomicU8::new(Phase::Loading as u8))
    }
}

impl PhaseCell {
    /// The current phase.
    pub fn get(&self) -> Phase {
        match self.0.load(Ordering::Acquire) {
            2 => Phase::Ready,
            3 => Phase::Draining,
            _ => Phase::Loading,
        }
    }

    /// Moves to `phase`.
    pub fn set(&self, phase: Phase) {
        self.0.store(phase as u8, Ordering::Release);
    }
}

/// Why a generation was refused or failed, as the engine sees it; the
/// service maps each to one gRPC status code, the daemon's contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    /// The request cannot be served as sent (INVALID_ARGUMENT): the message
    /// names the field and the fix.
    #[error("{0}")]
    Invalid(String),
    /// The batch and queue are full (RESOURCE_EXHAUSTED): retry later or
    /// elsewhere.
    #[error("{0}")]
    Busy(String),
    /// The worker cannot serve now (UNAVAILABLE): loading, draining, or its
    /// engine gone.
    #[error("{0}")]
    Unavailable(String),
    /// The engine failed the request (INTERNAL).
    #[error("{0}")]
    Failed(String),
}

impl From<GenerateError> for tonic::Status {
    fn from(e: GenerateError) -> Self {
        match e {
            GenerateError::Invalid(m) => tonic::Status::invalid_argument(m),
            GenerateError::Busy(m) => tonic::Status::resource_exhausted(m),
            GenerateError::Unavailable(m) => tonic::Status::unavailable(m),
            GenerateError::Failed(m) => tonic::Status::internal(m),
        }
    }
}

/// One generation's chunks: deltas, then one final chunk (or an error).
pub type TokenStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::GenerateResponse, GenerateError>> + Send>>;

/// What a drain did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Sequences that finished within the drain timeout.
    pub finished: u32,
    /// Sequences cancelled at the timeout.
    pub cancelled: u32,
}

/// An engine behind the worker contract.
pub trait Backend: Send + Sync + 'static {
    /// Where the worker is (gates Generate; Info and Health report it).
    fn phase(&self) -> Phase;

    /// Load progress, while loading.
    fn progress(&self) -> pb::LoadProgress;

    /// The engine's facts for Info: the model, the cache files, the
    /// banners engaged, the engine's version, the parameters honoured, the
    /// KV cache. The service fills in what the contract knows (`tp`,
    /// `ranks`, `cache_mode`) and the phase and progress.
    fn info(&self) -> pb::InfoResponse;

    /// The engine's load for Health; the service fills in the phase and
    /// progress.
    fn health(&self) -> pb::HealthResponse;

    /// The service name this worker's spans carry (`tt-worker`, ...).
    const SERVICE_NAME: &'static str;

    /// Starts one generation of a worker that is Ready; dropping the
    /// stream cancels it. `trace` is the worker's span of the request
    /// (empty while traces are off): an engine that takes W3C trace
    /// context is given `trace.traceparent()`; the service records the
    /// first- and last-token events itself.
    fn generate(
        &self,
        request: pb::GenerateRequest,
        request_id: String,
        arrived: Instant,
        trace: tt_serving_telemetry::Span,
    ) -> impl Future<Output = Result<TokenStream, GenerateError>> + Send;

    /// Stops admitting work (the phase becomes Draining) and lets in-flight
    /// sequences finish for up to `timeout`, cancelling the rest.
    fn drain(&self, timeout: Duration) -> impl Future<Output = DrainReport> + Send;
}
