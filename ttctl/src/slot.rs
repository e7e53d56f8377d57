//! `ttctl slot ...`: slot maintenance.

use std::io::Write;

use super::client::Daemon;
use super::render::{restart_step, slot_restart_requested_line, RestartFollow, RestartStep};
use super::{emit, Failure};

/// `ttctl slot restart <SLOT>`: ask the daemon to restart the slot, then
/// (unless `no_wait`) follow it over WatchStatus, printing each state it
/// passes through, until a new worker is ready (exit 0) or the restart
/// failed (exit 1). The daemon's reply is the slot as the request found
/// it, so nothing printed claims the restart is further than it is. An
/// unknown slot is refused by the daemon (NOT_FOUND, naming the slots
/// there are): exit 1. There is no time limit: a cold start can take many
/// minutes, and every state change is printed meanwhile.
pub(super) async fn restart(
    daemon: &mut Daemon,
    slot: &str,
    no_wait: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let reply = daemon.restart_slot(slot).await?;
    let Some(before) = reply.slot else {
        return emit(
            out,
            &format!("restart of slot {slot} requested; follow it with `ttctl status --watch`\n"),
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
    emit(
        out,
        &format!("{}\n", slot_restart_requested_line(&before, follow)),
    )?;
    if follow != RestartFollow::Following {
        return Ok(());
    }
    let mut updates = daemon.watch_status().await?;
    let mut printed = String::new();
    while let Some(status) = updates.next().await? {
        let Some(now) = status.slots.iter().find(|s| s.name == before.name) else {
            return Err(Failure::Failed(format!(
                "slot {} is no longer configured (a reload removed it); see `ttctl status`",
                before.name
            )));
        };
        match restart_step(&before, now) {
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
    Err(updates.ended(&format!(
        "the status stream before the restart of slot {} finished",
        before.name
    )))
}
