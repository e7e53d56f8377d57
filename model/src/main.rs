//! The `tt-worker` binary: argument parsing and exit codes; everything else
//! lives in the library (see its Layout).

use clap::Parser;
use std::collections::HashMap;
use std::process::ExitCode;
use tt_worker::cli::{Cli, Command};
use tt_worker::faults::Faults;

/// Status for bad arguments, the contract the daemon relies on.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // The daemon captures stderr into its journal and `ttctl logs`:
        // colour codes only help a person at a terminal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TT_WORKER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // clap exits with status 2 on usage errors by itself.
    let cli = Cli::parse();
    if let Some(Command::MakeTestModel { out, seed }) = &cli.command {
        return match tt_worker::testmodel::write_tiny_llama(out, *seed) {
            Ok(()) => {
                println!("{}", out.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tt-worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let args = match cli.serve_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tt-worker: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let env: HashMap<String, String> = std::env::vars().collect();
    let faults = match Faults::from_env(&env) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("tt-worker: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match tt_worker::worker::serve(args, faults) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tt-worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}
