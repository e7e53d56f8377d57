//! `ttctl logs`: a slot worker's recent output, then optionally new lines.

use std::future::Future;
use std::io::{self, Write};
use std::path::Path;

use tonic::transport::Channel;
use tt_serving_proto::v1::control_client::ControlClient;
use tt_serving_proto::v1::LogsRequest;

use super::render::log_line;
use super::{emit, Failure, LogsArgs};

/// Print the last `args.lines` lines the daemon kept for the slot; with
/// `--follow`, keep printing new ones until `interrupted` resolves (Ctrl-C:
/// exit 0) or until the daemon goes away (exit 3). An unknown slot is the
/// daemon's NOT_FOUND, which names the slots there are (exit 1).
///
/// `interrupted` is `tokio::signal::ctrl_c()` in ttctl (tests pass their own
/// trigger). It is polled only when following: Ctrl-C handling starts at its
/// first poll, and a plain listing keeps the default, which ends the
/// process at once.
pub(super) async fn run(
    client: &mut ControlClient<Channel>,
    args: &LogsArgs,
    socket: &Path,
    out: &mut (dyn Write + Send),
    interrupted: impl Future<Output = io::Result<()>>,
) -> Result<(), Failure> {
    let mut stream = client
        .logs(LogsRequest {
            slot: args.slot.clone(),
            lines: args.lines,
            follow: args.follow,
        })
        .await
        .map_err(|status| Failure::from_status(status, socket))?
        .into_inner();
    // Polled from the first wait on, so a Ctrl-C between two lines is not
    // lost.
    let follow = args.follow;
    let ctrl_c = async move {
        if follow {
            interrupted.await
        } else {
            std::future::pending().await
        }
    };
    tokio::pin!(ctrl_c);
    loop {
        let next = tokio::select! {
            signal = &mut ctrl_c => {
                return signal.map_err(|err| {
                    Failure::Failed(format!("cannot listen for Ctrl-C: {err}"))
                });
            }
            next = stream.message() => next,
        };
        match next.map_err(|status| Failure::from_status(status, socket))? {
            Some(line) => emit(out, &format!("{}\n", log_line(&line)))?,
            None if args.follow => {
                return Err(Failure::Unreachable(format!(
                    "tt-servingd at {} ended the log stream of slot {}; it is probably \
                     stopping (check 'systemctl status tenstorrent-serving')",
                    socket.display(),
                    args.slot
                )));
            }
            None => return Ok(()),
        }
    }
}
