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
        if !progress.finished {
            emit(out, &format!("{}\n", reset_progress_line(&progress)))?;
            continue;
        }
        // The final message is the final line: on stdout when the card is
        // proven back, as the error (stderr, exit 1) when it is not. The
        // daemon's text already names the card and what to do next.
        if progress.ok {
            let mut done = progress.clone();
            if done.message.is_empty() {
                done.message = match progress.new_index {
                    Some(i) => format!("card is proven back as /dev/tenstorrent/{i}"),
                    None => "card is proven back".to_string(),
                };
            }
            return emit(out, &format!("{}\n", reset_progress_line(&done)));
        }
        return Err(Failure::Failed(if progress.message.is_empty() {
            format!(
                "reset of card {} failed: it was not proven back (see 'ttctl status')",
                progress.bdf
            )
        } else {
            progress.message
        }));
    }
    Err(Failure::Failed(format!(
        "tt-servingd ended the reset of card {card} without a result; \
         see 'ttctl status' for the card's state"
    )))
}
