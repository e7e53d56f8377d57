//! tt-servingd, the tt-serving daemon.
//!
//! Layout, in layers: a module imports only from layers above it in this
//! list, never from its callers (no import cycle between modules). Layers
//! 1 to 3 are the crate `tt-serving-host` (`host/`): everything that
//! touches the machine and never sees a request or a slot. They are
//! re-exported here, so `crate::cards` is the host crate's `cards`; being
//! another crate, they cannot import anything below them.
//!
//! 1. Foundations (tt-serving-host), which import nothing of ours but
//!    `config`:
//!    - [`config`]: the TOML file, parsed strictly and validated as a
//!      whole; [`config::diff`] compares model definitions.
//!    - [`echo`]: quoting client input, bounded; [`shutdown`]: the
//!      shutdown signal; [`notify`]: systemd notifications; [`secrets`]:
//!      reading secret files; [`bus`]: the status bus that cards and slots
//!      publish changes on.
//!    - [`hostfs`]: writing on the host so that no planted link redirects
//!      it; [`metrics`]: the Prometheus registry (events only);
//!      [`host_memory`]: the hugepages and RAM the engines share.
//! 2. [`cards`] (tt-serving-host): discovery under
//!    `dev_root`/`sys_root`/`proc_root`, per-card locks, reset with proof,
//!    and [`cards::CardManager`], the one owner of card state.
//! 3. (tt-serving-host) [`cache`]: tensor cache variants, markers, the
//!    guard, warm or cold; [`hang`]: tt-metal's device-hang lines and the
//!    capture kept with a hang (also `tt-servingd hang-capture`);
//!    [`worker`]: spawning and watching a worker process, and containing
//!    everything it starts ([`worker::containment`]: a cgroup v2 per slot,
//!    or the process tree).
//!
//! From here on, this crate:
//!
//! 4. The daemon's own foundations, which import nothing of ours:
//!    [`relay_runtime`]: the runtime that carries inference, apart from
//!    control work; [`listen`]: the TCP listeners with a backlog fit for a
//!    burst of clients; [`usage`]: usage per API key (the key's name).
//! 5. [`slots`]: the slot lifecycle (one model instance on its cards) and
//!    [`slots::SlotManager`], the one owner of slot state.
//! 6. [`retry`]: the retry hint of an unavailable model; [`router`]:
//!    validation, queues, routing and forwarding, with [`router::RouteError`].
//! 7. [`state`]: the daemon's shared handles; [`reload`]: live
//!    reconfiguration; [`borrow`]: lending cards to an outside job;
//!    [`trial`]: a model's slots run arm by arm for `ttctl ab`; [`audit`]:
//!    the trail of control actions, who did what and how it ended.
//! 8. [`api`]: the gRPC services (Control on the local socket; Inference,
//!    health and reflection on the public port), the OpenAI door, the
//!    metrics endpoint; [`preflight`]: `check-config`'s checks of the host.
//! 9. [`daemon`]: startup order, the tick loop, signals and clean
//!    shutdown; [`demo`]: `tt-servingd demo`; [`logging`]: the log on
//!    stderr and, under systemd, the audit records as journal fields;
//!    `fuzzing` (tests and the `fuzzing` feature only): the fuzz targets'
//!    properties over `config` and `router`.
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
mod audit;
mod borrow;
pub mod daemon;
pub mod demo;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod listen;
pub mod logging;
pub mod preflight;
pub mod relay_runtime;
mod reload;
mod retry;
mod router;
mod slots;
mod state;
mod trial;
mod usage;
