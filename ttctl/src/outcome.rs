//! How a command ends: the failure that decides ttctl's exit code, and
//! writing output so that a reader who went away (`| head`) is not an
//! error. Every command reports through these.

use std::io::{self, Write};

/// Why a command did not succeed; decides the exit code.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The operation ran and failed, or the daemon refused it (exit 1).
    Failed(String),
    /// The daemon cannot be reached or went away (exit 3).
    Unreachable(String),
    /// Whoever read our stdout stopped (`ttctl status --watch | head`): not
    /// an error, and nothing is left to print to.
    OutputClosed,
    /// A borrowed job's own non-zero exit status, passed on unchanged.
    JobExit(u8),
}

impl Failure {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Failure::OutputClosed => 0,
            Failure::JobExit(code) => *code,
            Failure::Failed(_) => 1,
            Failure::Unreachable(_) => 3,
        }
    }

    pub(crate) fn message(&self) -> &str {
        match self {
            Failure::Failed(m) | Failure::Unreachable(m) => m,
            Failure::OutputClosed | Failure::JobExit(_) => "",
        }
    }
}

/// Write and flush `text`, so a watcher sees each snapshot at once.
pub(crate) fn emit(out: &mut (dyn Write + Send), text: &str) -> Result<(), Failure> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|err| match err.kind() {
            io::ErrorKind::BrokenPipe => Failure::OutputClosed,
            _ => Failure::Failed(format!("cannot write to stdout: {err}")),
        })
}

/// Write `text` to stderr-like output. A note that cannot be written is not
/// worth failing a command that already succeeded.
pub(crate) fn note(err: &mut (dyn Write + Send), text: &str) {
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// Ctrl-C ends a command that follows the daemon (`status --watch`, `logs
/// -f`, `top`) successfully; not being able to listen for it is a failure.
pub(crate) fn ctrl_c_pressed(signal: io::Result<()>) -> Result<(), Failure> {
    signal.map_err(|err| Failure::Failed(format!("cannot listen for Ctrl-C: {err}")))
}

/// The note under a listing read from a daemon file (the audit trail, the
/// usage ledger) when some of its lines could not be read.
pub(crate) fn emit_skipped(
    out: &mut (dyn Write + Send),
    skipped: u32,
    path: &str,
) -> Result<(), Failure> {
    if skipped == 0 {
        return Ok(());
    }
    emit(
        out,
        &format!("({skipped} line(s) of {path} could not be read and were left out)\n"),
    )
}
