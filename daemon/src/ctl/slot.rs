//! `ttctl slot ...`: slot maintenance.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use tonic::transport::Channel;
use tt_serving_proto::v1::control_client::ControlClient;
use tt_serving_proto::v1::SlotRequest;

use super::render::slot_restart_line;
use super::{answer_within, emit, Failure};

/// The daemon only queues the restart for the slot's supervisor and
/// answers; the drain and the start happen after the reply.
const RESTART_TIMEOUT: Duration = Duration::from_secs(30);

/// `ttctl slot restart <SLOT>`: ask the daemon to restart the slot and print
/// its state once the request was accepted. An unknown slot is refused by
/// the daemon (NOT_FOUND, naming the slots there are): exit 1.
pub(super) async fn restart(
    client: &mut ControlClient<Channel>,
    slot: &str,
    socket: &Path,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let reply = answer_within(
        RESTART_TIMEOUT,
        client.restart_slot(SlotRequest {
            slot: slot.to_string(),
        }),
        socket,
    )
    .await?;
    let line = match reply.slot {
        Some(state) => slot_restart_line(&state),
        None => format!("restart of slot {slot} accepted"),
    };
    emit(out, &format!("{line}\n"))
}
