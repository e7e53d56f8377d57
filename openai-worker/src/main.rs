//! The `tt-worker-openai` binary: arguments, the parent watch and exit
//! statuses; everything else lives in the library (see its Layout).

use clap::Parser;
use std::process::ExitCode;
use tt_worker_openai::cli::Cli;
use tt_worker_openai::engine;

/// Status for bad arguments, as for `tt-worker`.
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
    let settings = match Cli::parse().settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tt-worker-openai: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    watch_parent();
    match tt_worker_openai::worker::run(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("tt-worker-openai: {}", failure.message);
            ExitCode::from(u8::try_from(failure.code).unwrap_or(1).max(1))
        }
    }
}

/// A worker must not outlive whoever started it: its engine would keep the
/// cards under a process nobody supervises. PR_SET_PDEATHSIG covers most of
/// it, but the kernel ties that signal to the parent *thread* that spawned
/// us (docs/RELIABILITY.md). This is the backstop: once reparented, kill
/// the engine's whole group and exit.
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
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "tt-worker-openai: my parent (pid {parent}) is gone; killing the engine and exiting"
                );
                engine::emergency_stop();
                // SAFETY: _exit ends the process at once, without exit
                // handlers that could wait on a lock a stuck thread holds.
                unsafe { libc::_exit(1) }
            }
        });
    if let Err(e) = watch {
        eprintln!(
            "tt-worker-openai: cannot start the parent watch ({e}); relying on PR_SET_PDEATHSIG"
        );
    }
}
