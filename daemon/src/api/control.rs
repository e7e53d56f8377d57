//! The `Control` service on the local control socket: status, watching, and
//! card resets. Destructive operations live here only, never on the public
//! inference port. Every handler first asks the [`AdminRule`] whether the
//! connection's peer may perform its [`Operation`] (see `auth.rs`), through
//! [`ControlService::admit`], which also opens the call's audit record
//! (`audit.rs`): each destructive call, refused or not, leaves exactly one,
//! finished with the call's outcome before its last reply.

use super::auth::{AdminRule, Operation, PeerInfo};
use super::convert;
use crate::audit::{Action, Outcome, Record, Trail};
use crate::borrow::LoanError;
use crate::cache::CacheState;
use crate::cards::reset::Phase;
use crate::cards::CardError;
use crate::echo::echo;
use crate::slots::SlotError;
use crate::state::DaemonState;
use crate::trial::TrialError;
use crate::usage::Ledger;
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
    /// What the operations read and change.
    state: Arc<DaemonState>,
    /// Who may use the destructive operations.
    rule: AdminRule,
    /// Where each destructive call is recorded.
    trail: Arc<Trail>,
}

impl ControlService {
    /// A service over the daemon's state, guarded by `rule`, recording in
    /// the audit trail under `daemon.state_dir`.
    pub fn new(state: Arc<DaemonState>, rule: AdminRule) -> Self {
        let trail = Arc::new(Trail::new(&state.config().daemon.state_dir));
        ControlService { state, rule, trail }
    }

    /// Ask the admin rule whether the caller of `request` may perform `op`
    /// with `args`, and open the call's audit record. A refusal is
    /// recorded as `refused` and returned as PERMISSION_DENIED; a
    /// read-only operation records nothing.
    fn admit<T>(
        &self,
        request: &Request<T>,
        op: Operation,
        args: &[(&str, &str)],
    ) -> Result<Action, Status> {
        if !op.is_destructive() {
            self.rule.authorize(request, op)?;
            return Ok(Action::unrecorded(self.trail.clone()));
        }
        let peer = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(Option::as_ref);
        let checked = self.rule.check(peer, op);
        let admitted = match (&checked, peer) {
            (Ok(()), Some(peer)) => self.rule.basis(peer),
            _ => None,
        };
        let record = Record::new(
            peer.map(|p| p.uid),
            peer.and_then(|p| p.pid),
            admitted.as_deref().unwrap_or("refused"),
            op.command(),
        );
        let mut action = Action::new(self.trail.clone(), record);
        for (key, value) in args {
            action.arg(key, value);
        }
        match checked {
            Ok(()) => Ok(action),
            Err(status) => {
                action.finish(Outcome::Refused, status.message());
                Err(status)
            }
        }
    }
}

/// Record `status` as the action's failure and pass it on.
fn failed(action: &mut Action, status: Status) -> Status {
    action.finish(Outcome::Failed, status.message());
    status
}

/// Record a unary call's result (`ok` with `detail`'s text, or `failed`
/// with the error) and pass it on.
fn settle<T>(
    mut action: Action,
    result: Result<T, Status>,
    detail: impl FnOnce(&T) -> String,
) -> Result<T, Status> {
    match &result {
        Ok(answer) => action.finish(Outcome::Ok, &detail(answer)),
        Err(status) => action.finish(Outcome::Failed, status.message()),
    }
    result
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Control for ControlService {
    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        self.rule.authorize(&request, Operation::Status)?;
        Ok(Response::new(super::convert::status(&self.state)))
    }

    type WatchStatusStream = BoxStream<pb::StatusResponse>;

    async fn watch_status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<Self::WatchStatusStream>, Status> {
        self.rule.authorize(&request, Operation::WatchStatus)?;
        let state = self.state.clone();
        let mut changes = state.subscribe();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                changes.borrow_and_update();
                if tx.send(Ok(super::convert::status(&state))).await.is_err() {
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
        let mut action = self.admit(
            &request,
            Operation::ResetCard,
            &[("card", &request.get_ref().card)],
        )?;
        let name = request.into_inner().card;
        let cards = self.state.cards().clone();
        let bdf = cards
            .resolve_name(&name)
            .map_err(|e| failed(&mut action, card_status(e)))?;
        self.state
            .slot_manager()
            .check_manual_reset(&bdf)
            .map_err(|e| failed(&mut action, slot_status(e)))?;
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
            match &last {
                Ok(last) if last.ok => action.finish(Outcome::Ok, &last.message),
                Ok(last) => action.finish(Outcome::Failed, &last.message),
                Err(status) => action.finish(Outcome::Failed, status.message()),
            }
            let _ = tx.send(last);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }

    type VerifyCacheStream = BoxStream<pb::VerifyCacheProgress>;

    async fn verify_cache(
        &self,
        request: Request<pb::VerifyCacheRequest>,
    ) -> Result<Response<Self::VerifyCacheStream>, Status> {
        let mut action = self.admit(
            &request,
            Operation::VerifyCache,
            &[("model", &request.get_ref().model)],
        )?;
        let model = request.into_inner().model;
        let config = self.state.config();
        let cache_dir = config.daemon.cache_dir.clone();
        let variants: Vec<(String, std::path::PathBuf)> = crate::cache::list_variants(&cache_dir)
            .into_iter()
            .filter(|(m, _, _)| *m == model)
            .map(|(_, key, dir)| (key, dir))
            .collect();
        if variants.is_empty() && !config.models.contains_key(&model) {
            let known: Vec<&str> = config.models.keys().map(String::as_str).collect();
            return Err(failed(
                &mut action,
                Status::not_found(format!(
                    "unknown model `{}` and no cache of it on disk; known models: {}",
                    echo(&model),
                    known.join(", ")
                )),
            ));
        }
        tracing::info!(model = %model, variants = variants.len(), "cache verification requested over the control socket");
        let (tx, rx) = mpsc::channel(64);
        // Reads every cached byte: off the runtime.
        tokio::task::spawn_blocking(move || {
            let (ok, verdict) = verify_variants(&model, &variants, &tx);
            let outcome = if ok { Outcome::Ok } else { Outcome::Failed };
            action.finish(outcome, &verdict);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type BuildCacheStream = BoxStream<pb::BuildCacheProgress>;

    async fn build_cache(
        &self,
        request: Request<pb::BuildCacheRequest>,
    ) -> Result<Response<Self::BuildCacheStream>, Status> {
        let mut action = self.admit(
            &request,
            Operation::BuildCache,
            &[("model", &request.get_ref().model)],
        )?;
        let model = request.into_inner().model;
        let slots = self.state.slot_manager().clone();
        let slot = slots
            .snapshot()
            .into_iter()
            .find(|s| s.model == model)
            .map(|s| s.name)
            .ok_or_else(|| {
                let config = self.state.config();
                let known: Vec<&str> = config.models.keys().map(String::as_str).collect();
                Status::not_found(format!(
                    "unknown model `{}`; known models: {}",
                    echo(&model),
                    known.join(", ")
                ))
            })
            .map_err(|status| failed(&mut action, status))?;
        let mut done = slots
            .request_build(&slot)
            .map_err(|e| failed(&mut action, slot_status(e)))?;
        tracing::info!(model = %model, slot = %slot, "cache build requested over the control socket");
        let mut changes = self.state.subscribe();
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let progress = |message: String, finished: bool, ok: bool| pb::BuildCacheProgress {
                message,
                finished,
                ok,
            };
            let mut last = String::new();
            // A client that goes away does not stop the build: it is
            // followed to its end for the record's outcome.
            let mut client_gone = false;
            loop {
                if let Some(view) = slots.view(&slot) {
                    let line = format!("slot {slot}: {:?}: {}", view.state, view.reason);
                    if line != last {
                        client_gone = client_gone
                            || tx
                                .send(Ok(progress(line.clone(), false, false)))
                                .await
                                .is_err();
                        last = line;
                    }
                }
                tokio::select! {
                    result = &mut done => {
                        let last = match result {
                            Ok(Ok(message)) => progress(message, true, true),
                            Ok(Err(reason)) => progress(format!("cache build failed: {reason}"), true, false),
                            Err(_) => progress("the slot ended before the build finished".into(), true, false),
                        };
                        let outcome = if last.ok { Outcome::Ok } else { Outcome::Failed };
                        action.finish(outcome, &last.message);
                        let _ = tx.send(Ok(last)).await;
                        return;
                    }
                    changed = changes.changed() => if changed.is_err() { return },
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type TrialStream = BoxStream<pb::TrialEvent>;

    async fn trial(
        &self,
        request: Request<tonic::Streaming<pb::TrialRequest>>,
    ) -> Result<Response<Self::TrialStream>, Status> {
        let mut action = self.admit(&request, Operation::Trial, &[])?;
        let mut inbound = request.into_inner();
        // The answer's headers go out at once: a client may send its first
        // arm only once the call is open.
        let (tx, rx) = mpsc::channel(64);
        let state = self.state.clone();
        tokio::spawn(async move {
            let first = match inbound.message().await {
                Ok(Some(pb::TrialRequest {
                    step: Some(pb::trial_request::Step::Arm(arm)),
                })) => arm,
                Ok(_) => {
                    let refusal = Status::invalid_argument(
                        "the first message of Trial must be an arm naming the model",
                    );
                    let _ = tx.send(Err(failed(&mut action, refusal))).await;
                    return;
                }
                Err(_) => return,
            };
            action.arg("model", &first.model);
            action.arg("arm", &first.name);
            action.arg("purpose", &first.purpose);
            let (steps, steps_rx) = mpsc::channel(1);
            let (events, mut events_rx) = mpsc::channel(16);
            // The client's later steps, until it says done or goes away
            // (then the channel closes and the trial restores).
            let reader = tokio::spawn(async move {
                while let Ok(Some(pb::TrialRequest { step: Some(step) })) = inbound.message().await
                {
                    let step = match step {
                        pb::trial_request::Step::Arm(arm) => crate::trial::Step::Arm(arm),
                        pb::trial_request::Step::Done(_) => crate::trial::Step::Done,
                    };
                    if steps.send(step).await.is_err() {
                        break;
                    }
                }
            });
            let trial = tokio::spawn(crate::trial::run(state.clone(), first, steps_rx, events));
            let mut client_gone = false;
            while let Some(event) = events_rx.recv().await {
                let event = event
                    .map(|e| pb::TrialEvent {
                        kind: e.kind as i32,
                        message: e.message,
                        slots: e
                            .slots
                            .iter()
                            .map(|v| convert::slot_of(&state, v))
                            .collect(),
                        ok: e.ok,
                    })
                    .map_err(trial_status);
                // The trial's outcome: whether the configured definition
                // came back (RESTORED), or why the trial did not run.
                match &event {
                    Ok(e) if e.kind == pb::trial_event::Kind::Restored as i32 => {
                        let outcome = if e.ok { Outcome::Ok } else { Outcome::Failed };
                        action.finish(outcome, &e.message);
                    }
                    Ok(_) => {}
                    Err(status) => action.finish(Outcome::Failed, status.message()),
                }
                if !client_gone && tx.send(event).await.is_err() {
                    // The client is gone: the reader ends with its stream,
                    // and the trial restores the definition by itself;
                    // its events are still read, for the record's outcome.
                    client_gone = true;
                }
            }
            let _ = trial.await;
            reader.abort();
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type BorrowCardsStream = BoxStream<pb::BorrowEvent>;

    async fn borrow_cards(
        &self,
        request: Request<tonic::Streaming<pb::BorrowRequest>>,
    ) -> Result<Response<Self::BorrowCardsStream>, Status> {
        let mut action = self.admit(&request, Operation::BorrowCards, &[])?;
        let mut inbound = request.into_inner();
        let start = match inbound
            .message()
            .await
            .map_err(|status| failed(&mut action, status))?
        {
            Some(pb::BorrowRequest {
                step: Some(pb::borrow_request::Step::Start(start)),
            }) => start,
            _ => {
                return Err(failed(
                    &mut action,
                    Status::invalid_argument(
                        "the first message of BorrowCards must be `start` naming the cards",
                    ),
                ))
            }
        };
        action.arg("cards", &start.cards.join(","));
        action.arg("purpose", &start.purpose);
        tracing::info!(cards = %echo(&start.cards.join(",")), purpose = %echo(&start.purpose), "borrow requested over the control socket");
        let (tx, rx) = mpsc::channel(64);
        let (ended, end) = tokio::sync::oneshot::channel();
        // The loan lasts until the borrower says done; a stream that ends
        // or fails otherwise means it went away.
        tokio::spawn(async move {
            let exit = match inbound.message().await {
                Ok(Some(pb::BorrowRequest {
                    step: Some(pb::borrow_request::Step::Done(done)),
                })) => Some(done.exit_code),
                _ => None,
            };
            let _ = ended.send(exit);
        });
        // The loan's events pass through here on their way to the borrower,
        // so its record is written when the loan ends (RETURNED, or the
        // error that ended it), even after the borrower went away.
        let (loan_tx, mut loan_rx) = mpsc::channel(64);
        tokio::spawn(crate::borrow::run(self.state.clone(), start, end, loan_tx));
        tokio::spawn(async move {
            while let Some(event) = loan_rx.recv().await {
                let event = event.map_err(loan_status);
                match &event {
                    Ok(e) if e.kind == pb::borrow_event::Kind::Returned as i32 => {
                        let outcome = if e.ok { Outcome::Ok } else { Outcome::Failed };
                        action.finish(outcome, &e.message);
                    }
                    Ok(_) => {}
                    Err(status) => action.finish(Outcome::Failed, status.message()),
                }
                // A borrower that went away still has its cards taken
                // back: keep reading until the loan ends.
                let _ = tx.send(event).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn reload(
        &self,
        request: Request<pb::ReloadRequest>,
    ) -> Result<Response<pb::ReloadReport>, Status> {
        // A dry run applies and records nothing, so whoever may read status
        // may ask for one; a real reload is destructive.
        let op = if request.get_ref().dry_run {
            Operation::ReloadDryRun
        } else {
            Operation::Reload
        };
        let dry_run = request.get_ref().dry_run.to_string();
        let no_wait = request.get_ref().no_wait.to_string();
        let mut action = self.admit(
            &request,
            op,
            &[("dry_run", &dry_run), ("no_wait", &no_wait)],
        )?;
        // The config file is root's: a caller who may not reload sees which
        // keys change, not their values.
        let show_values = self.rule.is_admin(&request);
        let request = request.into_inner();
        let options = crate::reload::Options {
            dry_run: request.dry_run,
            wait: !request.no_wait,
            show_values,
        };
        // Its own task: a client that goes away must not cancel a reload
        // halfway through applying it.
        let state = self.state.clone();
        let report =
            tokio::spawn(async move { crate::reload::reload(&state, "ttctl", options).await })
                .await
                .map_err(|e| Status::internal(format!("the reload task failed: {e}")));
        match &report {
            // A refused file is the reload's failure, answered as a report.
            Ok(r) if r.outcome == pb::ReloadOutcome::Refused as i32 => {
                let detail = format!("{}: {}", r.summary, r.problems.join("; "));
                action.finish(Outcome::Failed, &detail);
            }
            Ok(r) => action.finish(Outcome::Ok, &r.summary),
            Err(status) => action.finish(Outcome::Failed, status.message()),
        }
        Ok(Response::new(report?))
    }

    async fn restart_slot(
        &self,
        request: Request<pb::SlotRequest>,
    ) -> Result<Response<pb::SlotReply>, Status> {
        let action = self.admit(
            &request,
            Operation::RestartSlot,
            &[("slot", &request.get_ref().slot)],
        )?;
        let slot = request.into_inner().slot;
        // The slot as the request found it, not as the restart leaves it:
        // the supervisor drains and restarts after this reply, and ttctl
        // follows it with WatchStatus. The record's outcome is the
        // request's: queued to the supervisor, or refused.
        let view = self
            .state
            .slot_manager()
            .request_restart(&slot)
            .map_err(slot_status);
        let view = settle(action, view, |v| {
            format!("slot {} restart queued (it was {})", v.name, v.state.word())
        })?;
        tracing::info!(slot = %slot, "restart requested over the control socket");
        Ok(Response::new(pb::SlotReply {
            slot: Some(convert::slot(&view)),
        }))
    }

    async fn stop_slot(
        &self,
        request: Request<pb::SlotRequest>,
    ) -> Result<Response<pb::SlotReply>, Status> {
        let action = self.admit(
            &request,
            Operation::StopSlot,
            &[("slot", &request.get_ref().slot)],
        )?;
        let slot = request.into_inner().slot;
        let slots = self.state.slot_manager();
        let view = match slots
            .view(&slot)
            .filter(|v| v.state == crate::slots::SlotState::Stopped)
        {
            Some(view) => Err(Status::failed_precondition(format!(
                "slot {} is already stopped: {}",
                view.name, view.reason
            ))),
            None => slots.request_hold(&slot).map_err(slot_status),
        };
        let view = settle(action, view, |v| {
            format!("slot {} stop queued (it was {})", v.name, v.state.word())
        })?;
        tracing::info!(slot = %slot, "stop requested over the control socket");
        Ok(Response::new(pb::SlotReply {
            slot: Some(convert::slot(&view)),
        }))
    }

    async fn start_slot(
        &self,
        request: Request<pb::SlotRequest>,
    ) -> Result<Response<pb::SlotReply>, Status> {
        let action = self.admit(
            &request,
            Operation::StartSlot,
            &[("slot", &request.get_ref().slot)],
        )?;
        let slot = request.into_inner().slot;
        let view = settle(action, self.start_stopped(&slot), |v| {
            format!("slot {} start queued (it was {})", v.name, v.state.word())
        })?;
        tracing::info!(slot = %slot, "start requested over the control socket");
        Ok(Response::new(pb::SlotReply {
            slot: Some(convert::slot(&view)),
        }))
    }

    async fn audit(
        &self,
        request: Request<pb::AuditRequest>,
    ) -> Result<Response<pb::AuditResponse>, Status> {
        self.admit(&request, Operation::ReadAudit, &[])?;
        let request = request.into_inner();
        let trail = self.trail.clone();
        let limit = request.limit as usize;
        let reading = tokio::task::spawn_blocking(move || trail.read(request.since_unix_ms, limit))
            .await
            .map_err(|e| Status::internal(format!("reading the audit trail stopped: {e}")))?
            .map_err(|e| {
                Status::internal(format!(
                    "cannot read the audit trail {}: {e}",
                    self.trail.path().display()
                ))
            })?;
        if reading.skipped > 0 {
            tracing::warn!(target: crate::audit::FILE_TARGET, path = %self.trail.path().display(), skipped = reading.skipped, "audit trail lines that cannot be read were left out");
        }
        Ok(Response::new(pb::AuditResponse {
            records: reading
                .records
                .into_iter()
                .map(|(unix_ms, r)| pb::AuditRecord {
                    at: r.at,
                    unix_ms,
                    uid: r.uid,
                    user: r.user.unwrap_or_default(),
                    pid: r.pid,
                    admitted: r.admitted,
                    operation: r.operation,
                    args: r.args,
                    outcome: r.outcome.word().to_string(),
                    detail: r.detail,
                    took_ms: r.took_ms,
                })
                .collect(),
            skipped: u32::try_from(reading.skipped).unwrap_or(u32::MAX),
            path: self.trail.path().display().to_string(),
        }))
    }

    async fn usage(
        &self,
        request: Request<pb::UsageRequest>,
    ) -> Result<Response<pb::UsageResponse>, Status> {
        self.admit(&request, Operation::ReadUsage, &[])?;
        let request = request.into_inner();
        let ledger = Arc::new(Ledger::new(&self.state.config().daemon.state_dir));
        let reader = ledger.clone();
        let key = (!request.key.is_empty()).then_some(request.key);
        let sum =
            tokio::task::spawn_blocking(move || reader.sum(request.since_unix_ms, key.as_deref()))
                .await
                .map_err(|e| Status::internal(format!("reading the usage ledger stopped: {e}")))?
                .map_err(|e| {
                    Status::internal(format!(
                        "cannot read the usage ledger {}: {e}",
                        ledger.path().display()
                    ))
                })?;
        if sum.skipped > 0 {
            tracing::warn!(path = %ledger.path().display(), skipped = sum.skipped, "usage ledger lines that cannot be read were left out");
        }
        Ok(Response::new(pb::UsageResponse {
            usage: sum
                .by_key
                .into_iter()
                .map(|((key, model), c)| pb::KeyUsage {
                    key,
                    model,
                    requests: c.requests,
                    prompt_tokens: c.prompt_tokens,
                    cached_prompt_tokens: c.cached_prompt_tokens,
                    completion_tokens: c.completion_tokens,
                    refused: c.refused,
                    errors: c.errors,
                    stalled: c.stalled,
                })
                .collect(),
            skipped: u32::try_from(sum.skipped).unwrap_or(u32::MAX),
            path: ledger.path().display().to_string(),
        }))
    }

    type LogsStream = BoxStream<pb::LogLine>;

    async fn logs(
        &self,
        request: Request<pb::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        self.rule.authorize(&request, Operation::Logs)?;
        let request = request.into_inner();
        let slots = self.state.slot_manager();
        let ring = slots.logs(&request.slot).ok_or_else(|| {
            let names: Vec<String> = slots.snapshot().into_iter().map(|s| s.name).collect();
            Status::not_found(format!(
                "no slot `{}`; slots: {}",
                echo(&request.slot),
                if names.is_empty() {
                    "(none configured)".into()
                } else {
                    names.join(", ")
                }
            ))
        })?;
        // Subscribe before reading the backlog so no line falls between.
        let mut follow = ring.subscribe();
        let lines = if request.lines == 0 {
            usize::MAX
        } else {
            request.lines as usize
        };
        let backlog = ring.tail(lines);
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            for line in backlog {
                if tx.send(Ok(convert::log_line(&line))).await.is_err() {
                    return;
                }
            }
            if !request.follow {
                return;
            }
            loop {
                tokio::select! {
                    next = follow.recv() => match next {
                        Ok(line) => {
                            if tx.send(Ok(convert::log_line(&line))).await.is_err() {
                                return;
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            let note = pb::LogLine {
                                unix_ms: 0,
                                stream: "ttctl".into(),
                                text: format!("... {n} lines skipped (the reader fell behind) ..."),
                            };
                            if tx.send(Ok(note)).await.is_err() {
                                return;
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type GenerateStream = BoxStream<pb::GenerateResponse>;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        self.rule.authorize(&request, Operation::Generate)?;
        super::route::generate(&self.state, "control", request, |stream| stream).await
    }

    async fn list_cache(
        &self,
        request: Request<pb::ListCacheRequest>,
    ) -> Result<Response<pb::ListCacheResponse>, Status> {
        self.rule.authorize(&request, Operation::ListCache)?;
        let cache_dir = self.state.config().daemon.cache_dir.clone();
        let slots = self.state.slots();
        let variants = tokio::task::spawn_blocking(move || {
            crate::cache::list_variants(&cache_dir)
                .into_iter()
                .map(|(model, key, dir)| {
                    let (state, reason, files) = match crate::cache::state_of(&dir) {
                        CacheState::Warm { files, .. } => ("warm", String::new(), files as u32),
                        CacheState::Cold => ("cold", String::new(), 0),
                        CacheState::Incomplete { reason } => ("incomplete", reason, 0),
                    };
                    let mut inputs: std::collections::BTreeMap<String, String> =
                        std::fs::read(dir.join(crate::cache::DESCRIPTION))
                            .ok()
                            .and_then(|b| serde_json::from_slice(&b).ok())
                            .unwrap_or_default();
                    let arms = crate::cache::built_arms(&dir);
                    if !arms.is_empty() {
                        inputs.insert("arms built".into(), arms.join("; "));
                    }
                    pb::CacheVariant {
                        used_by: slots
                            .iter()
                            .filter(|s| s.model == model && s.variant == key)
                            .map(|s| s.name.clone())
                            .collect(),
                        bytes: crate::cache::dir_size(&dir),
                        model,
                        key,
                        state: state.into(),
                        reason,
                        files,
                        inputs,
                    }
                })
                .collect()
        })
        .await
        .map_err(|e| Status::internal(format!("cache listing failed: {e}")))?;
        let config = self.state.config();
        Ok(Response::new(pb::ListCacheResponse {
            variants,
            cache_dir: config.daemon.cache_dir.display().to_string(),
            models: config.models.keys().cloned().collect(),
        }))
    }

    async fn remove_cache(
        &self,
        request: Request<pb::RemoveCacheRequest>,
    ) -> Result<Response<pb::RemoveCacheResponse>, Status> {
        let action = self.admit(
            &request,
            Operation::RemoveCache,
            &[("key", &request.get_ref().key)],
        )?;
        let key = request.into_inner().key;
        let removed = self.remove_variant(&key).await;
        settle(action, removed, |r| {
            format!("removed {} ({} MiB)", r.path, r.bytes >> 20)
        })
        .map(Response::new)
    }
}

impl ControlService {
    /// `StartSlot`'s work: queue a start of a slot that is stopped.
    fn start_stopped(&self, slot: &str) -> Result<crate::slots::SlotView, Status> {
        let slots = self.state.slot_manager();
        // Starting what already starts or serves would restart it: that
        // is `slot restart`, asked for by name.
        if let Some(view) = slots.view(slot) {
            use crate::slots::SlotState;
            if view.reason == crate::slots::Park::Lent.reason(&view.name) {
                return Err(Status::failed_precondition(format!(
                    "slot {} is stopped because its cards are lent out (ttctl card borrow); it starts again when the loan ends",
                    view.name
                )));
            }
            if !matches!(view.state, SlotState::Stopped | SlotState::Failed) {
                return Err(Status::failed_precondition(format!(
                    "slot {} is {} ({}), not stopped; `ttctl slot restart {}` restarts it",
                    view.name,
                    view.state.word(),
                    view.reason,
                    view.name
                )));
            }
        }
        slots.request_restart(slot).map_err(slot_status)
    }

    /// `RemoveCache`'s work: remove variant `key` if no slot uses it.
    async fn remove_variant(&self, key: &str) -> Result<pb::RemoveCacheResponse, Status> {
        let cache_dir = &self.state.config().daemon.cache_dir;
        let (model, _, dir) = crate::cache::list_variants(cache_dir)
            .into_iter()
            .find(|(_, k, _)| *k == key)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "no cache variant `{}`; `ttctl cache ls` lists them",
                    echo(key)
                ))
            })?;
        let busy = self.state.slot_manager().using_variant(&model, key);
        if !busy.is_empty() {
            return Err(Status::failed_precondition(format!(
                "cache variant {key} is in use by slot(s) {}; removing it under a running worker would break it",
                busy.join(", ")
            )));
        }
        // A variant is gigabytes of tensors: walked and removed off the
        // runtime, which relays tokens meanwhile.
        let removing = dir.clone();
        let bytes = tokio::task::spawn_blocking(move || crate::cache::remove(&removing))
            .await
            .map_err(|e| Status::internal(format!("removing {} stopped: {e}", dir.display())))?
            .map_err(|e| Status::internal(format!("cannot remove {}: {e}", dir.display())))?;
        tracing::info!(variant = %key, model = %model, bytes, "cache variant removed");
        Ok(pb::RemoveCacheResponse {
            path: dir.display().to_string(),
            bytes,
        })
    }
}

/// `VerifyCache`'s work, on a blocking thread: each complete variant
/// hashed with progress, then one verdict line per variant.
fn verify_variants(
    model: &str,
    variants: &[(String, std::path::PathBuf)],
    tx: &mpsc::Sender<Result<pb::VerifyCacheProgress, Status>>,
) -> (bool, String) {
    use crate::cache::digest::{verify, Verdict};
    let send = |message: String, finished: bool, ok: bool, done: u64, total: u64| {
        tx.blocking_send(Ok(pb::VerifyCacheProgress {
            message,
            finished,
            ok,
            bytes_done: done,
            bytes_total: total,
        }))
        .is_ok()
    };
    let complete: Vec<_> = variants
        .iter()
        .filter(|(_, dir)| crate::cache::read_marker(dir).is_ok())
        .collect();
    if complete.is_empty() {
        let message = format!(
            "model {model} has no complete cache variant to verify; its next start builds one cold"
        );
        send(message.clone(), true, false, 0, 0);
        return (false, message);
    }
    let (mut ok, mut verdicts, mut base) = (true, Vec::new(), 0u64);
    let mut last_sent = std::time::Instant::now();
    for (key, dir) in complete {
        let mut total_here = 0;
        let verdict = verify(dir, &mut |p| {
            total_here = p.bytes_total;
            // A line per file, and at most one a second in between.
            if p.files_done == p.files_total
                || last_sent.elapsed().as_secs() >= 1
                || p.bytes_done == 0
            {
                last_sent = std::time::Instant::now();
                send(
                    format!(
                        "variant {key}: {}/{} files, {} of {} MiB hashed",
                        p.files_done,
                        p.files_total,
                        p.bytes_done >> 20,
                        p.bytes_total >> 20
                    ),
                    false,
                    false,
                    base + p.bytes_done,
                    base + p.bytes_total,
                );
            }
        });
        base += total_here;
        let line = match verdict {
            Ok(Verdict::Verified { files, bytes }) => format!(
                "variant {key}: verified: {files} files, {} MiB, as recorded at its build",
                bytes >> 20
            ),
            Ok(Verdict::Mismatch(bad)) => {
                ok = false;
                format!(
                    "variant {key}: FAILED: {}; the variant is invalidated and its next start builds it cold",
                    bad.join("; ")
                )
            }
            Ok(Verdict::Unverifiable(why)) => {
                ok = false;
                format!("variant {key}: not verified: {why}")
            }
            Err(e) => {
                ok = false;
                format!("variant {key}: cannot be verified: {e}")
            }
        };
        tracing::info!(model = %model, variant = %key, verdict = %line, "cache verification");
        verdicts.push(line);
    }
    let verdict = verdicts.join("\n");
    send(verdict.clone(), true, ok, base, base);
    (ok, verdict)
}

fn slot_status(err: SlotError) -> Status {
    match &err {
        SlotError::NoSuchSlot { .. } => Status::not_found(err.to_string()),
        // The slot is there but cannot take requests now: retry later.
        SlotError::SupervisorEnded(_) => Status::unavailable(err.to_string()),
        SlotError::CardInUse { .. } => Status::failed_precondition(err.to_string()),
    }
}

fn loan_status(err: LoanError) -> Status {
    match err {
        LoanError::Card(e) => card_status(e),
        LoanError::Slot(e) => slot_status(e),
        LoanError::NoCards => Status::invalid_argument(err.to_string()),
        LoanError::SlotsDidNotStop { .. } => Status::deadline_exceeded(err.to_string()),
        LoanError::NotLent(_) => Status::failed_precondition(err.to_string()),
    }
}

fn trial_status(err: TrialError) -> Status {
    match err {
        TrialError::NoSuchModel { .. } => Status::not_found(err.to_string()),
    }
}

fn card_status(err: CardError) -> Status {
    match &err {
        CardError::NotFound(_) => Status::not_found(err.to_string()),
        CardError::Locked(_) => Status::failed_precondition(err.to_string()),
        CardError::Busy(_) => Status::aborted(err.to_string()),
        CardError::ResetFailed(_) => Status::internal(err.to_string()),
        // A card that is not there: nothing was tried, the operator must
        // bring it back first.
        CardError::NotAttempted(_) => Status::failed_precondition(err.to_string()),
    }
}
