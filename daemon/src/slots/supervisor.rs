//! One task per slot drives its lifecycle:
//! `Locking → Resetting → Probing → Starting → Loading → Verifying → Ready`,
//! then watches the worker until it exits, hangs, outgrows its memory
//! limit, or is told to stop; failures back off and retry, and give up
//! after the configured attempts until `ttctl slot restart`.
//!
//! Layout: this file is the loop (cards, dirty resets, the outcome of each
//! attempt, commands, backoff) and the ways a worker stops; `start.rs` is
//! one start attempt as phases; `watchdog.rs` is the Ready watchdog;
//! `backoff.rs` the restart policy.
//!
//! Field rules applied here: any exit that was not a requested clean stop
//! leaves the cards dirty, and they are reset and proven before the next
//! start; a slot is Ready only after a real inference ping and the banner
//! rule; a warm start is guarded against generating cache files.

use super::attempt::{Outcome, SlotPlan};
use super::backoff::{Backoff, Failure, Verdict};
use super::{Park, SlotCommand, SlotManager, SlotState};
use crate::cards::CardState;
use crate::worker;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc::UnboundedReceiver;

/// What the loop does next.
enum Next {
    /// Make another start attempt.
    Start,
    /// End the supervisor: the slot is Stopped.
    Stop,
}

/// The plan of a slot from the config in force, with its socket directory
/// made; None (the slot marked Failed) when that fails.
fn plan(mgr: &Arc<SlotManager>, slot: &str) -> Option<SlotPlan> {
    let view = mgr.view(slot)?;
    let config = mgr.config();
    let m = config.models.get(&view.model).cloned()?;
    let socket_dir = config.daemon.worker_socket_dir();
    mgr.set_definition(slot, m.clone());
    if let Err(e) = crate::hostfs::create_dir_all_no_follow(&socket_dir) {
        mgr.transition(
            slot,
            SlotState::Failed,
            format!("cannot create {}: {e}", socket_dir.display()),
        );
        return None;
    }
    Some(SlotPlan {
        socket: socket_dir.join(format!("{}.sock", slot.replace('/', "_"))),
        worker_command: worker::command_for(&m),
        slot: slot.to_string(),
        model: view.model.clone(),
        cards: view.cards.clone(),
        cache_dir: config.daemon.cache_dir.clone(),
        tick: Duration::from_millis(config.daemon.tick_ms),
        health_timeout: config.daemon.health_poll_timeout(),
        captures: crate::hang::dir_for(&config.daemon.state_dir, slot),
        m,
    })
}

/// Output lines of a failed attempt that its fingerprint reads.
const FINGERPRINT_LINES: usize = 40;

/// The supervisor task of one slot.
pub async fn run(
    mgr: Arc<SlotManager>,
    slot: String,
    mut commands: UnboundedReceiver<SlotCommand>,
) {
    let Some(plan) = plan(&mgr, &slot) else {
        return;
    };
    // Cards an earlier worker on them left dirty (a slot replaced by a
    // reload, or a previous daemon run) are reset before this slot's first
    // start too.
    let recorded_dirty = mgr.cards().dirty_cards();
    let mut dirty = plan.cards.iter().any(|c| recorded_dirty.contains(c));
    let mut backoff = Backoff::new(&plan.m.restart);
    loop {
        if !wait_for_cards(&mgr, &plan, &mut commands).await {
            return stopped(&mgr, &slot);
        }
        let before_start = !dirty && plan.m.resets_before_every_start();
        if dirty || before_start {
            mgr.update(&slot, |v| v.resets_since_served += 1);
            let why = if dirty {
                "resetting the cards after an unclean worker exit"
            } else {
                // reset_before_start: a clean stop of a cabled pair can leave
                // its Ethernet cores unresettable for the next open.
                "resetting the cards before the start (reset_before_start: always, the default for two or more cards; tt-metal issue 53281)"
            };
            if !reset_cards(&mgr, &plan, why).await {
                // Quarantined: wait_for_cards waits for an operator; a
                // card missing: it waits for the card.
                continue;
            }
            dirty = false;
        }
        mgr.update(&slot, |v| v.attempt = backoff.attempt());
        let served_before = mgr.view(&slot).map_or(0, |v| v.served);
        let began = Instant::now();
        let began_at = SystemTime::now();
        let next = match super::start::start_and_serve(&mgr, &plan, &mut commands).await {
            Outcome::Stopped => Next::Stop,
            Outcome::Restart { reason, dirty: d } => {
                tracing::info!(slot = %slot, %reason, "restarting slot");
                dirty |= d;
                backoff.clear();
                Next::Start
            }
            Outcome::Built { reason } => {
                tracing::info!(slot = %slot, %reason, "cache built; starting the slot warm");
                backoff.clear();
                Next::Start
            }
            Outcome::Parked(why) => {
                backoff.clear();
                park(&mgr, &slot, why, &mut commands).await
            }
            Outcome::Failed {
                reason,
                dirty: d,
                cause,
            } => {
                dirty |= d;
                crate::metrics::get().worker_restart(&slot, &plan.model, cause.label());
                mgr.update(&slot, |v| {
                    v.last_error = reason.clone();
                    v.worker_pid = 0;
                    v.worker_rss_bytes = 0;
                    v.memory_growth.clear();
                    v.memory_growth_per_hour = 0;
                });
                // The attempt's own last lines of output (not the three its
                // reason quotes: which come last is timing).
                let since_ms = began_at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                let output: Vec<String> = mgr
                    .logs(&slot)
                    .map(|ring| ring.tail(FINGERPRINT_LINES))
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|line| line.unix_ms >= since_ms)
                    .map(|line| line.text)
                    .collect();
                let fingerprint = super::backoff::Fingerprint::of(cause.label(), &reason, &output);
                let failure = Failure {
                    fingerprint: &fingerprint,
                    took: began.elapsed(),
                    served: mgr.view(&slot).map_or(0, |v| v.served) > served_before,
                };
                after_failure(&mgr, &plan, &mut backoff, reason, failure, &mut commands).await
            }
        };
        if let Next::Stop = next {
            return stopped(&mgr, &slot);
        }
    }
}

/// The slot is Stopped and its supervisor ends.
fn stopped(mgr: &Arc<SlotManager>, slot: &str) {
    mgr.update(slot, |v| {
        v.worker_pid = 0;
        v.worker_rss_bytes = 0;
        v.memory_growth.clear();
        v.memory_growth_per_hour = 0;
    });
    mgr.transition(slot, SlotState::Stopped, "stopped on request");
}

/// After a failed attempt: back off and retry, or give up and wait for an
/// operator; either wait ends early on a command.
async fn after_failure(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    backoff: &mut Backoff,
    reason: String,
    failure: Failure<'_>,
    commands: &mut UnboundedReceiver<SlotCommand>,
) -> Next {
    let slot = &plan.slot;
    let took = failure.took.as_secs_f64();
    let resets = mgr.view(slot).map_or(0, |v| v.resets_since_served);
    let cost =
        format!("the attempt ran {took:.1}s; {resets} card reset(s) since the slot last served");
    match backoff.fail(Instant::now(), failure) {
        Verdict::GiveUp(why) => {
            mgr.transition(
                slot,
                SlotState::Failed,
                format!(
                    "gave up after {why}; last: {reason} ({cost}). Fix the cause, then `ttctl slot restart {slot}`",
                ),
            );
            let cmd = commands.recv().await;
            on_command(mgr, slot, cmd, backoff, commands).await
        }
        Verdict::Retry {
            delay,
            attempt,
            max_attempts,
        } => {
            mgr.retry_later(
                slot,
                format!(
                    "{reason}; retrying in {} ms (attempt {attempt} of {max_attempts}; {cost})",
                    delay.as_millis()
                ),
                SystemTime::now() + delay,
            );
            tokio::select! {
                _ = tokio::time::sleep(delay) => Next::Start,
                cmd = commands.recv() => on_command(mgr, slot, cmd, backoff, commands).await,
            }
        }
    }
}

/// A command that arrives while no worker runs: Restart starts afresh,
/// Lend parks the slot until the cards come back, Stop (or the manager
/// going away) ends it.
async fn on_command(
    mgr: &Arc<SlotManager>,
    slot: &str,
    cmd: Option<SlotCommand>,
    backoff: &mut Backoff,
    commands: &mut UnboundedReceiver<SlotCommand>,
) -> Next {
    match cmd {
        Some(SlotCommand::Restart) => {
            backoff.clear();
            Next::Start
        }
        Some(SlotCommand::Lend) => {
            backoff.clear();
            park(mgr, slot, Park::Lent, commands).await
        }
        Some(SlotCommand::Hold) => {
            backoff.clear();
            park(mgr, slot, Park::Held, commands).await
        }
        Some(SlotCommand::Stop) | None => Next::Stop,
    }
}

/// Park a slot whose cards are lent or that an operator stopped: Stopped
/// until Restart (start again) or Stop.
async fn park(
    mgr: &Arc<SlotManager>,
    slot: &str,
    why: Park,
    commands: &mut UnboundedReceiver<SlotCommand>,
) -> Next {
    mgr.update(slot, |v| {
        v.worker_pid = 0;
        v.worker_rss_bytes = 0;
        v.memory_growth.clear();
        v.memory_growth_per_hour = 0;
    });
    mgr.transition(slot, SlotState::Stopped, why.reason(slot));
    tracing::info!(slot = %slot, "{}", why.reason(slot));
    loop {
        match commands.recv().await {
            Some(SlotCommand::Restart) => return Next::Start,
            Some(SlotCommand::Lend | SlotCommand::Hold) => {}
            Some(SlotCommand::Stop) | None => return Next::Stop,
        }
    }
}

/// Reset the slot's cards (one tt-smi call) and prove them back. False
/// when they did not come back: the slot is Quarantined.
async fn reset_cards(mgr: &Arc<SlotManager>, plan: &SlotPlan, why: &str) -> bool {
    mgr.transition(&plan.slot, SlotState::Resetting, why);
    let cards = mgr.cards().clone();
    let (events_mgr, events_slot) = (mgr.clone(), plan.slot.clone());
    let mut on_event = move |e: crate::cards::reset::ResetEvent| {
        if e.phase == crate::cards::reset::Phase::WaitingForDevice {
            events_mgr.transition(&events_slot, SlotState::Probing, e.message);
        }
    };
    match cards.reset(&plan.cards, false, &mut on_event).await {
        Ok(_) => true,
        // Nothing was reset: the slot waits for the card (wait_for_cards
        // names it) and resets when it is back.
        Err(crate::cards::CardError::NotAttempted(missing)) => {
            mgr.transition(
                &plan.slot,
                SlotState::Locking,
                format!("waiting for cards: {missing}"),
            );
            false
        }
        Err(e) => {
            mgr.transition(&plan.slot, SlotState::Quarantined, format!("{e}"));
            false
        }
    }
}

/// Why each card of the slot cannot be used now (empty: all can), and
/// which are quarantined.
fn card_blockers(mgr: &Arc<SlotManager>, plan: &SlotPlan) -> (Vec<String>, Vec<String>) {
    let snapshot = mgr.cards().snapshot();
    let mut blocking = Vec::new();
    let mut quarantined = Vec::new();
    for bdf in &plan.cards {
        match snapshot.iter().find(|c| &c.bdf == bdf) {
            // Two users on one card block or corrupt each other: a process
            // that holds the chip without the daemon's lock (a borrowed
            // job's escapee, a script that skipped the lock) keeps the slot
            // from starting until it is gone. An opener that does not hold
            // the chip (a tt-smi display, an exporter) only watches.
            Some(c)
                if c.state == CardState::Ready && c.processes.iter().any(|p| p.holds_chip) =>
            {
                blocking.push(format!(
                    "card {bdf} is used by {} outside the daemon (its tt-umd chip lock names it); stop it (the slot starts when it is gone)",
                    c.processes
                        .iter()
                        .filter(|p| p.holds_chip)
                        .map(|p| format!("pid {} ({})", p.pid, p.command))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
            Some(c) if c.state == CardState::Ready => {}
            Some(c) if c.state == CardState::Quarantined => {
                quarantined.push(format!("card {bdf} is quarantined: {}", c.reason))
            }
            Some(c) if c.state == CardState::Missing => {
                blocking.push(format!("card {bdf} is missing ({})", c.reason))
            }
            Some(c) if c.reason.is_empty() => {
                blocking.push(format!("card {bdf} is {:?}", c.state))
            }
            Some(c) => blocking.push(format!("card {bdf} is {:?} ({})", c.state, c.reason)),
            None => blocking.push(format!("card {bdf} is missing (not present on the host)")),
        }
    }
    (blocking, quarantined)
}

/// Wait until every card of the slot is locked by the daemon and healthy.
/// Returns false when told to stop meanwhile.
async fn wait_for_cards(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    commands: &mut UnboundedReceiver<SlotCommand>,
) -> bool {
    let mut changes = mgr.cards().bus().subscribe();
    loop {
        changes.borrow_and_update();
        let (blocking, quarantined) = card_blockers(mgr, plan);
        if quarantined.is_empty() && blocking.is_empty() {
            return true;
        }
        if quarantined.is_empty() {
            mgr.transition(
                &plan.slot,
                SlotState::Locking,
                format!("waiting for cards: {}", blocking.join("; ")),
            );
        } else {
            mgr.transition(&plan.slot, SlotState::Quarantined, quarantined.join("; "));
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return false },
            cmd = commands.recv() => match cmd {
                Some(SlotCommand::Restart) => {}
                Some(cmd @ (SlotCommand::Lend | SlotCommand::Hold)) => {
                    let why = if cmd == SlotCommand::Lend { Park::Lent } else { Park::Held };
                    if let Next::Stop = park(mgr, &plan.slot, why, commands).await {
                        return false;
                    }
                }
                Some(SlotCommand::Stop) | None => return false,
            },
        }
    }
}
