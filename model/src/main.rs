//! The `tt-worker` binary: arguments and exit statuses; everything else
//! lives in the library (see its Layout), the contract's parts in
//! tt-worker-contract.

use clap::Parser;
use std::collections::HashMap;
use std::process::ExitCode;
use tt_worker::cli::{Cli, Command};
use tt_worker::faults::Faults;
use tt_worker_contract::{names, process};

fn main() -> ExitCode {
    process::init_tracing();
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
                ExitCode::from(names::EXIT_FAILURE)
            }
        };
    }
    if tt_worker_contract::identify::requested() {
        // The engine is this binary: its build is the whole identity.
        let identity =
            tt_worker_contract::identify::worker_identity("tt-worker", env!("CARGO_PKG_VERSION"));
        println!("{}", tt_worker_contract::identify::line(&identity));
        return ExitCode::SUCCESS;
    }
    let args = match cli.serve_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tt-worker: {e}");
            return ExitCode::from(names::EXIT_USAGE);
        }
    };
    let env: HashMap<String, String> = std::env::vars().collect();
    let faults = match Faults::from_env(&env) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("tt-worker: {e}");
            return ExitCode::from(names::EXIT_USAGE);
        }
    };
    // Nothing of the engine's to stop first: its threads die with us.
    process::watch_parent("tt-worker", || {});
    match tt_worker::worker::serve(args, faults) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tt-worker: {e:#}");
            ExitCode::from(names::EXIT_FAILURE)
        }
    }
}
