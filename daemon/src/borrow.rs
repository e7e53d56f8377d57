//! Lending cards to an outside job (`ttctl card borrow`).
//!
//! Benchmarks and firmware checks need the cards too, and the field had to
//! refuse sweeps while the service ran. A loan is safe: the slots on the
//! cards drain and stop cleanly, the daemon releases the locks, the borrower
//! takes them and runs its job, and when the borrower is done (or goes away)
//! the daemon takes the locks back, resets and proves the cards (the job may
//! have left them in any state) and restarts the slots.

use crate::cards::CardError;
use crate::slots::{SlotCommand, SlotError, SlotState};
use crate::state::DaemonState;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::borrow_event::Kind;

/// Why a loan did not start (the cards stay with the daemon).
#[derive(Debug, thiserror::Error)]
pub enum LoanError {
    /// A card name that names no card.
    #[error(transparent)]
    Card(#[from] CardError),
    /// No card named.
    #[error("cards: name at least one card (index or BDF)")]
    NoCards,
    /// A slot on the cards could not be asked to drain.
    #[error(transparent)]
    Slot(#[from] SlotError),
    /// The slots on the cards did not stop in time; they restart.
    #[error(
        "slots did not stop within {secs}s: {running}; the loan is abandoned and the slots restart"
    )]
    SlotsDidNotStop {
        /// The stop limit.
        secs: u64,
        /// The slots still running, with their states.
        running: String,
    },
    /// The cards could not be handed over (their locks).
    #[error("{0}")]
    NotLent(String),
}

/// How the borrower ended the loan: its job's exit code, or `None` when
/// it went away without saying.
pub type LoanEnd = Option<i32>;

fn event(kind: Kind, message: impl Into<String>) -> Result<pb::BorrowEvent, LoanError> {
    Ok(pb::BorrowEvent {
        kind: kind as i32,
        message: message.into(),
        ..Default::default()
    })
}

/// Run one loan; events go to `tx`. Errors before the cards are lent end
/// the stream with a [`LoanError`]. The loan lasts until `ended` says the
/// borrower is done (or is dropped: it went away).
pub async fn run(
    state: Arc<DaemonState>,
    start: pb::BorrowStart,
    ended: oneshot::Receiver<LoanEnd>,
    tx: mpsc::Sender<Result<pb::BorrowEvent, LoanError>>,
) {
    let cards = state.cards().clone();
    let mut bdfs = Vec::new();
    for name in &start.cards {
        match cards.resolve_name(name) {
            Ok(bdf) if !bdfs.contains(&bdf) => bdfs.push(bdf),
            Ok(_) => {}
            Err(e) => {
                let _ = tx.send(Err(e.into())).await;
                return;
            }
        }
    }
    if bdfs.is_empty() {
        let _ = tx.send(Err(LoanError::NoCards)).await;
        return;
    }
    let slots = state.slot_manager().clone();
    let affected: Vec<String> = slots
        .snapshot()
        .into_iter()
        .filter(|s| s.cards.iter().any(|c| bdfs.contains(c)))
        .map(|s| s.name)
        .collect();
    for slot in &affected {
        let _ = tx
            .send(event(Kind::Progress, format!("draining slot {slot}")))
            .await;
        if let Err(e) = slots.command(slot, SlotCommand::Lend) {
            let _ = tx.send(Err(e.into())).await;
            return;
        }
    }
    // Wait until every affected slot has stopped its worker.
    let limit = state.config().stop_limit();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let notified = slots.changed.notified();
        let running: Vec<String> = slots
            .snapshot()
            .into_iter()
            .filter(|s| affected.contains(&s.name) && s.state != SlotState::Stopped)
            .map(|s| format!("{} ({:?})", s.name, s.state))
            .collect();
        if running.is_empty() {
            break;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            let _ = tx
                .send(Err(LoanError::SlotsDidNotStop {
                    secs: limit.as_secs(),
                    running: running.join(", "),
                }))
                .await;
            for slot in &affected {
                let _ = slots.command(slot, SlotCommand::Restart);
            }
            return;
        }
    }
    if let Err(e) = cards.lend(&bdfs, &start.purpose) {
        let _ = tx.send(Err(LoanError::NotLent(e.to_string()))).await;
        for slot in &affected {
            let _ = slots.command(slot, SlotCommand::Restart);
        }
        return;
    }
    let _ = tx
        .send(Ok(pb::BorrowEvent {
            kind: Kind::Lent as i32,
            message: format!("lent {}; take their locks and run the job", bdfs.join(",")),
            bdfs: bdfs.clone(),
            ok: true,
        }))
        .await;

    // The loan lasts until the borrower says done or goes away.
    match ended.await {
        Ok(Some(exit_code)) => {
            tracing::info!(cards = %bdfs.join(","), exit_code, "borrower finished")
        }
        Ok(None) | Err(_) => {
            tracing::warn!(cards = %bdfs.join(","), "borrower went away; taking the cards back")
        }
    }
    cards.take_back(&bdfs);
    // The job's processes inherited the borrower's locks, so the daemon
    // gets them back only once every process of the job is gone (a job that
    // outlived a killed ttctl included); and a process that has a card open
    // without its lock keeps the card from reuse too. Until then the cards
    // show who holds them, and nothing resets them or starts on them.
    let mut waited = 0u64;
    loop {
        // Discovery and the lock and user checks read sysfs and every
        // card user's /proc; off the runtime, which relays tokens meanwhile.
        let check = {
            let (cards, bdfs) = (cards.clone(), bdfs.clone());
            tokio::task::spawn_blocking(move || {
                cards.refresh();
                let users = cards.foreign_users(&bdfs);
                (cards.holds_all(&bdfs), users)
            })
            .await
        };
        let (held, users) = match check {
            Ok(check) => check,
            Err(e) => {
                tracing::error!(cards = %bdfs.join(","), error = %e, "checking the returned cards failed; trying again");
                (false, Vec::new())
            }
        };
        if held && users.is_empty() {
            break;
        }
        if waited.is_multiple_of(50) {
            let who = if users.is_empty() {
                "the borrower".to_string()
            } else {
                users.join("; ")
            };
            let message = format!(
                "waiting for {who} to let go of {} before the reset",
                bdfs.join(",")
            );
            tracing::info!(cards = %bdfs.join(","), "{message}");
            let _ = tx.send(event(Kind::Progress, message)).await;
        }
        waited += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = tx
        .send(event(Kind::Progress, "resetting the returned cards"))
        .await;
    let progress = tx.clone();
    let mut on_event = move |e: crate::cards::reset::ResetEvent| {
        let _ = progress.try_send(event(Kind::Progress, e.message));
    };
    let reset = cards.reset(&bdfs, false, &mut on_event).await;
    for slot in &affected {
        let _ = slots.command(slot, SlotCommand::Restart);
    }
    let (ok, message) = match reset {
        Ok(_) => (
            true,
            format!(
                "cards {} reset and proven back; slot(s) restarting: {}",
                bdfs.join(","),
                if affected.is_empty() {
                    "none".to_string()
                } else {
                    affected.join(", ")
                }
            ),
        ),
        Err(e) => (false, format!("{e}")),
    };
    let _ = tx
        .send(Ok(pb::BorrowEvent {
            kind: Kind::Returned as i32,
            message,
            bdfs,
            ok,
        }))
        .await;
}
