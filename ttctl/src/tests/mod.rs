//! ttctl against a fake Control server on a real unix socket (`fake.rs`):
//! the real connector, real gRPC streams, and the exit code each outcome
//! maps to. One file per command; `args.rs` is the command line alone,
//! `unreachable.rs` ttctl without a daemon.

mod args;
mod cache;
mod card;
mod fake;
mod generate;
mod logs;
mod slot;
mod status;
mod unreachable;

use std::path::Path;
use std::sync::{Arc, Mutex};

use clap::Parser;

use super::*;
use fake::{fake, restart_slot, restarting, serve, serve_at, snapshot, FakeDaemon};

fn cli(socket: &Path, args: &[&str]) -> Cli {
    let mut argv = vec!["ttctl".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv.push("--socket".into());
    argv.push(socket.display().to_string());
    Cli::try_parse_from(argv).unwrap()
}

/// Run ttctl; return stdout and the failure, if any.
async fn ttctl(socket: &Path, args: &[&str]) -> (String, Option<Failure>) {
    let (out, _, failure) = ttctl_with_stderr(socket, args).await;
    (out, failure)
}

/// Run ttctl; return stdout, what it wrote to stderr besides the failure
/// message, and the failure, if any.
async fn ttctl_with_stderr(socket: &Path, args: &[&str]) -> (String, String, Option<Failure>) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let result = execute(cli(socket, args), &mut out, &mut err, false).await;
    (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
        result.err(),
    )
}

/// A writer the test can read while ttctl still holds it.
#[derive(Clone, Default)]
struct SharedOut(Arc<Mutex<Vec<u8>>>);

impl Write for SharedOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
