//! `tt-fakehw`: lay out a fake Tenstorrent hardware root, run its firmware,
//! stand in for `tt-smi`, and inject faults. See the library docs for the
//! layout and the fidelity notes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use tt_fakehw::{CreateOptions, FakeRoot, Fault, DEFAULT_RESET_DELAY_MS};

/// A fake Tenstorrent Blackhole hardware root (dev, sys, proc and tt-smi)
/// for tests and demos of tt-serving.
///
/// Typical demo: `tt-fakehw create --root /tmp/fakehw --cards 2`, paste the
/// printed lines into the daemon config, then keep
/// `tt-fakehw firmware --root /tmp/fakehw` running so heartbeats advance and
/// reset cards come back.
#[derive(Debug, Parser)]
#[command(name = "tt-fakehw", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lay out a new fake root and print the daemon config lines for it.
    Create {
        /// Directory to create the root in (missing or empty).
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
        /// Number of P150a cards (BDFs 0000:01:00.0, 0000:02:00.0, ...).
        #[arg(long, default_value_t = 1)]
        cards: usize,
        /// The tt-fakehw binary that bin/tt-smi runs [default: this binary].
        #[arg(long)]
        tt_fakehw_bin: Option<PathBuf>,
        /// How long a reset takes for cards without the `slow` fault.
        #[arg(long, default_value_t = DEFAULT_RESET_DELAY_MS)]
        reset_delay_ms: u64,
        /// Replace an existing fake root's files at --root.
        #[arg(long)]
        force: bool,
    },
    /// Run the card firmware: advance heartbeats and complete resets, every
    /// interval, until the parent process dies or the root is removed.
    Firmware {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
        /// Milliseconds between firmware steps.
        #[arg(long, default_value_t = 50)]
        interval_ms: u64,
    },
    /// Run one firmware step now and exit (for scripts that step time by hand).
    Tick {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
    },
    /// Act as tt-smi 6.8 on the root: `-r [TARGETS]`, `-s`, `--snapshot_no_tty`,
    /// `-ls`, `-v`, `-h`. Everything after --root is passed to it unchanged.
    #[command(disable_help_flag = true)]
    Smi {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
        /// tt-smi's own arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Switch a fault on for a card, or clear its faults.
    Fault {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
        /// The card: its current index or its BDF.
        #[arg(long)]
        card: String,
        /// The fault.
        #[arg(value_enum)]
        fault: FaultArg,
        /// With `slow`: how long the reset takes.
        #[arg(long, default_value_t = Fault::DEFAULT_SLOW_DELAY_MS)]
        delay_ms: u64,
    },
    /// Set the foreign pids the driver lists as holding a card
    /// (proc/driver/tenstorrent/<index>/pids).
    Pid {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
        /// The card's current index.
        #[arg(long)]
        card: u32,
        /// Add this pid.
        #[arg(long, conflicts_with = "clear", required_unless_present = "clear")]
        add: Option<u32>,
        /// Remove all pids.
        #[arg(long)]
        clear: bool,
    },
    /// Show every card: index, heartbeat, faults, pending reset.
    Status {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
    },
}

/// The faults as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FaultArg {
    /// tt-smi -r exits 0 but the card never comes back.
    NeverReturns,
    /// The card comes back under a different index.
    NewIndex,
    /// The reset takes --delay-ms.
    Slow,
    /// The heartbeat stops advancing.
    FrozenHeartbeat,
    /// tt-smi -r on this card prints a re-init error and exits 1.
    #[value(name = "smi-exit-1")]
    SmiExit1,
    /// Switch every fault of the card off.
    Clear,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tt-fakehw: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn open(root: &Path) -> Result<FakeRoot> {
    FakeRoot::open(root).with_context(|| format!("opening fake root {}", root.display()))
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Create {
            root,
            cards,
            tt_fakehw_bin,
            reset_delay_ms,
            force,
        } => {
            let bin = match tt_fakehw_bin {
                Some(bin) => bin,
                None => std::env::current_exe().context(
                    "finding this binary's path for bin/tt-smi; pass --tt-fakehw-bin PATH",
                )?,
            };
            let opts = CreateOptions {
                cards,
                fakehw_bin: bin,
                reset_delay_ms,
                force,
            };
            let fake = FakeRoot::create_with(&root, &opts)
                .with_context(|| format!("creating fake root {}", root.display()))?;
            print!("{}", fake.config_toml());
        }
        Command::Firmware { root, interval_ms } => {
            let fake = open(&root)?;
            let parent = die_with_parent()?;
            tt_fakehw::run_firmware(fake.root(), Duration::from_millis(interval_ms), || {
                nix::unistd::getppid() != parent
            })
            .with_context(|| format!("firmware loop on {}", root.display()))?;
        }
        Command::Tick { root } => {
            let report = open(&root)?.tick()?;
            for back in report.returned {
                println!(
                    "{} back at index {} (was {})",
                    back.bdf, back.new_index, back.old_index
                );
            }
        }
        Command::Smi { root, args } => {
            let code = tt_fakehw::run_smi(
                &root,
                &args,
                &mut std::io::stdout().lock(),
                &mut std::io::stderr().lock(),
            );
            return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
        }
        Command::Fault {
            root,
            card,
            fault,
            delay_ms,
        } => {
            let fake = open(&root)?;
            let bdf = fake.resolve_card(&card)?;
            let fault = match fault {
                FaultArg::Clear => {
                    fake.clear_fault(&bdf)?;
                    println!("{bdf}: faults cleared");
                    return Ok(ExitCode::SUCCESS);
                }
                FaultArg::NeverReturns => Fault::NeverReturns,
                FaultArg::NewIndex => Fault::NewIndex,
                FaultArg::Slow => Fault::Slow { delay_ms },
                FaultArg::FrozenHeartbeat => Fault::FrozenHeartbeat,
                FaultArg::SmiExit1 => Fault::SmiExit1,
            };
            fake.set_fault(&bdf, fault)?;
            println!("{bdf}: {fault} on");
        }
        Command::Pid {
            root,
            card,
            add,
            clear,
        } => {
            let fake = open(&root)?;
            match (add, clear) {
                (_, true) => fake.set_pids(card, &[])?,
                (Some(pid), false) => fake.add_pid(card, pid)?,
                (None, false) => bail!("give --add PID or --clear"),
            }
        }
        Command::Status { root } => print_status(&open(&root)?)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Makes the kernel send SIGTERM when the parent dies, and returns the
/// parent's pid so the loop can also notice a parent that died before the
/// request took effect.
///
/// PR_SET_PDEATHSIG fires when the *thread* that spawned us exits, not the
/// whole parent process; a parent that spawns from a short-lived thread
/// should keep that thread alive while the firmware runs. The ppid check
/// in the loop only reacts to the parent process dying.
fn die_with_parent() -> Result<nix::unistd::Pid> {
    let parent = nix::unistd::getppid();
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
        .context("asking the kernel for SIGTERM on parent death (prctl PR_SET_PDEATHSIG)")?;
    Ok(parent)
}

fn print_status(fake: &FakeRoot) -> Result<()> {
    println!("root: {}", fake.root().display());
    println!(
        "{:<14} {:<6} {:<10} {:<18} {:<26} pending reset",
        "BDF", "index", "heartbeat", "serial", "faults"
    );
    for card in fake.cards()? {
        let faults = card
            .faults
            .active()
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "{:<14} {:<6} {:<10} {:<18} {:<26} {}",
            card.info.bdf,
            card.index.map_or("gone".to_string(), |i| i.to_string()),
            card.heartbeat.map_or("-".to_string(), |h| h.to_string()),
            card.info.serial,
            if faults.is_empty() { "-" } else { &faults },
            card.pending.map_or("-".to_string(), |p| format!(
                "from index {}, due at unix ms {}",
                p.old_index, p.due_unix_ms
            )),
        );
    }
    Ok(())
}
