//! `tt-fakehw`: lay out a fake Tenstorrent hardware root, run its firmware,
//! stand in for `tt-smi`, and inject faults. See the library docs for the
//! layout and the fidelity notes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use nix::sys::signal::{SigHandler, Signal};
use tt_fakehw::{
    CreateOptions, FakeRoot, Fault, FirmwareState, SmiEnd, DEFAULT_DRIVER_VERSION,
    DEFAULT_RESET_DELAY_MS, DEFAULT_TT_SMI_VERSION,
};

/// A fake Tenstorrent Blackhole hardware root (dev, sys, proc and tt-smi)
/// for tests and demos of tt-serving.
///
/// Typical demo: `tt-fakehw create --root /tmp/fakehw --cards 2`, paste the
/// printed lines into the daemon config, then
/// `tt-fakehw firmware --root /tmp/fakehw --detach` so heartbeats advance and
/// reset cards come back (until the root is removed).
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
        /// The tt-kmd version to play: what exists and how a reset looks
        /// follow it (2.4.1: resets in place, stale reads, no pids file, no
        /// heartbeat; 2.5.0: pids file; 2.6.0: by-id links; 2.7.0:
        /// heartbeat and thermal trip count; 2.9.0: reads fail during a
        /// reset).
        #[arg(long, default_value = DEFAULT_DRIVER_VERSION)]
        driver_version: String,
        /// The tt-smi release bin/tt-smi plays (`-v` prints it; before
        /// 4.2.0 `-r` takes only integer indices or a JSON file).
        #[arg(long, default_value = DEFAULT_TT_SMI_VERSION)]
        tt_smi_version: String,
        /// Make the device nodes character devices (/dev/null's numbers),
        /// which a container runtime's `--device` takes (root only).
        #[arg(long)]
        char_dev_nodes: bool,
    },
    /// Run the card firmware: advance heartbeats and complete resets, every
    /// interval, until the parent process dies (or a SIGTERM, SIGINT or
    /// SIGHUP) or the root is removed. Why it stopped is kept in the root
    /// and shown by `status` and the fake `tt-smi -r`. With --detach it runs
    /// in the background on its own until the root is removed.
    Firmware {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
        /// Milliseconds between firmware steps.
        #[arg(long, default_value_t = 50)]
        interval_ms: u64,
        /// Start the firmware in the background, in its own session, so it
        /// outlives the shell that started it; returns once it runs. Its
        /// output goes to fakehw/firmware.log in the root. Stop it by
        /// removing the root, or with kill.
        #[arg(long)]
        detach: bool,
        /// Internal: this process is the detached firmware (no parent watch).
        #[arg(long, hide = true)]
        detached: bool,
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
    /// Take a card off the bus (hot removal, dead link): node, class dir
    /// and PCI dir vanish until `plug`.
    Unplug {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
        /// The card: its current index or its BDF.
        #[arg(long)]
        card: String,
    },
    /// Put an unplugged card back on the bus at the lowest free index.
    Plug {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
        /// The card's BDF.
        #[arg(long)]
        card: String,
    },
    /// Hold a card's chip as an engine does, until SIGTERM or SIGINT (or
    /// the parent's death): take tt-umd's lock, a robust pthread mutex in
    /// dev/shm/TT_UMD_LOCK.CHIP_IN_USE_<index>_PCIe (waiting while another
    /// process holds it, as tt-umd does: only SIGKILL ends that wait), and
    /// appear twice in the driver's pids file (two open descriptors).
    HoldChip {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
        /// The card's current index.
        #[arg(long)]
        card: u32,
        /// Release the lock after this many milliseconds and live on with
        /// it mapped and the device open, as a tt-umd process that closed
        /// its chip.
        #[arg(long)]
        release_after_ms: Option<u64>,
    },
    /// Watch a card as a monitoring tool does, until SIGTERM or SIGINT (or
    /// the parent's death): appear in the driver's pids file without
    /// mapping the chip lock.
    Watch {
        /// The fake root.
        #[arg(long, env = "TT_FAKEHW_ROOT")]
        root: PathBuf,
        /// The card's current index.
        #[arg(long)]
        card: u32,
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
    /// tt-smi -r on this card fails before any reset (traceback, exit 1).
    #[value(name = "smi-exit-1")]
    SmiExit1,
    /// The card is in a hot-plug slot: a reset takes it off the bus.
    HotPlug,
    /// The reset ioctl to this card fails (logged; tt-smi exits 0).
    IoctlFails,
    /// The card's PCIe link comes back at 8.0 GT/s x4.
    Downtrained,
    /// The card trips its thermal limit during a reset.
    ThermTrip,
    /// tt-smi's re-initialisation (without --no_reinit) fails on this card.
    ReinitFails,
    /// tt-smi -r on this card never returns; only SIGKILL ends it.
    SmiHangs,
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
            driver_version,
            tt_smi_version,
            char_dev_nodes,
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
                driver_version,
                tt_smi_version,
                char_dev_nodes,
            };
            let fake = FakeRoot::create_with(&root, &opts)
                .with_context(|| format!("creating fake root {}", root.display()))?;
            print!("{}", fake.config_toml());
        }
        Command::Firmware {
            root,
            interval_ms,
            detach,
            detached,
        } => {
            let fake = open(&root)?;
            if detach {
                return start_detached(&fake, interval_ms);
            }
            run_firmware(&fake, interval_ms, detached)?;
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
            let end = tt_fakehw::run_smi_to_end(
                &root,
                &args,
                &mut std::io::stdout().lock(),
                &mut std::io::stderr().lock(),
            );
            let code = match end {
                SmiEnd::Exit(code) => code,
                SmiEnd::Hang(hang) => hang.hang_until_killed(&mut std::io::stderr().lock()),
            };
            if code > 128 {
                // The real tool died of this signal (a negative logical id
                // crashes tt-umd): so does the fake.
                die_by_signal(code - 128);
            }
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
                FaultArg::HotPlug => Fault::HotPlug,
                FaultArg::IoctlFails => Fault::IoctlFails,
                FaultArg::Downtrained => Fault::Downtrained,
                FaultArg::ThermTrip => Fault::ThermTrip,
                FaultArg::ReinitFails => Fault::ReinitFails,
                FaultArg::SmiHangs => Fault::SmiHangs,
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
        Command::Unplug { root, card } => {
            let fake = open(&root)?;
            let bdf = fake.resolve_card(&card)?;
            fake.unplug(&bdf)?;
            println!("{bdf}: off the bus");
        }
        Command::Plug { root, card } => {
            let fake = open(&root)?;
            let bdf = fake.resolve_card(&card)?;
            let index = fake.plug(&bdf)?;
            println!("{bdf}: back on the bus as /dev/tenstorrent/{index}");
        }
        Command::HoldChip {
            root,
            card,
            release_after_ms,
        } => occupy(&open(&root)?, card, Some(release_after_ms))?,
        Command::Watch { root, card } => occupy(&open(&root)?, card, None)?,
        Command::Status { root } => print_status(&open(&root)?)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Dies of `signal` with its default action (no core dump handler of ours).
fn die_by_signal(signal: i32) -> ! {
    if let Ok(signal) = Signal::try_from(signal) {
        // SAFETY: restoring the default action of a signal is always sound.
        let _ = unsafe { nix::sys::signal::signal(signal, SigHandler::SigDfl) };
        let _ = nix::sys::signal::raise(signal);
    }
    std::process::exit(128 + signal)
}

/// `hold-chip` and `watch`: be a user of the card until told to stop.
/// `hold` is None for a watcher; for a holder, when to release the lock.
fn occupy(fake: &FakeRoot, card: u32, hold: Option<Option<u64>>) -> Result<()> {
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler only stores into an atomic.
        unsafe { nix::sys::signal::signal(signal, SigHandler::Handler(on_stop_signal)) }
            .with_context(|| format!("installing a handler for {signal}"))?;
    }
    let parent = die_with_parent()?;
    let me = std::process::id();
    let mut lock = match hold {
        Some(_) => Some(tt_fakehw::ChipLock::take(&fake.chip_lock(card))?),
        None => None,
    };
    // One line per open descriptor: an engine opens the node twice here.
    let opens = if hold.is_some() { 2 } else { 1 };
    for _ in 0..opens {
        fake.add_pid(card, me)
            .with_context(|| format!("listing pid {me} as a user of card {card}"))?;
    }
    println!(
        "pid {me} {} /dev/tenstorrent/{card}",
        if hold.is_some() {
            "holds the chip (CHIP_IN_USE locked) of"
        } else {
            "watches"
        }
    );
    let release_at = hold
        .flatten()
        .map(|ms| std::time::Instant::now() + Duration::from_millis(ms));
    while STOP_SIGNAL.load(Ordering::Relaxed) == 0 && nix::unistd::getppid() == parent {
        if release_at.is_some_and(|at| std::time::Instant::now() >= at) {
            if let Some(lock) = lock.as_mut().filter(|l| l.is_held()) {
                lock.release();
                println!("pid {me} released the chip of /dev/tenstorrent/{card} (CHIP_IN_USE still mapped)");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // As tt-umd at close_device: the lock first, then the descriptors (the
    // driver drops a process's lines when they close).
    drop(lock.take());
    let _ = fake.remove_pid(card, me);
    Ok(())
}

/// The signal that asked the firmware to stop (0: none yet).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: std::ffi::c_int) {
    STOP_SIGNAL.store(signal, Ordering::Relaxed);
}

/// Runs the loop in this process. Unless `detached`, it stops when its
/// parent dies; either way a stop says why, on stderr and in the root.
fn run_firmware(fake: &FakeRoot, interval_ms: u64, detached: bool) -> Result<()> {
    // Catch the signals that end the loop, so their stop is recorded.
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler only stores into an atomic, which is
        // async-signal-safe.
        unsafe { nix::sys::signal::signal(signal, SigHandler::Handler(on_stop_signal)) }
            .with_context(|| format!("installing a handler for {signal}"))?;
    }
    let parent = if detached {
        None
    } else {
        Some(die_with_parent()?)
    };
    let root = fake.root().to_path_buf();
    tt_fakehw::run_firmware(&root, Duration::from_millis(interval_ms), || {
        let signal = STOP_SIGNAL.load(Ordering::Relaxed);
        let reason = match parent {
            // The parent's death also sends SIGTERM; name the cause.
            Some(parent) if nix::unistd::getppid() != parent => {
                format!("its parent process (pid {parent}) exited")
            }
            _ if signal != 0 => format!(
                "it received {}",
                Signal::try_from(signal).map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_string())
            ),
            _ => return None,
        };
        eprintln!(
            "tt-fakehw firmware: stopping on {root}: {reason}; heartbeats stand still and reset cards do not come back until a firmware runs again (`tt-fakehw firmware --root {root} --detach` runs one on its own)",
            root = root.display()
        );
        Some(reason)
    })
    .with_context(|| format!("firmware loop on {}", root.display()))
}

/// Starts `tt-fakehw firmware --detached` in its own session, with its
/// output in the root's firmware log, and returns once it holds the root.
fn start_detached(fake: &FakeRoot, interval_ms: u64) -> Result<ExitCode> {
    let root = fake.root();
    if let FirmwareState::Running { pid } = fake.firmware_state() {
        println!("firmware already runs on {} (pid {pid})", root.display());
        return Ok(ExitCode::SUCCESS);
    }
    let log_path = fake.firmware_log();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding this binary's path")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["firmware", "--detached", "--interval-ms"])
        .arg(interval_ms.to_string())
        .arg("--root")
        .arg(root)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().context("duplicating the log file")?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of ours.
    // A session of its own: the shell's hangup and job control no longer
    // reach it.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().context("starting the detached firmware")?;
    let pid = child.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if fake.firmware_state() == (FirmwareState::Running { pid }) {
            break;
        }
        if let Some(status) = child.try_wait().context("waiting for the firmware")? {
            bail!(
                "the firmware exited at once ({status}); see {}",
                log_path.display()
            );
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "the firmware (pid {pid}) did not take the root within 10 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "firmware runs in the background as pid {pid} until {} is removed (or `kill {pid}`); output in {}",
        root.display(),
        log_path.display()
    );
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
    use std::fmt::Write as _;
    use std::io::Write as _;
    // Written whole at the end, so that a reader that stops early
    // (`| head`) ends the output without a panic.
    let mut text = String::new();
    let _ = writeln!(text, "root: {}", fake.root().display());
    let _ = writeln!(text, "{}", fake.firmware_state().describe(fake.root()));
    let _ = writeln!(
        text,
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
        let _ = writeln!(
            text,
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
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("writing the status")
        }
        _ => Ok(()),
    }
}
