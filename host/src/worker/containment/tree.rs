//! The process-tree strategy, where no writable cgroup v2 exists: a
//! slot's processes are the worker's descendants (read from `/proc`), every
//! process of the slot seen before (a `setsid` grandchild keeps counting
//! after its parent died), and, at kills, every process whose environment
//! carries the slot's `TT_WORKER_SOCKET`.

use super::{sigkill, MARKER_VAR};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use tt_card_lock::procs::{self, Proc};

/// What the tree remembers of one worker's slot.
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// (pid, start time) of every process seen in the slot.
    seen: Mutex<BTreeMap<u32, u64>>,
}

impl Watch {
    /// The slot's processes now, zombies left out: descendants of `root`
    /// (the worker, while it is this daemon's child; 0 once reaped) and of
    /// every process seen before, and with `marker` every process whose
    /// environment carries it.
    pub(super) fn members(&self, root: u32, marker: Option<&[u8]>) -> Vec<Proc> {
        let table = procs::all();
        let me = std::process::id();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let by_pid: BTreeMap<u32, &Proc> = table.iter().map(|p| (p.pid, p)).collect();
        seen.retain(|pid, start| by_pid.get(pid).is_some_and(|p| p.start == *start));
        let mut roots: BTreeSet<u32> = seen.keys().copied().collect();
        // The worker counts only while it is this daemon's child (its pid
        // is not reused before the daemon reaps it).
        if root != 0 && by_pid.get(&root).is_some_and(|p| p.ppid == me) {
            roots.insert(root);
        }
        if let Some(marker) = marker {
            roots.extend(
                table
                    .iter()
                    .filter(|p| p.pid != me && p.pid != 1 && !p.is_zombie())
                    .filter(|p| procs::env_var(p.pid, MARKER_VAR).as_deref() == Some(marker))
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

/// Processes a previous daemon's workers left (their environment names a
/// worker socket in this daemon's socket directory): SIGKILL. Run at
/// startup, before any worker of this daemon exists. A process below a
/// live `tt-servingd` (another daemon whose control socket shares the
/// directory) is not a stray.
pub(super) fn end_strays(socket_dir: &Path) {
    let prefix = format!("{}/", socket_dir.display()).into_bytes();
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
            || !procs::env_var(p.pid, MARKER_VAR).is_some_and(|v| v.starts_with(&prefix))
            || under_a_daemon(p)
        {
            continue;
        }
        tracing::warn!(process = %p.words(), "ending a process a previous daemon's worker left running");
        sigkill(p.pid);
    }
}
