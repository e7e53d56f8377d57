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
    watch_parent();
    match tt_worker::worker::serve(args, faults) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tt-worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A worker must not outlive whoever started it: its cards would stay busy
/// under a process nobody supervises. PR_SET_PDEATHSIG (SIGKILL) covers
/// most of it, but the kernel ties that signal to the parent *thread* that
/// spawned us, not the process (docs/RELIABILITY.md). This is the backstop:
/// once we are reparented, exit.
fn watch_parent() {
    let parent = std::os::unix::process::parent_id();
    if parent == 1 {
        return; // started by init itself: nothing to outlive
    }
    let watch = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            if std::os::unix::process::parent_id() != parent {
                // Our stderr pipe may have lost its reader with the parent:
                // write without panicking, and leave without exit handlers
                // that could wait on a lock held by a stuck thread.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "tt-worker: my parent (pid {parent}) is gone; exiting"
                );
                // SAFETY: _exit ends the process at once; nothing of ours
                // runs after it.
                unsafe { libc::_exit(1) }
            }
        });
    if let Err(e) = watch {
        eprintln!("tt-worker: cannot start the parent watch ({e}); relying on PR_SET_PDEATHSIG");
    }
}
