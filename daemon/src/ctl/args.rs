//! The command line, declared with clap's derive API.
//!
//! Commands are grouped by the thing they act on (`card ...`; `slot ...` and
//! `cache ...` join as their operations land in control.proto), so the help
//! output reads like the daemon's own vocabulary. A group is only added
//! together with a command that does something.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::client::DEFAULT_SOCKET;

/// Exit codes, shown at the end of `--help` so scripts can branch on them.
const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the operation failed (the daemon said no, or a reset was not proven)
  2  usage error (bad arguments)
  3  tt-servingd cannot be reached (not running, stale socket, permission denied)";

/// ttctl, the operator's tool for tt-servingd.
#[derive(Debug, Parser)]
#[command(
    name = "ttctl",
    version,
    about = "Operate tt-servingd: card and slot status, card resets",
    long_about = "Operate tt-servingd, the tt-serving daemon that owns this host's \
                  Tenstorrent cards.\n\nttctl talks to the daemon over its local control \
                  socket (a unix socket; its group decides who may use it).",
    after_help = EXIT_CODES,
    propagate_version = true
)]
pub struct Cli {
    /// The daemon's control socket.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        env = "TTCTL_SOCKET",
        default_value = DEFAULT_SOCKET
    )]
    pub socket: PathBuf,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the daemon, every card and every slot.
    #[command(after_help = EXIT_CODES)]
    Status(StatusArgs),

    /// Card maintenance.
    #[command(subcommand)]
    Card(CardCommand),
}

/// Options of `ttctl status`.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct StatusArgs {
    /// Print JSON instead of tables: one object, or one object per line with
    /// --watch. Field names mirror control.proto; states are the table's words.
    #[arg(long)]
    pub json: bool,

    /// Keep running and print the status again after every change (Ctrl-C
    /// stops).
    #[arg(long)]
    pub watch: bool,
}

/// `ttctl card ...`.
#[derive(Debug, Subcommand)]
pub enum CardCommand {
    /// Reset a card and wait until the daemon proves it came back.
    ///
    /// The daemon runs `tt-smi -r` and then proves the card is back (device
    /// node, sysfs, advancing heartbeat, site probe); tt-smi's own exit code
    /// is not trusted. Each step is printed as it happens. A quarantined card
    /// that passes leaves quarantine. Refused while another process holds
    /// the card's lock.
    #[command(after_help = EXIT_CODES)]
    Reset {
        /// The card: its current index (`1`) or its PCI address
        /// (`0000:01:00.0`, stable across resets).
        #[arg(value_name = "INDEX|BDF")]
        card: String,
    },
}
