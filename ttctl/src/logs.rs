//! `ttctl logs`: a slot worker's recent output, then optionally new lines.

use std::future::Future;
use std::io::{self, Write};

use tt_serving_proto::v1::LogsRequest;

use super::args::LogsArgs;
use super::client::Daemon;
use super::outcome::{ctrl_c_pressed, emit, Failure};
use super::render::log_line;

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
    daemon: &mut Daemon,
    args: &LogsArgs,
    out: &mut (dyn Write + Send),
    interrupted: impl Future<Output = io::Result<()>>,
) -> Result<(), Failure> {
    let mut stream = daemon
        .logs(LogsRequest {
            slot: args.slot.clone(),
            lines: args.lines,
            follow: args.follow,
        })
        .await?;
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
            signal = &mut ctrl_c => return ctrl_c_pressed(signal),
            next = stream.next() => next?,
        };
        match next {
            Some(line) => emit(out, &format!("{}\n", log_line(&line)))?,
            None if args.follow => {
                return Err(stream.ended(&format!(
                    "the log stream of slot {}; it is probably stopping",
                    args.slot
                )));
            }
            None => return Ok(()),
        }
    }
}
