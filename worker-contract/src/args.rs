//! The contract's arguments: what the daemon passes every worker through
//! the environment (each also an option, to run a worker by hand), parsed
//! by clap into [`ContractArgs`] (which each worker flattens into its own
//! command line) and validated into [`Contract`]. Bad values exit with
//! [`crate::names::EXIT_USAGE`].

use crate::names;
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use tt_serving_proto::CacheMode;

/// `warm` or `cold`, as the command line and `TT_CACHE_MODE` give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CacheModeArg {
    /// Use the existing tensor cache; never read the checkpoint's tensors.
    Warm,
    /// Build the tensor cache from the checkpoint.
    Cold,
}

impl From<CacheModeArg> for CacheMode {
    fn from(m: CacheModeArg) -> Self {
        match m {
            CacheModeArg::Warm => CacheMode::Warm,
            CacheModeArg::Cold => CacheMode::Cold,
        }
    }
}

/// The contract's options, each read from its environment variable when
/// not given (the daemon always sets them).
#[derive(Debug, Clone, Args)]
pub struct ContractArgs {
    /// Unix socket to serve engine.proto on.
    #[arg(long, env = names::SOCKET, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The checkpoint.
    #[arg(long, env = names::MODEL, value_name = "CHECKPOINT")]
    pub model: Option<String>,
    /// Tensor-parallel degree (ranks, one card each).
    #[arg(long, env = names::TP, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub tp: u32,
    /// Directory of this variant's tensor cache.
    #[arg(long, env = names::CACHE_DIR, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// `cold` builds the tensor cache from the checkpoint, `warm` uses it.
    #[arg(long, env = names::CACHE_MODE, value_enum)]
    pub cache_mode: Option<CacheModeArg>,
    /// Card PCI addresses, comma-separated, one per rank.
    #[arg(long, env = names::VISIBLE_DEVICES, value_name = "BDFS")]
    pub visible_devices: Option<String>,
    /// The cards' device nodes, comma-separated, rank order (the daemon
    /// sets it at each start).
    #[arg(long, env = names::DEVICES, value_name = "NODES")]
    pub devices: Option<String>,
    /// Export this worker's spans over OTLP/gRPC to this collector
    /// (`http://HOST:PORT`; the daemon sets it while its `[tracing]
    /// otlp_endpoint` is). Unset: no spans.
    #[arg(long, env = names::OTLP_ENDPOINT, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

/// The validated contract.
#[derive(Debug, Clone)]
pub struct Contract {
    /// The socket to serve on.
    pub socket: PathBuf,
    /// The checkpoint, as given.
    pub model: String,
    /// TP degree.
    pub tp: u32,
    /// The cache variant's directory.
    pub cache_dir: PathBuf,
    /// Warm or cold.
    pub cache_mode: CacheMode,
    /// Card PCI address per rank.
    pub bdfs: Vec<String>,
    /// Device node per rank; empty when the daemon (or a hand run) gave
    /// none.
    pub devices: Vec<String>,
    /// Where spans go (None: traces off).
    pub otlp_endpoint: Option<String>,
}

/// An argument problem: the worker exits with
/// [`crate::names::EXIT_USAGE`], printing it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn missing(variable: &str, option: &str) -> UsageError {
    UsageError(format!(
        "missing {variable} ({option}): the daemon sets it; to run the worker by hand, export it or pass the option"
    ))
}

fn list(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

impl ContractArgs {
    /// Checks that everything is there and that the cards match the ranks.
    pub fn validate(self) -> Result<Contract, UsageError> {
        let socket = self
            .socket
            .ok_or_else(|| missing(names::SOCKET, "--socket"))?;
        let model = self
            .model
            .filter(|m| !m.is_empty())
            .ok_or_else(|| missing(names::MODEL, "--model"))?;
        let cache_dir = self
            .cache_dir
            .ok_or_else(|| missing(names::CACHE_DIR, "--cache-dir"))?;
        let cache_mode = self
            .cache_mode
            .ok_or_else(|| missing(names::CACHE_MODE, "--cache-mode"))?
            .into();
        let given = self
            .visible_devices
            .ok_or_else(|| missing(names::VISIBLE_DEVICES, "--visible-devices"))?;
        let bdfs = list(Some(&given));
        // One card per rank: a mismatch means the daemon and the worker
        // disagree about the slot, and running anyway would bind ranks to
        // the wrong cards.
        if bdfs.len() != self.tp as usize {
            return Err(UsageError(format!(
                "{} lists {} card(s) ({given:?}) but --tp is {} ({}); give exactly one BDF per rank",
                names::VISIBLE_DEVICES,
                bdfs.len(),
                self.tp,
                names::TP,
            )));
        }
        let devices = list(self.devices.as_deref());
        if !devices.is_empty() && devices.len() != bdfs.len() {
            return Err(UsageError(format!(
                "{} lists {} device node(s) for {} card(s); give one node per card, in the order of {}",
                names::DEVICES,
                devices.len(),
                bdfs.len(),
                names::VISIBLE_DEVICES,
            )));
        }
        let otlp_endpoint = self.otlp_endpoint.filter(|e| !e.is_empty());
        if let Some(endpoint) = &otlp_endpoint {
            tt_serving_telemetry::check_endpoint(endpoint).map_err(|why| {
                UsageError(format!(
                    "{} (--otlp-endpoint) `{endpoint}`: {why}",
                    names::OTLP_ENDPOINT
                ))
            })?;
        }
        Ok(Contract {
            socket,
            model,
            tp: self.tp,
            cache_dir,
            otlp_endpoint,
            cache_mode,
            bdfs,
            devices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        contract: ContractArgs,
    }

    fn parse(args: &[&str]) -> Result<Contract, String> {
        let cli = Cli::try_parse_from(std::iter::once("w").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.contract.validate().map_err(|e| e.0)
    }

    const FULL: &[&str] = &[
        "--socket=/run/w.sock",
        "--model=/m.gguf",
        "--cache-dir=/c",
        "--cache-mode=warm",
        "--visible-devices=0000:01:00.0",
    ];

    #[test]
    fn a_full_contract_validates() {
        let c = parse(FULL).unwrap();
        assert_eq!(c.bdfs, ["0000:01:00.0"]);
        assert_eq!(c.cache_mode, CacheMode::Warm);
        assert_eq!(c.tp, 1);
        assert!(c.devices.is_empty());
    }

    #[test]
    fn a_card_count_other_than_tp_is_refused_naming_both() {
        let mut args = FULL.to_vec();
        args.push("--tp=2");
        let e = parse(&args).unwrap_err();
        assert!(
            e.contains("TT_VISIBLE_DEVICES") && e.contains("--tp is 2"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_variable_names_itself_and_the_option() {
        let e = parse(&FULL[1..]).unwrap_err();
        assert!(
            e.contains("TT_WORKER_SOCKET") && e.contains("--socket"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_cache_mode_is_refused_by_clap_naming_it() {
        let mut args = FULL.to_vec();
        args[3] = "--cache-mode=lukewarm";
        let e = parse(&args).unwrap_err();
        assert!(e.contains("lukewarm"), "{e}");
    }

    #[test]
    fn device_nodes_must_match_the_cards() {
        let mut args = FULL.to_vec();
        args.push("--devices=/dev/tenstorrent/0,/dev/tenstorrent/1");
        let e = parse(&args).unwrap_err();
        assert!(
            e.contains("TT_WORKER_DEVICES") && e.contains("2 device node"),
            "{e}"
        );
    }
}
