//! tt-servingd, the tt-serving daemon.
//!
//! Layout, in layers: a module imports only from layers above it in this
//! list, never from its callers (no import cycle between modules).
//!
//! 1. Foundations, which import nothing of ours but `config`:
//!    - [`config`]: the TOML file, parsed strictly and validated as a
//!      whole; [`config::diff`] compares model definitions.
//!    - [`echo`]: quoting client input, bounded; [`shutdown`]: the
//!      shutdown signal; [`notify`]: systemd notifications; [`secrets`]:
//!      reading secret files; [`bus`]: the status bus that cards and slots
//!      publish changes on.
//!    - [`hostfs`]: writing on the host so that no planted link redirects
//!      it; [`metrics`]: the Prometheus registry (events only);
//!      [`host_memory`]: the hugepages and RAM the engines share.
//! 2. [`cards`]: discovery under `dev_root`/`sys_root`/`proc_root`,
//!    per-card locks, reset with proof, and [`cards::CardManager`], the one
//!    owner of card state.
//! 3. [`cache`]: tensor cache variants, markers, the guard, warm or cold;
//!    [`hang`]: tt-metal's device-hang lines and the capture kept with a
//!    hang (also `tt-servingd hang-capture`);
//!    [`worker`]: spawning and watching a worker process, and containing
//!    everything it starts ([`worker::containment`]: a cgroup v2 per slot,
//!    or the process tree).
//! 4. [`slots`]: the slot lifecycle (one model instance on its cards) and
//!    [`slots::SlotManager`], the one owner of slot state.
//! 5. [`retry`]: the retry hint of an unavailable model; [`router`]:
//!    validation, queues, routing and forwarding, with [`router::RouteError`].
//! 6. [`state`]: the daemon's shared handles; [`reload`]: live
//!    reconfiguration; [`borrow`]: lending cards to an outside job.
//! 7. [`api`]: the gRPC services (Control on the local socket; Inference,
//!    health and reflection on the public port), the metrics endpoint;
//!    [`preflight`]: `check-config`'s checks of the host.
//! 8. [`daemon`]: startup order, the tick loop, signals and clean
//!    shutdown; [`demo`]: `tt-servingd demo`.
//!
//! `ttctl`, the operator's client, is its own crate (`ttctl/`): it needs
//! only the protocols, the card lock (`tt-card-lock`) and the contract's
//! truthy rule.

// The lower layers (1 to 3) live in tt-serving-host; re-exported here so
// that `crate::cards` and `tt_servingd::config` read as before.
use tt_serving_host::{
    bus, cache, echo, host_memory, hostfs, metrics, notify, secrets, shutdown, worker,
};
pub use tt_serving_host::{cards, config, hang};

mod api;
mod borrow;
pub mod daemon;
pub mod demo;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod listen;
pub mod preflight;
pub mod relay_runtime;
mod reload;
mod retry;
mod router;
mod slots;
mod state;
mod trial;
