//! Per-slot process containment: everything a slot's worker starts (an
//! engine, its children, children that call `setsid` and leave the worker's
//! process group) is held together, so that a stop or a kill ends all of
//! it, its memory is counted as one, and an OOM kill inside it is known
//! rather than guessed.
//!
//! Two ways, chosen once at startup (`daemon.containment`) and named in
//! `ttctl status`:
//!
//! - **cgroup v2.** Each worker runs in `<root>/slot-<slot>`, a child of
//!   the daemon's own cgroup (read from the `0::` line of
//!   `/proc/self/cgroup`, under the `cgroup2` mount found in
//!   `/proc/self/mountinfo`). The worker joins it between fork and exec
//!   (a pre-exec hook writes "0" to the slot's `cgroup.procs`, opened
//!   before the fork), so nothing it starts is ever outside. A slot is
//!   killed with `cgroup.kill` (Linux 5.14) or by SIGKILL to each process
//!   in its `cgroup.procs` and those of the cgroups below it (podman's
//!   `--cgroups=split` moves the worker into `runtime/` and the container
//!   into `libpod-payload-<id>/`); it is empty when `cgroup.events` says
//!   `populated 0`, and its children are removed deepest first; its memory is `memory.current` less the inactive
//!   file cache (what the kernel cannot just drop), its peak
//!   `memory.peak`, and `memory.events` `oom_kill` before and after a
//!   death says whether the OOM killer took part. `models.<name>.
//!   memory_max_mib` becomes `memory.max`, with `memory.oom.group` set so
//!   that an OOM kill ends the whole slot, not one engine process.
//!   cgroup v2 lets only leaves hold processes once a controller is
//!   handed down (the "no internal processes" rule), so the daemon first
//!   moves itself into `<root>/daemon`, then enables the memory controller
//!   in `<root>/cgroup.subtree_control`. `<root>` is the daemon's cgroup
//!   when the daemon is alone in it (systemd with `Delegate=yes`; a unit
//!   with `DelegateSubgroup=daemon` starts it in the leaf already); when
//!   it shares its cgroup (started from a shell or a test), `<root>` is a
//!   new `tt-servingd-<pid>` under it, removed at a clean exit and by the
//!   next daemon when this one died.
//! - **Process tree.** Where no writable cgroup v2 exists (containers,
//!   tests, cgroup v1 hosts), a slot is the worker's descendants by parent
//!   links, the processes seen among them earlier (by pid and start time:
//!   an orphan is reparented away from the tree), and every process whose
//!   environment carries the slot's `TT_WORKER_SOCKET` (inherited by an
//!   engine's children unless they clear their environment). The tree is
//!   collected before anything is killed. Memory is the sum of their RSS
//!   (shared pages count once per process); an unrequested SIGKILL is
//!   judged by the host's OOM kill counter (`/proc/vmstat` `oom_kill`).
//!   The daemon is not a child subreaper: orphans would then become its
//!   children, and reaping them without stealing the exit statuses that
//!   tokio waits for (workers, tt-smi, probes) cannot be done safely.
//!
//! In both, what a worker leaves behind when it exits is killed at once,
//! and a daemon killed outright leaves strays that the next daemon ends at
//! startup (stale slot cgroups; processes carrying a worker socket of its
//! socket directory). Writes under the cgroup mount need no link checks
//! (`hostfs`): cgroupfs holds no links and only root or the delegated user
//! may create entries in it.
//!
//! This file is the one type both strategies sit behind (`Containment`,
//! `Enclosure`: what the worker module calls); each strategy is its own
//! file: `cgroup.rs` (the hierarchy, slot cgroups, control files) and
//! `tree.rs` (the process-tree watch, strays of a previous daemon).

use crate::config::ContainmentMode;
use std::os::unix::io::RawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tt_card_lock::procs::{self, Proc};

mod cgroup;
mod error;
mod tree;

pub use error::ContainmentError;

/// How long a kill may take to empty a slot before the daemon gives up
/// waiting (a process in uninterruptible sleep dies when its I/O ends).
pub(super) const KILL_WAIT: Duration = Duration::from_secs(5);
/// The environment variable that marks a slot's processes.
pub const MARKER_VAR: &str = tt_worker_contract::names::SOCKET;

static CONTAINMENT: OnceLock<Containment> = OnceLock::new();

/// How this daemon contains its slots.
#[derive(Debug)]
pub struct Containment {
    kind: Kind,
    description: String,
}

#[derive(Debug)]
enum Kind {
    Cgroup(cgroup::Hierarchy),
    ProcessTree,
}

/// Choose the containment at startup (once per process) and end the
/// strays a previous daemon left: processes whose `TT_WORKER_SOCKET` lies
/// in `socket_dir`. `cgroup` mode that cannot be had is an error naming
/// why and the fix; `auto` then falls back to the process tree.
pub fn init(
    mode: ContainmentMode,
    socket_dir: &Path,
) -> Result<&'static Containment, ContainmentError> {
    let containment = choose(mode)?;
    match &containment.kind {
        Kind::Cgroup(h) => tracing::info!(
            root = %h.root.display(),
            memory = h.memory.as_ref().err().map_or("accounted".to_string(), ToString::to_string),
            kill = if h.root.join(cgroup::DAEMON_LEAF).join("cgroup.kill").exists() { "cgroup.kill" } else { "SIGKILL to each process" },
            "containment: a cgroup v2 per slot"
        ),
        Kind::ProcessTree => {
            tracing::info!(containment = %containment.description, "containment: the process tree")
        }
    }
    tree::end_strays(socket_dir);
    Ok(CONTAINMENT.get_or_init(|| containment))
}

/// The containment chosen at startup; the process tree when none was
/// (unit tests, tools that spawn workers without a daemon).
pub fn get() -> &'static Containment {
    CONTAINMENT.get_or_init(|| Containment {
        kind: Kind::ProcessTree,
        description: "process tree (containment not chosen: not a daemon)".into(),
    })
}

fn choose(mode: ContainmentMode) -> Result<Containment, ContainmentError> {
    if mode == ContainmentMode::ProcessTree {
        return Ok(Containment {
            kind: Kind::ProcessTree,
            description: "process tree (daemon.containment = \"process-tree\")".into(),
        });
    }
    match cgroup::Hierarchy::take() {
        Ok(h) => Ok(Containment {
            description: match &h.memory {
                Ok(()) => format!("cgroup v2 at {} (memory accounted)", h.root.display()),
                Err(why) => format!(
                    "cgroup v2 at {} (memory not accounted: {why})",
                    h.root.display()
                ),
            },
            kind: Kind::Cgroup(h),
        }),
        Err(why) if mode == ContainmentMode::Cgroup => {
            Err(ContainmentError::CgroupRequired(Box::new(why)))
        }
        Err(why) => {
            tracing::warn!(
                "no writable cgroup v2 for the slots ({why}); containing them by the process tree under /proc. For cgroups give the daemon a delegated cgroup (systemd: Delegate=yes)"
            );
            Ok(Containment {
                kind: Kind::ProcessTree,
                description: format!("process tree (no writable cgroup v2: {why})"),
            })
        }
    }
}

impl Containment {
    /// One line for `ttctl status`: which containment, where, and whether
    /// memory is accounted.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// Whether `memory_max_mib` can be enforced; the reason when not.
    pub fn memory_limits(&self) -> Result<(), ContainmentError> {
        match &self.kind {
            Kind::Cgroup(h) => h.memory.clone(),
            Kind::ProcessTree => Err(ContainmentError::LimitWithoutCgroup(
                self.description.clone(),
            )),
        }
    }

    /// Prepare the containment of one worker of `slot` (before it is
    /// spawned): a fresh cgroup, or a process-tree watch. `marker` is the
    /// worker's `TT_WORKER_SOCKET` value; `memory_max` in bytes.
    pub fn enclose(
        &self,
        slot: &str,
        marker: &str,
        memory_max: Option<u64>,
    ) -> Result<Enclosure, ContainmentError> {
        let marker = marker.as_bytes().to_vec();
        let inner = match &self.kind {
            Kind::Cgroup(h) => Inner::Cgroup(h.enclose(slot, memory_max)?),
            Kind::ProcessTree => {
                if memory_max.is_some() {
                    return Err(ContainmentError::LimitWithoutCgroup(
                        self.description.clone(),
                    ));
                }
                Inner::Tree(tree::Watch::default())
            }
        };
        Ok(Enclosure {
            slot: slot.to_string(),
            marker,
            root: AtomicU32::new(0),
            peak_seen: AtomicU64::new(0),
            peak_before: match &inner {
                Inner::Cgroup(c) if c.accounts_memory() => c.memory_peak().unwrap_or(0),
                _ => 0,
            },
            oom_before: oom_counter(&inner),
            left: Mutex::new(Vec::new()),
            inner,
        })
    }

    /// The slot is gone from the config (a reload removed it): remove its
    /// cgroup. Until then it stays from one worker to the next, across
    /// reloads that restart the slot under its name too: the page cache
    /// charged to it (the model's files) must not be handed to the parent,
    /// where the slot's next worker would map it uncounted.
    pub fn release(&self, slot: &str) {
        if let Kind::Cgroup(h) = &self.kind {
            h.release(slot);
        }
    }

    /// At a clean exit, after every worker stopped: remove the slot
    /// cgroups, and the daemon's own root when it made one.
    pub fn close(&self) {
        if let Kind::Cgroup(h) = &self.kind {
            h.close();
        }
    }
}

/// One worker's containment, from before its spawn until it is swept.
#[derive(Debug)]
pub struct Enclosure {
    slot: String,
    /// The worker's `TT_WORKER_SOCKET` value, which every process of the
    /// slot inherits.
    marker: Vec<u8>,
    /// The worker's pid once spawned.
    root: AtomicU32,
    /// The highest memory seen, where the kernel keeps no peak.
    peak_seen: AtomicU64,
    /// The slot cgroup's `memory.peak` when this worker started: the
    /// cgroup outlives its workers, and Linux before 6.12 cannot reset the
    /// peak, so only a peak above this one is this worker's.
    peak_before: u64,
    /// The OOM kill counter when the worker started.
    oom_before: Option<OomCounter>,
    /// What the sweep found left running, kept across sweeps (a wait
    /// dropped mid-sweep sweeps again, and must not forget them).
    left: Mutex<Vec<String>>,
    inner: Inner,
}

/// The strategy's own part of an enclosure.
#[derive(Debug)]
enum Inner {
    Cgroup(cgroup::SlotCgroup),
    Tree(tree::Watch),
}

/// A slot's memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Now: the cgroup's memory less inactive file cache, or the sum of
    /// the processes' RSS.
    pub current: u64,
    /// The highest: the cgroup's `memory.peak` (page cache included), or
    /// the highest `current` seen.
    pub peak: u64,
}

/// Which counter of OOM kills a verdict reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OomCounter {
    /// The slot cgroup's `memory.events` `oom_kill`.
    Slot(u64),
    /// The host's `/proc/vmstat` `oom_kill`.
    Host(u64),
}

/// The OOM killer's counter around a worker's life: evidence for or
/// against an OOM kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomEvidence {
    /// The slot cgroup's `memory.events` `oom_kill` (kills inside the
    /// slot only).
    Slot {
        /// When the worker started.
        before: u64,
        /// When it exited.
        after: u64,
    },
    /// The host's `/proc/vmstat` `oom_kill` (any process on the host).
    Host {
        /// When the worker started.
        before: u64,
        /// When it exited.
        after: u64,
    },
}

impl OomEvidence {
    /// Whether the OOM killer killed something meanwhile.
    #[cfg(test)]
    fn moved(&self) -> bool {
        match *self {
            OomEvidence::Slot { before, after } | OomEvidence::Host { before, after } => {
                after > before
            }
        }
    }
}

impl Enclosure {
    /// The slot's `cgroup.procs`, for the worker to join between fork and
    /// exec; None in the process tree.
    pub(super) fn join_fd(&self) -> Option<RawFd> {
        match &self.inner {
            Inner::Cgroup(c) => c.join_fd(),
            Inner::Tree(_) => None,
        }
    }

    /// The worker was spawned as `pid`.
    pub(super) fn started(&self, pid: u32) {
        self.root.store(pid, Ordering::Relaxed);
        if let Inner::Cgroup(c) = &self.inner {
            c.started();
        }
    }

    /// The slot's processes now (zombies left out), remembered for later.
    /// `marked` also scans every process's environment for the slot's
    /// marker (process tree only; the costly part, done at kills).
    pub fn members(&self, marked: bool) -> Vec<Proc> {
        match &self.inner {
            Inner::Cgroup(c) => c.members(),
            Inner::Tree(t) => {
                let marker = marked.then_some(self.marker.as_slice());
                t.members(self.root.load(Ordering::Relaxed), marker)
            }
        }
    }

    /// The slot's memory now and at its highest.
    pub fn memory(&self) -> Memory {
        let accounted = match &self.inner {
            Inner::Cgroup(c) if c.accounts_memory() => Some(c),
            _ => None,
        };
        let current = match accounted {
            Some(c) => c.memory_current(),
            None => self
                .members(false)
                .iter()
                .map(|p| procs::rss_bytes(p.pid))
                .sum(),
        };
        let seen = self
            .peak_seen
            .fetch_max(current, Ordering::Relaxed)
            .max(current);
        let peak = accounted
            .and_then(|c| c.memory_peak())
            .filter(|p| *p > self.peak_before)
            .unwrap_or(seen);
        Memory { current, peak }
    }

    /// The OOM kill counter since the worker started.
    pub fn oom_evidence(&self) -> Option<OomEvidence> {
        match (self.oom_before?, oom_counter(&self.inner)?) {
            (OomCounter::Slot(before), OomCounter::Slot(after)) => {
                Some(OomEvidence::Slot { before, after })
            }
            (OomCounter::Host(before), OomCounter::Host(after)) => {
                Some(OomEvidence::Host { before, after })
            }
            _ => None,
        }
    }

    /// SIGKILL everything in the slot, the worker included, without
    /// waiting: `cgroup.kill`, or each process collected (tree and
    /// marked processes) before the first signal. Returns how many were
    /// signalled.
    pub fn kill(&self) -> usize {
        match &self.inner {
            Inner::Cgroup(c) => c.kill(),
            Inner::Tree(_) => {
                let members = self.members(true);
                for p in &members {
                    sigkill(p.pid);
                }
                members.len()
            }
        }
    }

    /// After the worker exited (and was reaped): kill what it left in the
    /// slot and wait until it is gone (bounded). The slot's cgroup stays
    /// for its next worker (`Containment::release` removes it). Returns
    /// what was left, as `pid N (comm)`.
    pub async fn sweep(&self) -> Vec<String> {
        // The worker is reaped: its pid is free for anyone now.
        self.root.store(0, Ordering::Relaxed);
        let deadline = Instant::now() + KILL_WAIT;
        loop {
            let members = self.members(true);
            if members.is_empty() {
                break;
            }
            {
                let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
                let new: Vec<String> = members
                    .iter()
                    .map(Proc::words)
                    .filter(|w| !left.contains(w))
                    .collect();
                if !new.is_empty() {
                    tracing::warn!(slot = %self.slot, left = %new.join(", "), "the worker left processes running; killing them");
                    left.extend(new);
                }
            }
            if Instant::now() >= deadline {
                tracing::error!(
                    slot = %self.slot,
                    still = %members.iter().map(Proc::words).collect::<Vec<_>>().join(", "),
                    "processes of the slot survive SIGKILL (uninterruptible sleep?); giving up waiting for them"
                );
                break;
            }
            match &self.inner {
                Inner::Cgroup(c) => {
                    c.kill();
                }
                Inner::Tree(_) => members.iter().for_each(|p| {
                    sigkill(p.pid);
                }),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.left.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The OOM kill counter a slot's verdict reads: its cgroup's, or the
/// host's where memory is not accounted per slot.
fn oom_counter(inner: &Inner) -> Option<OomCounter> {
    match inner {
        Inner::Cgroup(c) if c.accounts_memory() => c.oom_kills().map(OomCounter::Slot),
        _ => procs::host_oom_kills().map(OomCounter::Host),
    }
}

/// SIGKILL one process (never pid 1 or the daemon); false only when the
/// daemon may not signal it.
pub(super) fn sigkill(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return true;
    };
    if raw <= 1 || pid == std::process::id() {
        return true;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(raw),
        nix::sys::signal::Signal::SIGKILL,
    ) != Err(nix::errno::Errno::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_evidence_moves_only_when_the_counter_grew() {
        assert!(OomEvidence::Slot {
            before: 0,
            after: 1
        }
        .moved());
        assert!(!OomEvidence::Host {
            before: 7,
            after: 7
        }
        .moved());
    }

    /// The cgroup memory path on a directory laid out like a slot cgroup
    /// with the memory controller (this host's cgroup v2 has none).
    #[test]
    fn a_slot_cgroups_memory_is_its_working_set_and_its_oom_kills_are_evidence() {
        let dir = tempfile::tempdir().unwrap();
        let slot = dir.path().join("slot-m");
        std::fs::create_dir(&slot).unwrap();
        let put = |name: &str, text: &str| std::fs::write(slot.join(name), text).unwrap();
        put("cgroup.procs", "");
        put("memory.current", "1000000\n");
        put(
            "memory.stat",
            "anon 500000\nfile 500000\ninactive_file 400000\n",
        );
        put("memory.peak", "2000000\n");
        put("memory.events", "low 0\nmax 0\noom 0\noom_kill 0\n");
        let inner = Inner::Cgroup(cgroup::SlotCgroup::at(slot.clone()));
        let enclosure = Enclosure {
            slot: "m".into(),
            marker: Vec::new(),
            root: AtomicU32::new(0),
            peak_seen: AtomicU64::new(0),
            peak_before: 0,
            oom_before: oom_counter(&inner),
            left: Mutex::new(Vec::new()),
            inner,
        };
        assert_eq!(
            enclosure.memory(),
            Memory {
                current: 600_000,
                peak: 2_000_000
            }
        );
        assert_eq!(
            enclosure.oom_evidence(),
            Some(OomEvidence::Slot {
                before: 0,
                after: 0
            })
        );
        put("memory.events", "low 0\nmax 3\noom 2\noom_kill 2\n");
        assert_eq!(
            enclosure.oom_evidence(),
            Some(OomEvidence::Slot {
                before: 0,
                after: 2
            })
        );
        // The next worker in the same cgroup: the 2 MB peak was its
        // predecessor's, so its own is the highest seen until the cgroup's
        // peak grows past it.
        let next = Enclosure {
            peak_before: 2_000_000,
            peak_seen: AtomicU64::new(0),
            slot: "m".into(),
            marker: Vec::new(),
            root: AtomicU32::new(0),
            oom_before: None,
            left: Mutex::new(Vec::new()),
            inner: Inner::Cgroup(cgroup::SlotCgroup::at(slot.clone())),
        };
        assert_eq!(next.memory().peak, 600_000);
        put("memory.peak", "2500000\n");
        assert_eq!(next.memory().peak, 2_500_000);
        // Before Linux 5.19 there is no memory.peak: the highest seen.
        std::fs::remove_file(slot.join("memory.peak")).unwrap();
        put("memory.current", "700000\n");
        assert_eq!(enclosure.memory().peak, 600_000);
    }

    #[tokio::test]
    async fn the_process_tree_finds_a_grandchild_that_left_the_group_and_kills_it() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("w.sock").display().to_string();
        let enclosure = Containment {
            kind: Kind::ProcessTree,
            description: String::new(),
        }
        .enclose("t", &marker, None)
        .unwrap();
        let pidfile = dir.path().join("grandchild");
        // A worker that starts a grandchild in its own session, then waits.
        let mut worker = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "setsid sh -c 'echo $$ > {}; exec sleep 600' & exec sleep 600",
                pidfile.display()
            ))
            .env(MARKER_VAR, &marker)
            .spawn()
            .unwrap();
        enclosure.started(worker.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        let grandchild: u32 = loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break pid;
            }
            assert!(Instant::now() < deadline, "the grandchild never started");
            std::thread::sleep(Duration::from_millis(10));
        };
        let members: Vec<u32> = enclosure.members(false).iter().map(|p| p.pid).collect();
        assert!(members.contains(&worker.id()), "{members:?}");
        assert!(members.contains(&grandchild), "{members:?}");
        assert!(enclosure.memory().current > 0);
        assert!(enclosure.kill() >= 2);
        let _ = worker.wait();
        let left = enclosure.sweep().await;
        assert!(
            procs::stat(grandchild).is_none_or(|p| p.is_zombie()),
            "the grandchild survived; left: {left:?}"
        );
    }
}
