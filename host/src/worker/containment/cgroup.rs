//! The cgroup v2 strategy: the daemon's own cgroup found and split into
//! `daemon/` and one `slot-<name>/` per slot, the memory controller handed
//! down, slot cgroups made, emptied, killed and removed, and the control
//! files read (see the module above for the whole design).

use super::{sigkill, ContainmentError, KILL_WAIT};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tt_card_lock::procs::{self, Proc};

/// The leaf the daemon moves itself into.
pub(super) const DAEMON_LEAF: &str = "daemon";
/// The prefix of a daemon's own root under a shared cgroup.
const OWN_ROOT_PREFIX: &str = "tt-servingd-";
/// The prefix of a slot's cgroup.
const SLOT_PREFIX: &str = "slot-";

#[derive(Debug)]
pub(super) struct Hierarchy {
    /// The daemon's cgroup when it started.
    pub(super) origin: PathBuf,
    /// Where slot cgroups are made.
    pub(super) root: PathBuf,
    /// `root` was made for this daemon under a cgroup it shares.
    pub(super) own_root: bool,
    /// Ok when slots' memory is accounted; the reason otherwise.
    pub(super) memory: Result<(), ContainmentError>,
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
    pub(super) fn take() -> Result<Hierarchy, ContainmentError> {
        let rel = procs::own_cgroup_v2()
            .map_err(ContainmentError::proc("/proc/self/cgroup"))?
            .ok_or(ContainmentError::NoCgroupV2)?;
        let (mount, mount_root) = procs::cgroup2_mount()
            .map_err(ContainmentError::proc("/proc/self/mountinfo"))?
            .ok_or(ContainmentError::NoCgroup2Mount)?;
        let Some(origin) = cgroup_dir(&mount, &mount_root, &rel) else {
            return Err(ContainmentError::OutsideMount {
                cgroup: rel,
                mount,
                mount_root,
            });
        };
        if !origin.join("cgroup.procs").exists() {
            return Err(ContainmentError::NotACgroup(origin));
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
                end_cgroup(&dir);
            }
        }
        if own_root {
            std::fs::create_dir(&root).map_err(|e| ContainmentError::Create {
                path: root.clone(),
                source: Arc::new(e),
            })?;
        }
        let leaf = root.join(DAEMON_LEAF);
        if !in_leaf {
            if let Err(e) = std::fs::create_dir(&leaf) {
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    if own_root {
                        let _ = std::fs::remove_dir(&root);
                    }
                    return Err(ContainmentError::Create {
                        path: leaf,
                        source: Arc::new(e),
                    });
                }
            }
            if let Err(e) = write_file(&leaf.join("cgroup.procs"), &me.to_string()) {
                let _ = std::fs::remove_dir(&leaf);
                if own_root {
                    let _ = std::fs::remove_dir(&root);
                }
                return Err(ContainmentError::MoveDaemon {
                    leaf,
                    source: Box::new(e),
                });
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

    /// A fresh (or emptied) cgroup for the next worker of `slot`, with
    /// `memory_max` bytes as its `memory.max`.
    pub(super) fn enclose(
        &self,
        slot: &str,
        memory_max: Option<u64>,
    ) -> Result<SlotCgroup, ContainmentError> {
        let dir = self.slot_dir(slot);
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
            // What a container engine made below it (`podman
            // --cgroups=split`: `runtime/`, `libpod-payload-*/`) goes,
            // its charges moving up to the slot, and so do the
            // controllers its runtime enabled in the slot's
            // `cgroup.subtree_control`: with any there, the slot may
            // hold no process, and the next worker could not join it.
            remove_below(&dir);
            clear_subtree_control(&dir);
        }
        if let Err(e) = std::fs::create_dir(&dir) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(ContainmentError::Create {
                    path: dir,
                    source: Arc::new(e),
                });
            }
        }
        let memory = self.memory.is_ok();
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
            return Err(ContainmentError::LimitWithoutController(self.root.clone()));
        }
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(dir.join("cgroup.procs"))
            .map_err(|e| ContainmentError::Open {
                path: dir.join("cgroup.procs"),
                source: Arc::new(e),
            })?;
        Ok(SlotCgroup {
            dir,
            memory,
            procs: Mutex::new(Some(procs)),
        })
    }

    /// The slot is gone from the config (a reload removed it): remove its
    /// cgroup. Until then it stays from one worker to the next, across
    /// reloads that restart the slot under its name too: the page cache
    /// charged to it (the model's files) must not be handed to the parent,
    /// where the slot's next worker would map it uncounted.
    pub(super) fn release(&self, slot: &str) {
        let dir = self.slot_dir(slot);
        if dir.exists() {
            end_cgroup(&dir);
        }
    }

    /// At a clean exit, after every worker stopped: remove the slot
    /// cgroups, and the daemon's own root when it made one.
    pub(super) fn close(&self) {
        for dir in children(&self.root, SLOT_PREFIX) {
            end_cgroup(&dir);
        }
        if self.own_root {
            // Back into the cgroup it came from, so its root can go.
            let pid = std::process::id().to_string();
            if write_file(&self.origin.join("cgroup.procs"), &pid).is_ok() {
                remove_below(&self.root);
                if let Err(e) = std::fs::remove_dir(&self.root) {
                    tracing::debug!(root = %self.root.display(), error = %e, "cgroup root left in place");
                }
            }
        }
    }
}

/// Hand the memory controller down to the slots, or say why not.
fn enable_memory(root: &Path, shared_parent: Option<&Path>) -> Result<(), ContainmentError> {
    let available = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    if !available.split_whitespace().any(|c| c == "memory") {
        return Err(ContainmentError::NoMemoryController {
            root: root.to_path_buf(),
            available: if available.trim().is_empty() {
                "none".to_string()
            } else {
                available.trim().to_string()
            },
            shared_parent: shared_parent.map(Path::to_path_buf),
        });
    }
    let enabled = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == "memory") {
        return Ok(());
    }
    write_file(&root.join("cgroup.subtree_control"), "+memory").map_err(|e| {
        ContainmentError::MemoryNotEnabled {
            root: root.to_path_buf(),
            source: Box::new(e),
        }
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
            .is_none_or(procs::exists);
        if alive {
            continue;
        }
        for slot in children(&dir, SLOT_PREFIX) {
            tracing::warn!(cgroup = %slot.display(), "ending a slot cgroup that a previous daemon, now dead, left");
            end_cgroup(&slot);
        }
        remove_below(&dir);
        if let Err(e) = std::fs::remove_dir(&dir) {
            tracing::debug!(cgroup = %dir.display(), error = %e, "a dead daemon's cgroup left in place");
        }
    }
}

/// One worker's cgroup: the slot's, emptied and reused by each worker.
#[derive(Debug)]
pub(super) struct SlotCgroup {
    dir: PathBuf,
    /// Whether the memory controller accounts it.
    memory: bool,
    /// The slot's `cgroup.procs`, open for the pre-exec hook until the
    /// worker is spawned.
    procs: Mutex<Option<File>>,
}

impl SlotCgroup {
    /// `cgroup.procs`, for the worker to join between fork and exec.
    pub(super) fn join_fd(&self) -> Option<RawFd> {
        self.procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(File::as_raw_fd)
    }

    /// The worker is spawned: the descriptor is no longer needed.
    pub(super) fn started(&self) {
        self.procs.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// The processes of the cgroup and of those below it (a container
    /// engine's) now, zombies left out.
    pub(super) fn members(&self) -> Vec<Proc> {
        subtree_pids(&self.dir)
            .into_iter()
            .filter_map(procs::stat)
            .filter(|p| !p.is_zombie())
            .collect()
    }

    /// Whether memory is accounted here (otherwise the caller sums RSS).
    pub(super) fn accounts_memory(&self) -> bool {
        self.memory
    }

    /// The working set: `memory.current` less inactive file cache.
    pub(super) fn memory_current(&self) -> u64 {
        let used = read_u64(&self.dir.join("memory.current")).unwrap_or(0);
        let inactive_file = std::fs::read_to_string(self.dir.join("memory.stat"))
            .ok()
            .and_then(|s| stat_field(&s, "inactive_file"))
            .unwrap_or(0);
        used.saturating_sub(inactive_file)
    }

    /// `memory.peak`, where the kernel keeps one (Linux 5.19+).
    pub(super) fn memory_peak(&self) -> Option<u64> {
        read_u64(&self.dir.join("memory.peak"))
    }

    /// `memory.events` `oom_kill`.
    pub(super) fn oom_kills(&self) -> Option<u64> {
        std::fs::read_to_string(self.dir.join("memory.events"))
            .ok()
            .and_then(|s| stat_field(&s, "oom_kill"))
    }

    /// SIGKILL everything in it and below it without waiting; how many
    /// there were.
    pub(super) fn kill(&self) -> usize {
        let n = subtree_pids(&self.dir).len();
        kill_cgroup(&self.dir);
        n
    }

    #[cfg(test)]
    pub(super) fn at(dir: PathBuf) -> SlotCgroup {
        SlotCgroup {
            dir,
            memory: true,
            procs: Mutex::new(None),
        }
    }
}

/// `cgroup.kill` (which takes the cgroups below too), or SIGKILL to each
/// process listed in it and below it (before Linux 5.14). False when the
/// daemon may not kill them.
pub(super) fn kill_cgroup(dir: &Path) -> bool {
    let kill = dir.join("cgroup.kill");
    if kill.exists() && write_file(&kill, "1").is_ok() {
        return true;
    }
    kill_each(dir)
}

/// SIGKILL to each process of the cgroup and of those below it.
fn kill_each(dir: &Path) -> bool {
    subtree_pids(dir).into_iter().all(sigkill)
}

/// Kill a cgroup's processes, those below it included, and wait
/// (blocking, bounded) until it is empty: for startup, shutdown and a
/// slot's leftover cgroup.
pub(super) fn kill_cgroup_sync(dir: &Path) {
    let deadline = Instant::now() + KILL_WAIT;
    while populated(dir) {
        if Instant::now() >= deadline {
            tracing::warn!(cgroup = %dir.display(), "processes in this cgroup survive SIGKILL (uninterruptible sleep?); giving up waiting for them");
            return;
        }
        if !kill_cgroup(dir) {
            tracing::warn!(cgroup = %dir.display(), "cannot kill the processes in this cgroup (not the daemon's to kill)");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kill everything in a cgroup and below it, then remove it and the
/// cgroups below it: a slot that ends, or one a previous daemon left.
pub(super) fn end_cgroup(dir: &Path) {
    kill_cgroup_sync(dir);
    remove_below(dir);
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::debug!(cgroup = %dir.display(), error = %e, "cgroup not removed");
    }
}

/// Whether any process runs in the cgroup or below it: `cgroup.events`
/// `populated` (the slot's own `cgroup.procs` is empty while a container
/// engine holds its processes in child cgroups), else each `cgroup.procs`.
pub(super) fn populated(dir: &Path) -> bool {
    match std::fs::read_to_string(dir.join("cgroup.events"))
        .ok()
        .and_then(|s| stat_field(&s, "populated"))
    {
        Some(n) => n != 0,
        None => !subtree_pids(dir).is_empty(),
    }
}

/// The pids of a cgroup and of every cgroup below it.
pub(super) fn subtree_pids(dir: &Path) -> Vec<u32> {
    let mut pids = cgroup_pids(dir);
    for below in descendants(dir) {
        pids.extend(cgroup_pids(&below));
    }
    pids
}

/// The cgroups below `dir`, each after all of its own descendants (the
/// order they can be removed in). No link is followed (a `DirEntry`'s
/// type is its own).
pub(super) fn descendants(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut next = vec![dir.to_path_buf()];
    while let Some(parent) = next.pop() {
        let Ok(entries) = std::fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                found.push(entry.path());
                next.push(entry.path());
            }
        }
    }
    // Found parents before children: reversed, children come first.
    found.reverse();
    found
}

/// Remove the (empty) cgroups below `dir`, deepest first. rmdir only: a
/// cgroup's control files go with its directory, and cannot be unlinked.
pub(super) fn remove_below(dir: &Path) {
    for below in descendants(dir) {
        if let Err(e) = std::fs::remove_dir(&below) {
            tracing::debug!(cgroup = %below.display(), error = %e, "cgroup not removed");
        }
    }
}

/// Disable every controller enabled in `dir`'s `cgroup.subtree_control`
/// (once the cgroups below it are gone).
fn clear_subtree_control(dir: &Path) {
    let path = dir.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&path).unwrap_or_default();
    let off: Vec<String> = enabled
        .split_whitespace()
        .map(|c| format!("-{c}"))
        .collect();
    if off.is_empty() {
        return;
    }
    if let Err(e) = write_file(&path, &off.join(" ")) {
        tracing::warn!(cgroup = %dir.display(), error = %e, "controllers left enabled below the slot: its next worker cannot join it");
    }
}

/// The pids in a cgroup's `cgroup.procs` (empty when unreadable).
pub(super) fn cgroup_pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Subdirectories of `dir` whose names start with `prefix`.
pub(super) fn children(dir: &Path, prefix: &str) -> Vec<PathBuf> {
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

/// The directory of cgroup `rel` given the mount's point and root (a
/// mount of a subtree shows that subtree's path as its root).
pub(super) fn cgroup_dir(mount: &Path, mount_root: &str, rel: &str) -> Option<PathBuf> {
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
pub(super) fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

pub(super) fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Write a cgroup control file in one `write` (the kernel takes one
/// command per write).
pub(super) fn write_file(path: &Path, text: &str) -> Result<(), ContainmentError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| ContainmentError::Open {
            path: path.to_path_buf(),
            source: Arc::new(e),
        })?;
    file.write_all(text.as_bytes())
        .map_err(|e| ContainmentError::Write {
            path: path.to_path_buf(),
            text: text.to_string(),
            source: Arc::new(e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_and_its_root_name_the_daemons_cgroup_directory() {
        let (mount, root) = (PathBuf::from("/sys/fs/cgroup/unified"), "/".to_string());
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
    fn memory_stat_and_event_fields_are_read_by_name() {
        let events = "low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(stat_field(events, "oom_kill"), Some(1));
        assert_eq!(stat_field(events, "oom"), Some(2));
        assert_eq!(stat_field(events, "nope"), None);
    }

    #[test]
    fn cgroups_below_come_before_their_parents_and_count_as_populated() {
        let dir = tempfile::tempdir().unwrap();
        let slot = dir.path().join("slot-m");
        for d in [
            "runtime",
            "libpod-payload-x/inner",
            "libpod-payload-x/other",
        ] {
            std::fs::create_dir_all(slot.join(d)).unwrap();
        }
        let below = descendants(&slot);
        assert_eq!(below.len(), 4, "{below:?}");
        let at = |name: &str| below.iter().position(|d| d.ends_with(name)).unwrap();
        assert!(at("libpod-payload-x/inner") < at("libpod-payload-x"));
        assert!(at("libpod-payload-x/other") < at("libpod-payload-x"));
        // No cgroup.events: each cgroup.procs, those below included.
        std::fs::write(slot.join("cgroup.procs"), "").unwrap();
        assert!(!populated(&slot));
        std::fs::write(slot.join("libpod-payload-x/inner/cgroup.procs"), "42\n").unwrap();
        assert!(populated(&slot));
        assert_eq!(subtree_pids(&slot), [42]);
        // cgroup.events counts what is below, and is believed first.
        std::fs::write(slot.join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
        assert!(!populated(&slot));
        std::fs::write(slot.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        std::fs::write(slot.join("libpod-payload-x/inner/cgroup.procs"), "").unwrap();
        assert!(populated(&slot));
    }

    /// A cgroup for a test under this process's own, on the real cgroup2
    /// mount; None (the test skipped) where it cannot be had.
    fn real_cgroup(name: &str) -> Option<PathBuf> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: not root");
            return None;
        }
        let rel = procs::own_cgroup_v2().ok()??;
        let (mount, mount_root) = procs::cgroup2_mount().ok()??;
        let own = cgroup_dir(&mount, &mount_root, &rel)?;
        let dir = own.join(format!("tt-cgroup-test-{}-{name}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => Some(dir),
            Err(e) => {
                eprintln!("SKIPPED: cannot create {}: {e}", dir.display());
                None
            }
        }
    }

    /// Ends a test's cgroup and what runs in it, the test failed or not.
    struct Cleanup(PathBuf);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            end_cgroup(&self.0);
        }
    }

    /// A `sleep` moved into cgroup `dir`.
    fn sleep_in(dir: &Path) -> std::process::Child {
        std::fs::create_dir_all(dir).unwrap();
        let child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        write_file(&dir.join("cgroup.procs"), &child.id().to_string()).unwrap();
        child
    }

    fn killed(child: &mut std::process::Child) -> bool {
        use std::os::unix::process::ExitStatusExt;
        child.wait().unwrap().signal() == Some(libc::SIGKILL)
    }

    /// What `podman run --cgroups=split` leaves in a slot: every process
    /// in cgroups below it (`runtime/`, `libpod-payload-*/`), none in its
    /// own `cgroup.procs`. Killed and removed all the same, by
    /// `cgroup.kill` and by the SIGKILL fallback.
    #[test]
    fn a_slot_whose_processes_sit_in_cgroups_below_it_is_killed_and_removed() {
        let Some(base) = real_cgroup("split") else {
            return;
        };
        let _cleanup = Cleanup(base.clone());
        let h = Hierarchy {
            origin: base.clone(),
            root: base.clone(),
            own_root: false,
            memory: Err(ContainmentError::NoCgroupV2),
        };
        let slot = h.enclose("m", None).unwrap();
        let dir = h.slot_dir("m");
        let mut runtime = sleep_in(&dir.join("runtime"));
        let mut payload = sleep_in(&dir.join("libpod-payload-x/inner"));
        assert!(cgroup_pids(&dir).is_empty());
        assert!(populated(&dir));
        let members: Vec<u32> = slot.members().iter().map(|p| p.pid).collect();
        assert!(members.contains(&runtime.id()), "{members:?}");
        assert!(members.contains(&payload.id()), "{members:?}");
        // Before Linux 5.14: SIGKILL to each, those below included.
        assert!(kill_each(&dir));
        assert!(killed(&mut runtime) && killed(&mut payload));
        assert!(!populated(&dir));

        // The slot's next worker: what the last left below it goes.
        let mut left = sleep_in(&dir.join("runtime"));
        drop(h.enclose("m", None).unwrap());
        assert!(killed(&mut left));
        assert!(dir.is_dir() && descendants(&dir).is_empty());

        // The slot removed by a reload, then at shutdown.
        let mut left = sleep_in(&dir.join("libpod-payload-y"));
        h.release("m");
        assert!(killed(&mut left));
        assert!(!dir.exists());
        drop(h.enclose("m", None).unwrap());
        let mut left = sleep_in(&dir.join("runtime/deeper"));
        h.close();
        assert!(killed(&mut left));
        assert!(!dir.exists());
        std::fs::remove_dir(&base).unwrap();
    }
}
