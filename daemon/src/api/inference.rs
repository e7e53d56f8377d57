//! The public `Inference` service. Routing to workers arrives with slot
//! supervision; until a slot of a model is Ready, requests for it are
//! answered UNAVAILABLE naming the slot's state, and unknown models
//! NOT_FOUND listing the known ones.

use crate::daemon::DaemonState;
use crate::slots::SlotState;
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
        let model = request.into_inner().model;
        let config = self.state.config();
        if !config.models.contains_key(&model) {
            let known: Vec<&str> = config.models.keys().map(|k| k.as_str()).collect();
            return Err(Status::not_found(format!(
                "unknown model `{model}`; known models: {}",
                if known.is_empty() {
                    "(none configured)".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        let slots = self.state.slots();
        let states: Vec<String> = slots
            .iter()
            .filter(|s| s.model == model)
            .map(|s| {
                let since = s.since.elapsed().map(|d| d.as_secs()).unwrap_or(0);
                format!(
                    "slot {} is {:?} since {since}s: {}",
                    s.name, s.state, s.reason
                )
            })
            .collect();
        Err(Status::unavailable(format!(
            "model `{model}` has no ready slot ({})",
            states.join("; ")
        )))
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
            .map(|(name, m)| pb::ModelInfo {
                name: name.clone(),
                tp: m.tp,
                replicas: m.card_sets().len() as u32,
                ready_replicas: slots
                    .iter()
                    .filter(|s| &s.model == name && s.state == SlotState::Ready)
                    .count() as u32,
                context_length: 0,
            })
            .collect();
        Ok(Response::new(pb::ListModelsResponse { models }))
    }
}
