//! `ttctl card ...`: card maintenance.

use std::io::Write;
use std::path::Path;

use tonic::transport::Channel;
use tt_serving_proto::v1::control_client::ControlClient;
use tt_serving_proto::v1::ResetCardRequest;

use super::render::reset_progress_line;
use super::{emit, Failure};

/// `ttctl card reset <index|BDF>`: ask the daemon to reset the card and
/// print each step as it streams in. Success is the daemon's proof that the
/// card came back, never tt-smi's exit code (tt-smi exits 0 even when the
/// reset failed), so the exit code follows the final message's `ok`.
pub(super) async fn reset(
    client: &mut ControlClient<Channel>,
    card: &str,
    socket: &Path,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let mut stream = client
        .reset_card(ResetCardRequest {
            card: card.to_string(),
        })
        .await
        .map_err(|status| Failure::from_status(status, socket))?
        .into_inner();
    while let Some(progress) = stream
        .message()
        .await
        .map_err(|status| Failure::from_status(status, socket))?
    {
        emit(out, &format!("{}\n", reset_progress_line(&progress)))?;
        if !progress.finished {
            continue;
        }
        if progress.ok {
            let node = progress
                .new_index
                .map(|i| format!(", now /dev/tenstorrent/{i}"))
                .unwrap_or_default();
            return emit(
                out,
                &format!("card {} is reset and proven healthy{node}\n", progress.bdf),
            );
        }
        let reason = if progress.message.is_empty() {
            "every attempt failed".to_string()
        } else {
            progress.message
        };
        return Err(Failure::Failed(format!(
            "reset of card {} failed: {reason} (see 'ttctl status' for the card's state)",
            progress.bdf
        )));
    }
    Err(Failure::Failed(format!(
        "tt-servingd ended the reset of card {card} without a result; \
         see 'ttctl status' for the card's state"
    )))
}
