//! The `Control` service on the local control socket: status, watching, and
//! card resets. Destructive operations live here only, never on the public
//! inference port.

use super::convert;
use crate::cards::reset::Phase;
use crate::cards::CardError;
use crate::daemon::DaemonState;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::control_server::Control;

/// Serves `tt.serving.v1.Control`.
pub struct ControlService {
    state: Arc<DaemonState>,
}

impl ControlService {
    /// A service over the daemon's state.
    pub fn new(state: Arc<DaemonState>) -> Self {
        ControlService { state }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Control for ControlService {
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(self.state.status()))
    }

    type WatchStatusStream = BoxStream<pb::StatusResponse>;

    async fn watch_status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<Self::WatchStatusStream>, Status> {
        let state = self.state.clone();
        let mut changes = state.subscribe();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                changes.borrow_and_update();
                if tx.send(Ok(state.status())).await.is_err() {
                    return; // the client went away
                }
                if changes.changed().await.is_err() {
                    return; // the daemon is shutting down
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type ResetCardStream = BoxStream<pb::ResetProgress>;

    async fn reset_card(
        &self,
        request: Request<pb::ResetCardRequest>,
    ) -> Result<Response<Self::ResetCardStream>, Status> {
        let name = request.into_inner().card;
        let cards = self.state.cards().clone();
        let bdf = cards.resolve_name(&name).map_err(card_status)?;
        tracing::info!(card = %bdf, "reset requested over the control socket");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let progress_tx = tx.clone();
            let progress_bdf = bdf.clone();
            let mut on_event = move |event: crate::cards::reset::ResetEvent| {
                let terminal = matches!(event.phase, Phase::Done | Phase::Failed);
                if terminal {
                    return; // the final message below carries the outcome
                }
                let _ = progress_tx.send(Ok(pb::ResetProgress {
                    bdf: progress_bdf.clone(),
                    phase: convert::reset_phase(event.phase) as i32,
                    attempt: event.attempt,
                    message: event.message,
                    ..Default::default()
                }));
            };
            let bdfs = [bdf.clone()];
            let last = match cards.reset(&bdfs, true, &mut on_event).await {
                Ok(outcome) => {
                    let index = outcome.indices.first().map(|(_, i)| *i);
                    Ok(pb::ResetProgress {
                        bdf: bdf.clone(),
                        phase: pb::ResetPhase::Done as i32,
                        attempt: outcome.attempts,
                        message: format!(
                            "card {bdf} is proven back as /dev/tenstorrent/{}",
                            index.map_or("?".to_string(), |i| i.to_string())
                        ),
                        new_index: index,
                        finished: true,
                        ok: true,
                    })
                }
                Err(CardError::ResetFailed(failure)) => Ok(pb::ResetProgress {
                    bdf: bdf.clone(),
                    phase: pb::ResetPhase::Failed as i32,
                    attempt: failure.attempts,
                    message: format!(
                        "{failure}; card {bdf} is quarantined until a manual reset succeeds"
                    ),
                    new_index: None,
                    finished: true,
                    ok: false,
                }),
                Err(other) => Err(card_status(other)),
            };
            let _ = tx.send(last);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }
}

fn card_status(err: CardError) -> Status {
    match &err {
        CardError::NotFound(_) => Status::not_found(err.to_string()),
        CardError::Locked(_) => Status::failed_precondition(err.to_string()),
        CardError::Busy(_) => Status::aborted(err.to_string()),
        CardError::ResetFailed(_) => Status::internal(err.to_string()),
    }
}
