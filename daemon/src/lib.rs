//! tt-servingd, the tt-serving daemon, and ttctl, its operator tool.
//!
//! Layout:
//! - [`config`]: the TOML file, parsed strictly and validated as a whole.
//! - [`cards`]: discovery under `dev_root`/`sys_root`/`proc_root`, per-card
//!   locks, reset with proof, and [`cards::CardManager`], the one owner of
//!   card state.
//! - [`slots`]: the slot lifecycle (one model instance on its cards).
//! - [`api`]: the gRPC services: Control on the local socket, Inference,
//!   health and reflection on the public port.
//! - [`daemon`]: startup order, the tick loop, signals and clean shutdown.
//! - [`notify`]: systemd notifications; [`shutdown`]: the shutdown signal.
//! - [`ctl`]: `ttctl`, the operator's client.
//! - [`echo`]: quoting client input in errors and logs, bounded.

pub mod api;
pub mod borrow;
pub mod bus;
pub mod cache;
pub mod cards;
pub mod clock;
pub mod config;
pub mod ctl;
pub mod daemon;
pub mod demo;
pub mod echo;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod hostfs;
pub mod metrics;
pub mod notify;
pub mod preflight;
pub mod reload;
pub mod retry;
pub mod router;
pub mod secrets;
pub mod shutdown;
pub mod slots;
pub mod state;
pub mod uds;
pub mod worker;
