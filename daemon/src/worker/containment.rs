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
//!   in `cgroup.procs`; its memory is `memory.current` less the inactive
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

use super::procs::{self, Proc};
use crate::config::ContainmentMode;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The leaf the daemon moves itself into.
const DAEMON_LEAF: &str = "daemon";
/// The prefix of a daemon's own root under a shared cgroup.
const OWN_ROOT_PREFIX: &str = "tt-servingd-";
/// The prefix of a slot's cgroup.
const SLOT_PREFIX: &str = "slot-";
/// How long a kill may take to empty a slot before the daemon gives up
/// waiting (a process in uninterruptible sleep dies when its I/O ends).
const KILL_WAIT: Duration = Duration::from_secs(5);
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
    Cgroup(Hierarchy),
    ProcessTree,
}

#[derive(Debug)]
struct Hierarchy {
    /// The daemon's cgroup when it started.
    origin: PathBuf,
    /// Where slot cgroups are made.
    root: PathBuf,
    /// `root` was made for this daemon under a cgroup it shares.
    own_root: bool,
    /// Ok when slots' memory is accounted; the reason otherwise.
    memory: Result<(), String>,
}

/// Choose the containment at startup (once per process) and end the
/// strays a previous daemon left: processes whose `TT_WORKER_SOCKET` lies
/// in `socket_dir`. `cgroup` mode that cannot be had is an error naming
/// why and the fix; `auto` then falls back to the process tree.
pub fn init(mode: ContainmentMode, socket_dir: &Path) -> Result<&'static Containment, String> {
    let containment = choose(mode)?;
    match &containment.kind {
        Kind::Cgroup(h) => tracing::info!(
            root = %h.root.display(),
            memory = h.memory.as_ref().err().map(String::as_str).unwrap_or("accounted"),
            kill = if h.root.join(DAEMON_LEAF).join("cgroup.kill").exists() { "cgroup.kill" } else { "SIGKILL to each process" },
            "containment: a cgroup v2 per slot"
        ),
        Kind::ProcessTree => {
            tracing::info!(containment = %containment.description, "containment: the process tree")
        }
    }
    end_strays(socket_dir);
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

fn choose(mode: ContainmentMode) -> Result<Containment, String> {
    if mode == ContainmentMode::ProcessTree {
        return Ok(Containment {
            kind: Kind::ProcessTree,
            description: "process tree (daemon.containment = \"process-tree\")".into(),
        });
    }
    match Hierarchy::take() {
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
        Err(why) if mode == ContainmentMode::Cgroup => Err(format!(
            "daemon.containment = \"cgroup\", but no writable cgroup v2 can hold the slots: {why}. Give the daemon a delegated cgroup (systemd: Delegate=yes, which the NixOS module sets; a container: a private cgroup namespace with /sys/fs/cgroup writable), or set daemon.containment = \"auto\" or \"process-tree\""
        )),
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
    pub fn memory_limits(&self) -> Result<(), String> {
        match &self.kind {
            Kind::Cgroup(h) => h.memory.clone(),
            Kind::ProcessTree => Err(format!(
                "the slots are contained by the {}",
                self.description
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
    ) -> Result<Enclosure, String> {
        let marker = format!("{MARKER_VAR}={marker}").into_bytes();
        let inner = match &self.kind {
            Kind::Cgroup(h) => {
                let dir = h.slot_dir(slot);
                if dir.exists() {
                    // The slot's previous worker's cgroup, kept on purpose
                    // (see `release`): empty it (a worker the daemon
                    // dropped mid-kill) and reuse it, so the page cache the
                    // slot's files hold (the model the next worker maps
                    // again) stays charged to the slot. Removed, those
                    // pages go to the unit's cgroup, the new worker's
                    // memory.current leaves them out (about 97 MB for
                    // SmolLM2, seen in the systemd guest) and memory.max
                    // does not bound them.
                    kill_cgroup_sync(&dir);
                }
                if let Err(e) = std::fs::create_dir(&dir) {
                    if e.kind() != std::io::ErrorKind::AlreadyExists {
                        return Err(format!(
                            "cannot create the slot's cgroup {}: {e}",
                            dir.display()
                        ));
                    }
                }
                let memory = h.memory.is_ok();
                if memory {
                    // "max" too: a reused cgroup may hold an older limit.
                    let max = memory_max.map_or("max".to_string(), |m| m.to_string());
                    write_file(&dir.join("memory.max"), &max)?;
                    // An OOM kill takes the whole slot: an engine that
                    // lost one process cannot serve anyway.
                    if let Err(e) = write_file(&dir.join("memory.oom.group"), "1") {
                        tracing::debug!(slot, error = %e, "memory.oom.group not set");
                    }
                } else if memory_max.is_some() {
                    return Err(format!(
                        "a memory limit needs the memory controller in {}",
                        h.root.display()
                    ));
                }
                let procs = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(dir.join("cgroup.procs"))
                    .map_err(|e| format!("cannot open {}/cgroup.procs: {e}", dir.display()))?;
                Inner::Cgroup {
                    dir,
                    memory,
                    procs: Mutex::new(Some(procs)),
                }
            }
            Kind::ProcessTree => {
                if memory_max.is_some() {
                    return Err("a memory limit needs cgroup containment".into());
                }
                Inner::Tree {
                    seen: Mutex::new(BTreeMap::new()),
                }
            }
        };
        Ok(Enclosure {
            slot: slot.to_string(),
            marker,
            root: AtomicU32::new(0),
            peak_seen: AtomicU64::new(0),
            peak_before: match &inner {
                Inner::Cgroup {
                    dir, memory: true, ..
                } => read_u64(&dir.join("memory.peak")).unwrap_or(0),
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
        let Kind::Cgroup(h) = &self.kind else {
            return;
        };
        let dir = h.slot_dir(slot);
        if dir.exists() {
            kill_cgroup_sync(&dir);
            if let Err(e) = std::fs::remove_dir(&dir) {
                tracing::debug!(cgroup = %dir.display(), error = %e, "slot cgroup not removed");
            }
        }
    }

    /// At a clean exit, after every worker stopped: remove the slot
    /// cgroups, and the daemon's own root when it made one.
    pub fn close(&self) {
        let Kind::Cgroup(h) = &self.kind else {
            return;
        };
        for dir in children(&h.root, SLOT_PREFIX) {
            kill_cgroup_sync(&dir);
            let _ = std::fs::remove_dir(&dir);
        }
        if h.own_root {
            // Back into the cgroup it came from, so its root can go.
            let pid = std::process::id().to_string();
            if write_file(&h.origin.join("cgroup.procs"), &pid).is_ok() {
                let _ = std::fs::remove_dir(h.root.join(DAEMON_LEAF));
                if let Err(e) = std::fs::remove_dir(&h.root) {
                    tracing::debug!(root = %h.root.display(), error = %e, "cgroup root left in place");
                }
            }
        }
    }
}

impl Hierarchy {
    /// The cgroup of `slot` (a `/` in its name becomes `_`).
    fn slot_dir(&self, slot: &str) -> PathBuf {
        self.root
            .join(format!("{SLOT_PREFIX}{}", slot.replace('/', "_")))
    }

    /// Find the daemon's cgroup, make the slots' root in it, move the
    /// daemon into its leaf, and hand the memory controller down when it
    /// can.
    fn take() -> Result<Hierarchy, String> {
        let own = read("/proc/self/cgroup")?;
        let rel = self_cgroup(&own)
            .ok_or("/proc/self/cgroup has no `0::` line (a cgroup v1 only host)".to_string())?;
        let mountinfo = read("/proc/self/mountinfo")?;
        let (mount, mount_root) = cgroup2_mount(&mountinfo).ok_or(
            "no cgroup2 file system is mounted (none in /proc/self/mountinfo)".to_string(),
        )?;
        let origin = cgroup_dir(&mount, &mount_root, &rel).ok_or(format!(
            "the daemon's cgroup {rel} is outside the cgroup2 mount at {} (which shows {mount_root})",
            mount.display()
        ))?;
        if !origin.join("cgroup.procs").exists() {
            return Err(format!("{} is not a cgroup directory", origin.display()));
        }
        let me = std::process::id();
        let parent = origin.parent().map(Path::to_path_buf);
        let in_leaf = origin.file_name().is_some_and(|n| n == DAEMON_LEAF)
            && parent
                .as_ref()
                .is_some_and(|p| p.join("cgroup.procs").exists() && cgroup_pids(p).is_empty());
        let (root, own_root) = if in_leaf {
            (parent.unwrap_or_else(|| origin.clone()), false)
        } else if cgroup_pids(&origin) == [me] {
            (origin.clone(), false)
        } else {
            end_stale_roots(&origin);
            (origin.join(format!("{OWN_ROOT_PREFIX}{me}")), true)
        };
        if !own_root {
            // A previous run of this daemon, killed outright, left these.
            for dir in children(&root, SLOT_PREFIX) {
                tracing::warn!(cgroup = %dir.display(), "ending a slot cgroup a previous daemon left");
                kill_cgroup_sync(&dir);
                let _ = std::fs::remove_dir(&dir);
            }
        }
        if own_root {
            std::fs::create_dir(&root)
                .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
        }
        let leaf = root.join(DAEMON_LEAF);
        if !in_leaf {
            if let Err(e) = std::fs::create_dir(&leaf) {
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    if own_root {
                        let _ = std::fs::remove_dir(&root);
                    }
                    return Err(format!("cannot create {}: {e}", leaf.display()));
                }
            }
            if let Err(e) = write_file(&leaf.join("cgroup.procs"), &me.to_string()) {
                let _ = std::fs::remove_dir(&leaf);
                if own_root {
                    let _ = std::fs::remove_dir(&root);
                }
                return Err(format!(
                    "cannot move the daemon into {}: {e}",
                    leaf.display()
                ));
            }
        }
        let memory = enable_memory(&root, own_root.then_some(origin.as_path()));
        Ok(Hierarchy {
            origin,
            root,
            own_root,
            memory,
        })
    }
}

/// Hand the memory controller down to the slots, or say why not.
fn enable_memory(root: &Path, shared_parent: Option<&Path>) -> Result<(), String> {
    let available = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    if !available.split_whitespace().any(|c| c == "memory") {
        let list = if available.trim().is_empty() {
            "none".to_string()
        } else {
            available.trim().to_string()
        };
        let fix = match shared_parent {
            Some(parent) => format!(
                "; it must be enabled in {}/cgroup.subtree_control (or run the daemon under systemd with Delegate=yes)",
                parent.display()
            ),
            None => "; with systemd, Delegate=yes enables it".into(),
        };
        return Err(format!(
            "the memory controller is not available in {} (cgroup.controllers: {list}){fix}",
            root.display()
        ));
    }
    let enabled = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == "memory") {
        return Ok(());
    }
    write_file(&root.join("cgroup.subtree_control"), "+memory").map_err(|e| {
        format!(
            "cannot enable the memory controller in {}/cgroup.subtree_control: {e}",
            root.display()
        )
    })
}

/// Roots of daemons that died without cleaning up (`tt-servingd-<pid>`
/// whose pid is gone): their slots are killed and the cgroups removed.
fn end_stale_roots(shared: &Path) {
    for dir in children(shared, OWN_ROOT_PREFIX) {
        let alive = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(OWN_ROOT_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_none_or(|pid| Path::new("/proc").join(pid.to_string()).exists());
        if alive {
            continue;
        }
        for slot in children(&dir, SLOT_PREFIX) {
            tracing::warn!(cgroup = %slot.display(), "ending a slot cgroup that a previous daemon, now dead, left");
            kill_cgroup_sync(&slot);
            let _ = std::fs::remove_dir(&slot);
        }
        let _ = std::fs::remove_dir(dir.join(DAEMON_LEAF));
        if let Err(e) = std::fs::remove_dir(&dir) {
            tracing::debug!(cgroup = %dir.display(), error = %e, "a dead daemon's cgroup left in place");
        }
    }
}

/// Processes a previous daemon's workers left (their environment names a
/// worker socket in this daemon's socket directory): SIGKILL. Run at
/// startup, before any worker of this daemon exists. A process below a
/// live `tt-servingd` (another daemon whose control socket shares the
/// directory) is not a stray.
fn end_strays(socket_dir: &Path) {
    let prefix = format!("{MARKER_VAR}={}/", socket_dir.display()).into_bytes();
    let me = std::process::id();
    let table = procs::all();
    let by_pid: BTreeMap<u32, &Proc> = table.iter().map(|p| (p.pid, p)).collect();
    let under_a_daemon = |p: &Proc| {
        let mut pid = p.ppid;
        for _ in 0..64 {
            match by_pid.get(&pid) {
                Some(a) if a.pid > 1 && a.pid != me => {
                    if a.comm == "tt-servingd" {
                        return true;
                    }
                    pid = a.ppid;
                }
                _ => return false,
            }
        }
        false
    };
    for p in &table {
        if p.pid == me
            || p.pid == 1
            || p.is_zombie()
            || !procs::has_env(p.pid, &prefix, true)
            || under_a_daemon(p)
        {
            continue;
        }
        tracing::warn!(process = %p.words(), "ending a process a previous daemon's worker left running");
        sigkill(p.pid);
    }
}

/// One worker's containment, from before its spawn until it is swept.
#[derive(Debug)]
pub struct Enclosure {
    slot: String,
    /// `TT_WORKER_SOCKET=<socket>`, as it appears in the environment.
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

#[derive(Debug)]
enum Inner {
    Cgroup {
        dir: PathBuf,
        memory: bool,
        /// The slot's `cgroup.procs`, open for the pre-exec hook until the
        /// worker is spawned.
        procs: Mutex<Option<File>>,
    },
    Tree {
        /// (pid, start time) of every process seen in the slot.
        seen: Mutex<BTreeMap<u32, u64>>,
    },
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
    pub fn moved(&self) -> bool {
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
            Inner::Cgroup { procs, .. } => procs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(File::as_raw_fd),
            Inner::Tree { .. } => None,
        }
    }

    /// The worker was spawned as `pid`.
    pub(super) fn started(&self, pid: u32) {
        self.root.store(pid, Ordering::Relaxed);
        if let Inner::Cgroup { procs, .. } = &self.inner {
            procs.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }

    /// The slot's processes now (zombies left out), remembered for later.
    /// `marked` also scans every process's environment for the slot's
    /// marker (process tree only; the costly part, done at kills).
    pub fn members(&self, marked: bool) -> Vec<Proc> {
        match &self.inner {
            Inner::Cgroup { dir, .. } => cgroup_pids(dir)
                .into_iter()
                .filter_map(procs::stat)
                .filter(|p| !p.is_zombie())
                .collect(),
            Inner::Tree { seen } => {
                let table = procs::all();
                let me = std::process::id();
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                let by_pid: BTreeMap<u32, &Proc> = table.iter().map(|p| (p.pid, p)).collect();
                seen.retain(|pid, start| by_pid.get(pid).is_some_and(|p| p.start == *start));
                let mut roots: BTreeSet<u32> = seen.keys().copied().collect();
                let root = self.root.load(Ordering::Relaxed);
                // The worker counts only while it is this daemon's child
                // (its pid is not reused before the daemon reaps it).
                if root != 0 && by_pid.get(&root).is_some_and(|p| p.ppid == me) {
                    roots.insert(root);
                }
                if marked {
                    roots.extend(
                        table
                            .iter()
                            .filter(|p| p.pid != me && p.pid != 1 && !p.is_zombie())
                            .filter(|p| procs::has_env(p.pid, &self.marker, false))
                            .map(|p| p.pid),
                    );
                }
                let mut all = procs::descendants(&table, &roots);
                all.extend(roots);
                let members: Vec<Proc> = all
                    .into_iter()
                    .filter(|pid| *pid != me && *pid != 1)
                    .filter_map(|pid| by_pid.get(&pid).map(|p| (*p).clone()))
                    .filter(|p| !p.is_zombie())
                    .collect();
                for p in &members {
                    seen.insert(p.pid, p.start);
                }
                members
            }
        }
    }

    /// The slot's memory now and at its highest.
    pub fn memory(&self) -> Memory {
        let current = match &self.inner {
            Inner::Cgroup {
                dir, memory: true, ..
            } => {
                let used = read_u64(&dir.join("memory.current")).unwrap_or(0);
                let inactive_file = std::fs::read_to_string(dir.join("memory.stat"))
                    .ok()
                    .and_then(|s| stat_field(&s, "inactive_file"))
                    .unwrap_or(0);
                used.saturating_sub(inactive_file)
            }
            _ => self
                .members(false)
                .iter()
                .map(|p| procs::rss_bytes(p.pid))
                .sum(),
        };
        let seen = self
            .peak_seen
            .fetch_max(current, Ordering::Relaxed)
            .max(current);
        let peak = match &self.inner {
            Inner::Cgroup {
                dir, memory: true, ..
            } => read_u64(&dir.join("memory.peak"))
                .filter(|p| *p > self.peak_before)
                .unwrap_or(seen),
            _ => seen,
        };
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
            Inner::Cgroup { dir, .. } => {
                let n = cgroup_pids(dir).len();
                kill_cgroup(dir);
                n
            }
            Inner::Tree { .. } => {
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
                Inner::Cgroup { dir, .. } => {
                    kill_cgroup(dir);
                }
                Inner::Tree { .. } => members.iter().for_each(|p| {
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
        Inner::Cgroup {
            dir, memory: true, ..
        } => std::fs::read_to_string(dir.join("memory.events"))
            .ok()
            .and_then(|s| stat_field(&s, "oom_kill"))
            .map(OomCounter::Slot),
        _ => procs::host_oom_kills().map(OomCounter::Host),
    }
}

/// `cgroup.kill`, or SIGKILL to each process listed (before Linux 5.14).
/// False when the daemon may not kill them.
fn kill_cgroup(dir: &Path) -> bool {
    let kill = dir.join("cgroup.kill");
    if kill.exists() && write_file(&kill, "1").is_ok() {
        return true;
    }
    cgroup_pids(dir).into_iter().all(sigkill)
}

/// Kill a cgroup's processes and wait (blocking, bounded) until it is
/// empty: for startup, shutdown and a slot's leftover cgroup.
fn kill_cgroup_sync(dir: &Path) {
    let deadline = Instant::now() + KILL_WAIT;
    while !cgroup_pids(dir).is_empty() && Instant::now() < deadline {
        if !kill_cgroup(dir) {
            tracing::warn!(cgroup = %dir.display(), "cannot kill the processes in this cgroup (not the daemon's to kill)");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILL one process (never pid 1 or the daemon); false only when the
/// daemon may not signal it.
fn sigkill(pid: u32) -> bool {
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

/// The pids in a cgroup's `cgroup.procs` (empty when unreadable).
fn cgroup_pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Subdirectories of `dir` whose names start with `prefix`.
fn children(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// The path of the `0::` line of `/proc/self/cgroup` (cgroup v2).
fn self_cgroup(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

/// The mount point and root of the first `cgroup2` mount in
/// `/proc/self/mountinfo`.
fn cgroup2_mount(text: &str) -> Option<(PathBuf, String)> {
    text.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = left.split_whitespace().collect();
        Some((
            PathBuf::from(unescape_mount(fields.get(4)?)),
            unescape_mount(fields.get(3)?),
        ))
    })
}

/// mountinfo writes spaces, tabs, newlines and backslashes as octal.
fn unescape_mount(field: &str) -> String {
    let mut out = Vec::new();
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of cgroup `rel` given the mount's point and root (a
/// mount of a subtree shows that subtree's path as its root).
fn cgroup_dir(mount: &Path, mount_root: &str, rel: &str) -> Option<PathBuf> {
    let root = mount_root.trim_end_matches('/');
    let below = if root.is_empty() {
        rel
    } else if rel == root {
        ""
    } else {
        rel.strip_prefix(root)?.strip_prefix('/')?
    };
    let below = below.trim_start_matches('/');
    if below.split('/').any(|c| c == "..") {
        return None;
    }
    Some(if below.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(below)
    })
}

/// A `key value` field of `memory.stat` or `memory.events`.
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))
}

/// Write a cgroup control file in one `write` (the kernel takes one
/// command per write).
fn write_file(path: &Path, text: &str) -> Result<(), String> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    file.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write {text:?} to {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v2_line_and_mount_name_the_daemons_cgroup_directory() {
        let own = "9:name=systemd:/\n4:memory:/x\n0::/system.slice/tt.service\n";
        assert_eq!(
            self_cgroup(own).as_deref(),
            Some("/system.slice/tt.service")
        );
        assert_eq!(self_cgroup("4:memory:/x\n"), None);
        let mountinfo =
            "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                         41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let (mount, root) = cgroup2_mount(mountinfo).unwrap();
        assert_eq!(mount, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(root, "/");
        assert_eq!(
            cgroup_dir(&mount, &root, "/system.slice/tt.service"),
            Some(PathBuf::from(
                "/sys/fs/cgroup/unified/system.slice/tt.service"
            ))
        );
        assert_eq!(cgroup_dir(&mount, &root, "/"), Some(mount.clone()));
        // A mount of a subtree (a container's view without a namespace).
        let sub = Path::new("/sys/fs/cgroup");
        assert_eq!(
            cgroup_dir(sub, "/docker/abc", "/docker/abc/x"),
            Some(PathBuf::from("/sys/fs/cgroup/x"))
        );
        assert_eq!(
            cgroup_dir(sub, "/docker/abc", "/docker/abc"),
            Some(sub.to_path_buf())
        );
        assert_eq!(cgroup_dir(sub, "/docker/abc", "/docker/abcd"), None);
        assert_eq!(cgroup_dir(sub, "/docker/abc", "/other"), None);
        // Outside a cgroup namespace's root.
        assert_eq!(cgroup_dir(sub, "/", "/../.."), None);
    }

    #[test]
    fn mount_points_with_spaces_are_unescaped() {
        let line = "41 31 0:38 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(line).unwrap().0, PathBuf::from("/mnt/cg two"));
    }

    #[test]
    fn memory_stat_and_event_fields_are_read_by_name() {
        let events = "low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(stat_field(events, "oom_kill"), Some(1));
        assert_eq!(stat_field(events, "oom"), Some(2));
        assert_eq!(stat_field(events, "nope"), None);
    }

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
        let inner = Inner::Cgroup {
            dir: slot.clone(),
            memory: true,
            procs: Mutex::new(None),
        };
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
            inner: Inner::Cgroup {
                dir: slot.clone(),
                memory: true,
                procs: Mutex::new(None),
            },
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
