//! The `tt-worker-openai` binary: arguments, the parent watch and exit
//! statuses; everything else lives in the library (see its Layout), the
//! contract's parts in tt-worker-contract.

use clap::Parser;
use std::process::ExitCode;
use tt_worker_contract::{names, process};
use tt_worker_openai::cli::Cli;
use tt_worker_openai::engine;

fn main() -> ExitCode {
    process::init_tracing();
    // clap exits with status 2 on usage errors by itself.
    let cli = Cli::parse();
    if tt_worker_contract::identify::requested() {
        let identity = tt_worker_openai::identity::identify(&cli);
        println!("{}", tt_worker_contract::identify::line(&identity));
        return ExitCode::SUCCESS;
    }
    let settings = match cli.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tt-worker-openai: {e}");
            return ExitCode::from(names::EXIT_USAGE);
        }
    };
    // Once reparented, the engine's whole group is killed before the exit:
    // its processes would otherwise keep the cards under init.
    process::watch_parent("tt-worker-openai", engine::emergency_stop);
    match tt_worker_openai::worker::run(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("tt-worker-openai: {}", failure.message);
            ExitCode::from(
                u8::try_from(failure.code)
                    .unwrap_or(names::EXIT_FAILURE)
                    .max(1),
            )
        }
    }
}
