//! tt-serving-host, the lower half of tt-servingd: everything that touches
//! the machine (cards, processes, files, the host's memory) and never sees
//! a request or a slot. The daemon (`tt-servingd`, `daemon/`) builds its
//! slots, router and API on it; this crate cannot name them, so "cards know
//! no slots" is the compiler's rule, not a reviewer's.
//!
//! Layout, in layers: a module imports only from layers above it in this
//! list, never from its callers (no import cycle between modules).
//!
//! 1. Foundations, which import nothing of ours but `config`:
//!    - [`config`]: the TOML file, parsed strictly and validated as a
//!      whole; [`config::diff`] compares model definitions.
//!    - [`echo`]: quoting client input, bounded (tt-serving-proto's, which
//!      the OpenAI wire format quotes with too); [`shutdown`]: the
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
//!
//! Every module is public because the daemon is another crate; the daemon
//! re-exports them under its own root, so its code says `crate::cards`.

pub mod bus;
pub mod cache;
pub mod cards;
pub mod config;
pub use tt_serving_proto::echo;
pub mod hang;
pub mod host_memory;
pub mod hostfs;
pub mod metrics;
pub mod notify;
pub mod secrets;
pub mod shutdown;
pub mod worker;
