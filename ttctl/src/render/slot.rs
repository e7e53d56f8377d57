//! `ttctl slot restart`: the line saying what the request found, and each
//! step of the restart it follows.

use tt_serving_proto::v1::{Slot, SlotState};
use tt_serving_proto::Word;

use super::one_line;

/// How `ttctl slot restart` goes on after the daemon queued the restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartFollow {
    /// It follows the slot until the restart is done or failed.
    Following,
    /// `--no-wait`: it returns at once.
    NoWait,
    /// The daemon is older than `Slot.starts`, so the restarted worker
    /// cannot be told from the old one: it returns at once.
    Unable,
}

/// The first line of `ttctl slot restart`, from the slot as the request
/// found it: `restart of slot qwen requested (it was ready, worker pid
/// 4242); ...` and what happens next. It never claims a state the restart
/// has not reached yet.
pub fn slot_restart_requested_line(before: &Slot, follow: RestartFollow) -> String {
    let was = SlotState::word(before.state);
    let found = if before.worker_pid == 0 {
        format!("it was {was}")
    } else {
        format!("it was {was}, worker pid {}", before.worker_pid)
    };
    let next = match follow {
        RestartFollow::Following => {
            "following it until a new worker is ready (Ctrl-C stops following, not the restart)"
        }
        RestartFollow::NoWait => {
            "it restarts in the background: follow it with `ttctl status --watch`"
        }
        RestartFollow::Unable => {
            "this tt-servingd does not report restarts: follow it with `ttctl status --watch`"
        }
    };
    format!(
        "restart of slot {} requested ({found}); {next}",
        before.name
    )
}

/// Where a restart stands: the slot now against the slot its request found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartStep {
    /// Still as the request found it (the supervisor has not acted yet, or
    /// the old worker finished its start): nothing to print.
    Unchanged,
    /// On its way: a line to print.
    Progress(String),
    /// A new worker is ready: the last line.
    Done(String),
    /// It failed, or cannot go on: the error (exit 1).
    Failed(String),
}

/// Compare the slot now with the slot the restart request found. The
/// start counter tells the restarted worker from the old one, so snapshots
/// that WatchStatus merged (a quick restart can skip states) still read
/// right.
pub fn restart_step(before: &Slot, now: &Slot) -> RestartStep {
    let new_start = now.starts != before.starts;
    let moved = new_start || now.state != before.state || now.since_unix_ms != before.since_unix_ms;
    let reason = one_line(&now.reason);
    let name = &now.name;
    match SlotState::try_from(now.state) {
        _ if !moved => RestartStep::Unchanged,
        Ok(SlotState::Ready) if new_start => RestartStep::Done(format!(
            "slot {name} is ready again with a new worker (pid {}): {reason}",
            now.worker_pid
        )),
        // The start the request found reached Ready; the restart follows.
        Ok(SlotState::Ready) => RestartStep::Unchanged,
        Ok(SlotState::Failed) => RestartStep::Failed(format!(
            "restart of slot {name} failed: {reason} (`ttctl logs {name}` shows the worker's output)"
        )),
        Ok(SlotState::Quarantined) => {
            RestartStep::Failed(format!("slot {name} cannot restart: it is quarantined: {reason}"))
        }
        Ok(SlotState::Stopped) => RestartStep::Failed(format!(
            "slot {name} stopped instead of restarting: {reason}"
        )),
        _ if reason.is_empty() => {
            RestartStep::Progress(format!("slot {name}: {}", SlotState::word(now.state)))
        }
        _ => RestartStep::Progress(format!(
            "slot {name}: {}: {reason}",
            SlotState::word(now.state)
        )),
    }
}

/// Where a stop stands: done once the slot is Stopped with the reason the
/// stop gave it (a slot stopped before the request was already there).
pub fn stop_step(before: &Slot, now: &Slot) -> RestartStep {
    let reason = one_line(&now.reason);
    let name = &now.name;
    let moved = now.state != before.state || now.since_unix_ms != before.since_unix_ms;
    match SlotState::try_from(now.state) {
        Ok(SlotState::Stopped) if moved || reason.contains("ttctl slot stop") => {
            RestartStep::Done(format!("slot {name} is stopped: {reason}"))
        }
        _ if !moved => RestartStep::Unchanged,
        _ if reason.is_empty() => {
            RestartStep::Progress(format!("slot {name}: {}", SlotState::word(now.state)))
        }
        _ => RestartStep::Progress(format!(
            "slot {name}: {}: {reason}",
            SlotState::word(now.state)
        )),
    }
}
