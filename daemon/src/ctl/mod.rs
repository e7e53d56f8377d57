//! `ttctl`, the operator's client for tt-servingd's Control service.
//!
//! ttctl is a thin client: every decision (which card, whether a reset is
//! proven, who holds a lock) is the daemon's, and ttctl's job is to reach it,
//! show its answers readably, and turn the outcome into an exit code scripts
//! can branch on:
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success (also: Ctrl-C ends `status --watch`, or stdout was closed) |
//! | 1 | the operation failed: the daemon refused it, or a reset was not proven |
//! | 2 | usage error (clap) |
//! | 3 | the daemon cannot be reached, or the connection to it was lost |
//!
//! Layout:
//! - `args`: the command line (clap). Commands are grouped by what they act
//!   on (`card ...`, later `slot ...` and `cache ...`).
//! - `client`: [`connect`] to the control socket, with errors that tell the
//!   operator what to do ([`ConnectError`]). The integration tests reuse it.
//! - `render`: pure functions from a `StatusResponse` to tables and to the
//!   stable JSON that `status --json` prints ([`StatusJson`]).
//! - `status`: `ttctl status`, once or `--watch`.
//! - `card`: `ttctl card reset`.

mod args;
mod card;
mod client;
mod render;
mod status;
#[cfg(test)]
mod tests;

use std::io::{self, IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;

use tonic::Code;

pub use args::{CardCommand, Cli, Command, StatusArgs};
pub use client::{connect, ConnectError, DEFAULT_SOCKET};
pub use render::{
    card_state_word, reset_progress_line, slot_state_word, status_json, status_table, CardJson,
    CardProcessJson, DaemonJson, LockHolderJson, SlotJson, StatusJson, TelemetryJson,
};

/// Run one ttctl command to completion, printing results to stdout and
/// `ttctl: <what went wrong>` to stderr, and return the exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let mut stdout = io::stdout();
    let is_tty = stdout.is_terminal();
    match execute(cli, &mut stdout, is_tty).await {
        Ok(()) | Err(Failure::OutputClosed) => ExitCode::SUCCESS,
        Err(failure) => {
            // If stderr is gone too there is nobody left to tell.
            let _ = writeln!(io::stderr(), "ttctl: {}", failure.message());
            ExitCode::from(failure.exit_code())
        }
    }
}

/// `run` with the output and terminal detection passed in, for tests.
async fn execute(cli: Cli, out: &mut (dyn Write + Send), is_tty: bool) -> Result<(), Failure> {
    let socket = cli.socket.as_path();
    let mut client = connect(socket).await?;
    match cli.command {
        Command::Status(args) if args.watch => {
            status::watch(&mut client, args, socket, out, is_tty).await
        }
        Command::Status(args) => status::once(&mut client, args, socket, out).await,
        Command::Card(CardCommand::Reset { card }) => {
            card::reset(&mut client, &card, socket, out).await
        }
    }
}

/// Why a command did not succeed; decides the exit code.
#[derive(Debug)]
enum Failure {
    /// The operation ran and failed, or the daemon refused it (exit 1).
    Failed(String),
    /// The daemon cannot be reached or went away (exit 3).
    Unreachable(String),
    /// Whoever read our stdout stopped (`ttctl status --watch | head`): not
    /// an error, and nothing is left to print to.
    OutputClosed,
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::OutputClosed => 0,
            Failure::Failed(_) => 1,
            Failure::Unreachable(_) => 3,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Failed(m) | Failure::Unreachable(m) => m,
            Failure::OutputClosed => "",
        }
    }

    /// Classify an RPC error. A status the daemon sent carries only its code
    /// and message, which are shown as they are (the daemon's messages are
    /// written for operators). A status that tonic made locally from a
    /// broken connection carries the transport error as its source: the
    /// daemon went away mid-call.
    fn from_status(status: tonic::Status, socket: &Path) -> Failure {
        if let Some(source) = std::error::Error::source(&status) {
            return Failure::Unreachable(format!(
                "lost the connection to tt-servingd at {}: {} \
                 (check 'systemctl status tenstorrent-serving')",
                socket.display(),
                client::error_chain(source)
            ));
        }
        if status.code() == Code::Unimplemented {
            return Failure::Failed(
                "the running tt-servingd does not know this command; it is probably older \
                 than this ttctl (restart the daemon after upgrading)"
                    .to_string(),
            );
        }
        if status.message().is_empty() {
            Failure::Failed(format!(
                "tt-servingd refused the request: {}",
                status.code().description()
            ))
        } else {
            Failure::Failed(status.message().to_string())
        }
    }
}

impl From<ConnectError> for Failure {
    fn from(err: ConnectError) -> Self {
        Failure::Unreachable(err.to_string())
    }
}

/// Write and flush `text`, so a watcher sees each snapshot at once.
fn emit(out: &mut (dyn Write + Send), text: &str) -> Result<(), Failure> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|err| match err.kind() {
            io::ErrorKind::BrokenPipe => Failure::OutputClosed,
            _ => Failure::Failed(format!("cannot write to stdout: {err}")),
        })
}
