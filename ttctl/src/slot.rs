//! `ttctl slot ...`: slot maintenance.

use std::io::Write;

use super::client::Daemon;
use super::outcome::{emit, Failure};
use super::render::{
    restart_step, slot_restart_requested_line, stop_step, RestartFollow, RestartStep,
};
use tt_serving_proto::v1::Slot;
use tt_serving_proto::Word;

/// `ttctl slot restart <SLOT>`: ask the daemon to restart the slot, then
/// (unless `no_wait`) follow it over WatchStatus, printing each state it
/// passes through, until a new worker is ready (exit 0) or the restart
/// failed (exit 1). The daemon's reply is the slot as the request found
/// it, so nothing printed claims the restart is further than it is. An
/// unknown slot is refused by the daemon (NOT_FOUND, naming the slots
/// there are): exit 1. There is no time limit: a cold start can take many
/// minutes, and every state change is printed meanwhile.
///
/// `ttctl slot start` follows the same way, from a stopped or failed slot.
pub(super) async fn restart(
    daemon: &mut Daemon,
    slot: &str,
    how: Start,
    no_wait: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let reply = match how {
        Start::Restart => daemon.restart_slot(slot).await?,
        Start::Start => daemon.start_slot(slot).await?,
    };
    let Some(before) = reply.slot else {
        return emit(
            out,
            &format!(
                "{} of slot {slot} requested; follow it with `ttctl status --watch`\n",
                how.word()
            ),
        );
    };
    // A slot with a worker has started at least once; a zero count comes
    // from a daemon that predates the counter.
    let follow = if before.worker_pid != 0 && before.starts == 0 {
        RestartFollow::Unable
    } else if no_wait {
        RestartFollow::NoWait
    } else {
        RestartFollow::Following
    };
    let line = slot_restart_requested_line(&before, follow);
    let line = match how {
        Start::Restart => line,
        Start::Start => line.replacen("restart of slot", "start of slot", 1),
    };
    emit(out, &format!("{line}\n"))?;
    if follow != RestartFollow::Following {
        return Ok(());
    }
    let ended = format!(
        "the status stream before the restart of slot {} finished",
        before.name
    );
    follow_slot(daemon, &before, restart_step, &ended, out).await
}

/// Which of the two starts `restart` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// `slot restart`: drain, stop, start again.
    Restart,
    /// `slot start`: start a stopped or failed slot.
    Start,
}

impl Start {
    fn word(self) -> &'static str {
        match self {
            Start::Restart => "restart",
            Start::Start => "start",
        }
    }
}

/// `ttctl slot stop <SLOT>`: ask the daemon to drain and stop the slot,
/// then follow it until it is stopped (exit 0), printing each state on the
/// way (a drain can take `drain_timeout_secs`).
pub(super) async fn stop(
    daemon: &mut Daemon,
    slot: &str,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let reply = daemon.stop_slot(slot).await?;
    let Some(before) = reply.slot else {
        return emit(
            out,
            &format!("stop of slot {slot} requested; follow it with `ttctl status --watch`\n"),
        );
    };
    emit(
        out,
        &format!(
            "stop of slot {} requested (it was {}); draining its requests, then stopping its worker\n",
            before.name,
            tt_serving_proto::v1::SlotState::word(before.state)
        ),
    )?;
    let ended = format!("the status stream before slot {} stopped", before.name);
    follow_slot(daemon, &before, stop_step, &ended, out).await
}

/// Follows slot `before` over WatchStatus, printing each new line `step`
/// gives, until it says done (exit 0) or failed; `ended` says what was
/// awaited when the stream ends first.
async fn follow_slot(
    daemon: &mut Daemon,
    before: &Slot,
    step: fn(&Slot, &Slot) -> RestartStep,
    ended: &str,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let mut updates = daemon.watch_status().await?;
    let mut printed = String::new();
    while let Some(status) = updates.next().await? {
        let Some(now) = status.slots.iter().find(|s| s.name == before.name) else {
            return Err(Failure::Failed(format!(
                "slot {} is no longer configured (a reload removed it); see `ttctl status`",
                before.name
            )));
        };
        match step(before, now) {
            RestartStep::Unchanged => {}
            // Status changes other than this slot's repeat its line.
            RestartStep::Progress(line) if line == printed => {}
            RestartStep::Progress(line) => {
                emit(out, &format!("{line}\n"))?;
                printed = line;
            }
            RestartStep::Done(line) => return emit(out, &format!("{line}\n")),
            RestartStep::Failed(message) => return Err(Failure::Failed(message)),
        }
    }
    Err(updates.ended(ended))
}
