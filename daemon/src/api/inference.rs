//! The public `Inference` service: requests go through the router to a
//! Ready slot of the named model (see `router.rs`).

use crate::router::Outcome;
use crate::slots::SlotState;
use crate::state::DaemonState;
use crate::usage::KeyName;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::inference_server::Inference;

/// Serves `tt.serving.v1.Inference`.
pub struct InferenceService {
    state: Arc<DaemonState>,
}

impl InferenceService {
    /// A service over the daemon's state.
    pub fn new(state: Arc<DaemonState>) -> Self {
        InferenceService { state }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Inference for InferenceService {
    type GenerateStream = BoxStream<pb::GenerateResponse>;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let max = self.state.config().limits.max_streams_per_connection;
        let place = super::limits::admit(&request, max).inspect_err(|_| {
            // Refused before routing: counted under the key the token check
            // named, as the router counts a full queue (RESOURCE_EXHAUSTED).
            if let Some(key) = request.extensions().get::<KeyName>() {
                let config = self.state.config();
                let model = crate::usage::model_label(&config, &request.get_ref().model);
                crate::usage::request(key, model, Outcome::QueueFull.label());
            }
        })?;
        super::route::generate(&self.state, "grpc", request, move |stream| {
            // The place is held for as long as the client's stream lives.
            let stream = tokio_stream::StreamExt::map(stream, move |chunk| {
                let _held = &place;
                chunk
            });
            Box::pin(stream) as Self::GenerateStream
        })
        .await
    }

    async fn list_models(
        &self,
        _request: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        let config = self.state.config();
        let slots = self.state.slots();
        let models = config
            .models
            .iter()
            .map(|(name, m)| {
                let ready: Vec<_> = slots
                    .iter()
                    .filter(|s| &s.model == name && s.state == SlotState::Ready)
                    .collect();
                pb::ModelInfo {
                    name: name.clone(),
                    tp: m.tp,
                    replicas: m.card_sets().len() as u32,
                    ready_replicas: ready.len() as u32,
                    context_length: context_length(&ready),
                    supported_parameters: supported_parameters(&ready),
                }
            })
            .collect();
        Ok(Response::new(pb::ListModelsResponse { models }))
    }
}

/// The optional parameters a request can count on whichever ready replica
/// serves it: those every one of them lists.
pub fn supported_parameters(ready: &[&crate::slots::SlotView]) -> Vec<String> {
    let Some((first, rest)) = ready.split_first() else {
        return Vec::new();
    };
    first
        .engine_facts
        .supported_parameters
        .iter()
        .filter(|p| {
            rest.iter()
                .all(|s| s.engine_facts.supported_parameters.contains(p))
        })
        .cloned()
        .collect()
}

/// The optional parameters that put a request on the host sampling path
/// of some ready replica's engine (`x-tt-sampling`): those any of them
/// lists.
pub fn host_sampling_parameters(ready: &[&crate::slots::SlotView]) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for s in ready {
        for p in &s.engine_facts.host_sampling_parameters {
            if !all.contains(p) {
                all.push(p.clone());
            }
        }
    }
    all
}

/// The context length a request can count on whichever ready replica serves
/// it: the smallest any of them reported (replicas of one model normally
/// agree). 0 when none is ready or none reported one.
fn context_length(ready: &[&crate::slots::SlotView]) -> u32 {
    ready
        .iter()
        .map(|s| s.context_length)
        .filter(|&n| n > 0)
        .min()
        .unwrap_or(0)
}
