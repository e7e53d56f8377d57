//! tt-worker-contract: the contract between the daemon and its model
//! workers, written once.
//!
//! A worker is a process the daemon starts per slot with the contract's
//! environment ([`names`]); it binds engine.proto on `TT_WORKER_SOCKET`
//! before it loads, reports Loading with progress, then Ready, prints
//! `<FLAG> engaged` when a flagged feature runs ([`banner`]), drains on a
//! Shutdown call or SIGTERM, dies with the daemon, and exits 0 (clean
//! cards), 1 (failed: reset the cards) or 2 (bad arguments).
//!
//! An engine becomes a worker by implementing [`Backend`] (info, health,
//! generate, drain) and writing a short main:
//!
//! ```text
//! process::init_tracing();
//! let contract = cli.contract.validate()?;          // exit 2 on error
//! process::set_parent_death_signal(libc::SIGKILL);
//! process::watch_parent("my-worker", || {});
//! // in a tokio runtime:
//! let mut server = Server::start(&contract, backend.clone())?;
//! // load, set the phase Ready, then:
//! if let StopRequest::Signal(_) = server.stop_requested().await {
//!     backend.drain(grace).await;
//! }
//! server.close().await;
//! ```
//!
//! # Layout
//!
//! - [`names`]: the environment variables, the reserved list, the exit
//!   statuses.
//! - [`banner`]: the `<FLAG> engaged` line and the truthy rule.
//! - [`identify`]: the identity step the cache key is built from.
//! - [`args`]: [`ContractArgs`] (clap, flattened by each worker) validated
//!   into [`Contract`].
//! - [`process`]: logs, death with the parent, binding the socket.
//! - [`subprocess`]: child processes: commands run to an end under a
//!   deadline with bounded output, parent-death for long-lived ones, PATH
//!   lookup (used by the daemon's host layer too).
//! - [`backend`]: the [`Backend`] trait, [`Phase`], [`GenerateError`].
//! - [`service`]: the one engine.proto service over a backend.
//! - [`serve`]: the server on the socket, stop requests, the close.
//! - `testing` (feature): the worker test harness.

pub mod args;
pub mod backend;
pub mod banner;
pub mod identify;
pub mod names;
pub mod process;
pub mod serve;
pub mod service;
pub mod subprocess;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tt_config;

pub use args::{CacheModeArg, Contract, ContractArgs, UsageError};
pub use backend::{Backend, DrainReport, GenerateError, Phase, PhaseCell, TokenStream};
pub use serve::{Bound, Server, StopRequest};
