//! `ttctl`, the operator's client for tt-servingd's Control service.
//!
//! ttctl is a thin client: every decision (which card, whether a reset is
//! proven, who holds a lock) is the daemon's, and ttctl's job is to reach it,
//! show its answers readably, and turn the outcome into an exit code scripts
//! can branch on:
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success (also: Ctrl-C ends `status --watch`, `logs -f` or `top`, or stdout was closed) |
//! | 1 | the operation failed: the daemon refused it, a reset was not proven, a generation failed, a cache variant is not warm, a reload was refused or a slot it started did not come up |
//! | 2 | usage error (clap) |
//! | 3 | the daemon cannot be reached, or the connection to it was lost |
//! | other | `card borrow`: the borrowed job's own exit status |
//!
//! Layout:
//! - `args`: the command line (clap). Commands are grouped by what they act
//!   on (`card ...`, `slot ...`, `cache ...`); everyday checks and whole-
//!   daemon actions (`status`, `generate`, `logs`, `top`, `reload`) are
//!   top-level.
//! - `client`: [`connect`] to the control socket, with errors that tell the
//!   operator what to do ([`ConnectError`]), and `Daemon`, the one client
//!   every command calls through: it maps every call's errors to a
//!   `Failure` (and so an exit code) in one place and holds each call's
//!   deadline.
//! - `render`: pure functions from the daemon's answers to tables and
//!   lines, one file per command, and the JSON (`render/json.rs`: the
//!   protocol messages themselves, one thin mirror for `cache ls`).
//! - `status`: `ttctl status`, once or `--watch`.
//! - `card`: `ttctl card reset` and `ttctl card borrow`.
//! - `slot`: `ttctl slot restart`, following the restart.
//! - `generate`: `ttctl generate`.
//! - `logs`: `ttctl logs`, once or `--follow`.
//! - `audit`: `ttctl audit`, the daemon's trail of control actions.
//! - `usage`: `ttctl usage`, usage per API key and model.
//! - `cache`: `ttctl cache ls|verify|rm|build`, and what the listing means
//!   for a model's next start (`verify`'s judgement, read from the
//!   daemon's `used_by` and `state`).
//! - `reload`: `ttctl reload`, the plan and each slot's result.
//! - `top`: `ttctl top`, rates and latencies per slot, redrawn.
//! - `tests`: every command against a fake daemon on a real socket.

mod args;
mod audit;
mod bench;
/// Quantiles by nearest rank: the one definition every benchmark of the
/// project reports (`ttctl bench` and the drivers under `bench/`).
pub use bench::stats;
mod cache;
mod card;
mod client;
mod eval;
mod generate;
mod logs;
mod outcome;
mod reload;
mod render;
mod slot;
mod status;
#[cfg(test)]
mod tests;
mod top;
mod usage;

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;

pub use args::{
    AbArgs, Arm, AuditArgs, BenchArgs, BenchCommand, CacheCommand, CardCommand, Cli, Command,
    EvalArgs, EvalRunner, GenerateArgs, LogsArgs, ReloadArgs, SlotCommand, StatusArgs, TopArgs,
    WorkloadArgs,
};
use client::Daemon;
pub use client::{connect, ConnectError, DEFAULT_SOCKET};
use outcome::{emit, Failure};

/// Run one ttctl command to completion, printing results to stdout, notes
/// (such as `generate`'s summary) and `ttctl: <what went wrong>` to stderr,
/// and return the exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let mut stdout = io::stdout();
    let mut stderr = io::stderr();
    let is_tty = stdout.is_terminal();
    match execute(cli, &mut stdout, &mut stderr, is_tty).await {
        Ok(()) | Err(Failure::OutputClosed) => ExitCode::SUCCESS,
        Err(Failure::JobExit(code)) => ExitCode::from(code),
        Err(failure) => {
            // If stderr is gone too there is nobody left to tell.
            let _ = writeln!(io::stderr(), "ttctl: {}", failure.message());
            ExitCode::from(failure.exit_code())
        }
    }
}

/// `run` with the outputs and terminal detection passed in, for tests.
/// `out` is stdout; `err` receives notes that must stay out of stdout (the
/// failure message itself is printed by `run`).
async fn execute(
    cli: Cli,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    is_tty: bool,
) -> Result<(), Failure> {
    // Checking a document against records needs no daemon.
    if let Command::Bench(BenchArgs {
        cite: Some(BenchCommand::Cite { doc, records }),
        ..
    }) = &cli.command
    {
        return cite(doc, records, out);
    }
    let mut daemon = Daemon::connect(&cli.socket).await?;
    let daemon = &mut daemon;
    match cli.command {
        Command::Status(args) if args.watch => status::watch(daemon, args, out, is_tty).await,
        Command::Status(args) => status::once(daemon, args, out).await,
        Command::Card(CardCommand::Reset { card }) => card::reset(daemon, &card, out).await,
        Command::Card(CardCommand::Borrow { cards, command }) => {
            card::borrow(daemon, &cards, &command, err).await
        }
        Command::Slot(SlotCommand::Restart { slot, no_wait }) => {
            slot::restart(daemon, &slot, slot::Start::Restart, no_wait, out).await
        }
        Command::Slot(SlotCommand::Start { slot, no_wait }) => {
            slot::restart(daemon, &slot, slot::Start::Start, no_wait, out).await
        }
        Command::Slot(SlotCommand::Stop { slot }) => slot::stop(daemon, &slot, out).await,
        Command::Generate(args) => generate::run(daemon, &args, out, err).await,
        Command::Logs(args) => logs::run(daemon, &args, out, tokio::signal::ctrl_c()).await,
        Command::Audit(args) => audit::run(daemon, &args, out).await,
        Command::Usage(args) => usage::run(daemon, &args, out).await,
        Command::Cache(CacheCommand::Ls { json }) => cache::ls(daemon, json, out).await,
        Command::Cache(CacheCommand::Verify { model }) => cache::verify(daemon, &model, out).await,
        Command::Cache(CacheCommand::Rm { variant }) => cache::rm(daemon, &variant, out).await,
        Command::Cache(CacheCommand::Build { model }) => cache::build(daemon, &model, out).await,
        Command::Reload(args) => reload::run(daemon, args, out).await,
        Command::Top(args) => top::run(daemon, args, out, is_tty).await,
        Command::Bench(args) => bench::run(daemon, &args, out, err).await,
        Command::Ab(args) => bench::ab::run(daemon, &args, out, err, tokio::signal::ctrl_c()).await,
        Command::Eval(args) => eval::run(daemon, &args, out, err).await,
    }
}

/// `ttctl bench cite DOC RECORDS...`: the problems, one per line; exit 1
/// when there is any.
fn cite(
    doc: &std::path::Path,
    records: &[std::path::PathBuf],
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let text = std::fs::read_to_string(doc)
        .map_err(|e| Failure::Failed(format!("cannot read {}: {e}", doc.display())))?;
    let records = bench::cite::load_records(records).map_err(Failure::Failed)?;
    let problems = bench::cite::check(&text, &records);
    for p in &problems {
        emit(
            out,
            &format!("{}:{}: {}\n", doc.display(), p.line, p.message),
        )?;
    }
    if problems.is_empty() {
        emit(
            out,
            &format!(
                "{}: every measured number cites a matching record ({} record(s) read)\n",
                doc.display(),
                records.len()
            ),
        )?;
        Ok(())
    } else {
        Err(Failure::Failed(format!(
            "{} problem(s) in {}",
            problems.len(),
            doc.display()
        )))
    }
}
