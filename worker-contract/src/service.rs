//! engine.proto's `Engine` service over any [`Backend`], written once:
//! Generate gated by phase, the contract's facts in Info, Shutdown as a
//! drain that then ends the serving, and every [`GenerateError`] mapped to
//! its gRPC status in one place.

use crate::args::Contract;
use crate::backend::{Backend, GenerateError, Phase};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_server::Engine;
use tt_serving_telemetry::{attr, Attribute, Kind, Span};

/// What a refusal while loading says.
pub const LOADING: &str = "the worker is still loading the model";
/// What a refusal while draining says.
pub const DRAINING: &str = "the worker is shutting down";

/// The service.
pub struct EngineService<B> {
    backend: Arc<B>,
    ranks: Vec<pb::RankBinding>,
    tp: u32,
    cache_mode: &'static str,
    /// Fired once a Shutdown call has drained the backend.
    shut_down: Arc<Notify>,
}

impl<B: Backend> EngineService<B> {
    /// A service for `backend` under `contract`; `shut_down` fires after a
    /// Shutdown call's drain.
    pub fn new(contract: &Contract, backend: Arc<B>, shut_down: Arc<Notify>) -> Self {
        Self {
            backend,
            ranks: contract
                .bdfs
                .iter()
                .enumerate()
                .map(|(rank, bdf)| pb::RankBinding {
                    rank: rank as u32,
                    bdf: bdf.clone(),
                })
                .collect(),
            tp: contract.tp,
            cache_mode: contract.cache_mode.as_str(),
            shut_down,
        }
    }
}

type GenerateStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::GenerateResponse, Status>> + Send + 'static>,
>;

#[tonic::async_trait]
impl<B: Backend> Engine for EngineService<B> {
    async fn info(
        &self,
        _: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let mut info = self.backend.info();
        info.tp = self.tp;
        info.ranks = self.ranks.clone();
        info.cache_mode = self.cache_mode.to_string();
        info.state = self.backend.phase().state() as i32;
        info.progress = Some(self.backend.progress());
        Ok(Response::new(info))
    }

    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        let mut health = self.backend.health();
        health.state = self.backend.phase().state() as i32;
        health.progress = Some(self.backend.progress());
        Ok(Response::new(health))
    }

    type GenerateStream = GenerateStream;

    async fn generate(
        &self,
        request: Request<pb::EngineGenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let arrived = Instant::now();
        // A child of the daemon's span when the call carries its context.
        let span = Span::from_grpc("worker generate", Kind::Server, request.metadata());
        let refused = |status: Status| {
            span.fail(|| status.message().to_string());
            status
        };
        match self.backend.phase() {
            Phase::Loading => return Err(refused(Status::unavailable(LOADING))),
            Phase::Draining => return Err(refused(Status::unavailable(DRAINING))),
            Phase::Ready => {}
        }
        let request = request.into_inner();
        let generate = request.request.ok_or_else(|| {
            refused(Status::from(GenerateError::Invalid(
                "EngineGenerateRequest.request is missing".into(),
            )))
        })?;
        span.set_with(|| {
            vec![
                Attribute::new(attr::MODEL, generate.model.clone()),
                Attribute::new(attr::REQUEST_ID, request.request_id.clone()),
            ]
        });
        let stream = self
            .backend
            .generate(generate, request.request_id, arrived, span.clone())
            .await
            .map_err(|e| refused(Status::from(e)))?;
        if !span.is_recording() {
            return Ok(Response::new(Box::pin(
                stream.map(|chunk| chunk.map_err(Status::from)),
            )));
        }
        // The generation's events on the way out; the span ends with the
        // stream (a cancelled one too).
        let mut first = true;
        Ok(Response::new(Box::pin(stream.map(move |chunk| {
            match &chunk {
                Ok(response) => match &response.chunk {
                    Some(pb::generate_response::Chunk::Delta(_)) if first => {
                        first = false;
                        span.first_token();
                    }
                    Some(pb::generate_response::Chunk::Final(f)) => {
                        let usage = f.usage.unwrap_or_default();
                        span.last_token(
                            tt_serving_proto::finish_reason_name(f.finish_reason()),
                            usage.prompt_tokens,
                            f.timings.map_or(0, |t| t.cached_prompt_tokens),
                            usage.completion_tokens,
                        );
                        span.end();
                    }
                    _ => {}
                },
                Err(e) => span.fail(|| e.to_string()),
            }
            chunk.map_err(Status::from)
        }))))
    }

    async fn shutdown(
        &self,
        request: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        let timeout = Duration::from_millis(request.into_inner().drain_timeout_ms as u64);
        let report = self.backend.drain(timeout).await;
        self.shut_down.notify_one();
        Ok(Response::new(pb::ShutdownResponse {
            finished: report.finished,
            cancelled: report.cancelled,
        }))
    }
}
