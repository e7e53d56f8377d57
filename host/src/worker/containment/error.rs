//! Why a slot cannot be contained as configured, each case worded with its
//! fix. Cloneable (sources behind `Arc`): the reason memory is not
//! accounted is kept for the daemon's life and handed to every start that
//! asks for a memory limit.

use std::path::PathBuf;
use std::sync::Arc;

/// The fix for a daemon without a writable cgroup v2.
const DELEGATE: &str = "Give the daemon a delegated cgroup (systemd: Delegate=yes, which the NixOS module sets; a container: a private cgroup namespace with /sys/fs/cgroup writable)";

/// What went wrong finding, making or using the slots' cgroups.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ContainmentError {
    /// A `/proc` file the lookup needs cannot be read.
    #[error("cannot read {file}: {source}")]
    Proc {
        /// The file.
        file: &'static str,
        /// Why.
        source: Arc<tt_card_lock::procs::ProcError>,
    },
    /// The host has cgroup v1 only.
    #[error("/proc/self/cgroup has no `0::` line (a cgroup v1 only host)")]
    NoCgroupV2,
    /// No cgroup2 file system is visible.
    #[error("no cgroup2 file system is mounted (none in /proc/self/mountinfo)")]
    NoCgroup2Mount,
    /// The daemon's cgroup lies outside what the mount shows.
    #[error("the daemon's cgroup {cgroup} is outside the cgroup2 mount at {} (which shows {mount_root})", mount.display())]
    OutsideMount {
        /// The daemon's cgroup path.
        cgroup: String,
        /// The mount point.
        mount: PathBuf,
        /// The part of the hierarchy the mount shows.
        mount_root: String,
    },
    /// The directory has no `cgroup.procs`.
    #[error("{} is not a cgroup directory", .0.display())]
    NotACgroup(PathBuf),
    /// A cgroup directory cannot be made.
    #[error("cannot create {}: {source}", path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: Arc<std::io::Error>,
    },
    /// A control file cannot be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Arc<std::io::Error>,
    },
    /// A control file refused a write.
    #[error("cannot write {text:?} to {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        text: String,
        /// Why.
        source: Arc<std::io::Error>,
    },
    /// The daemon cannot move itself into its leaf.
    #[error("cannot move the daemon into {}: {source}", leaf.display())]
    MoveDaemon {
        /// The daemon's leaf cgroup.
        leaf: PathBuf,
        /// Why.
        source: Box<ContainmentError>,
    },
    /// The parent does not offer the memory controller.
    #[error("the memory controller is not available in {} (cgroup.controllers: {available}); {}", root.display(), memory_fix(shared_parent.as_ref()))]
    NoMemoryController {
        /// The slots' root.
        root: PathBuf,
        /// The controllers it has (`none` when empty).
        available: String,
        /// The cgroup the daemon shares, where the controller must be
        /// enabled.
        shared_parent: Option<PathBuf>,
    },
    /// The memory controller cannot be enabled for the slots.
    #[error("cannot enable the memory controller in {}/cgroup.subtree_control: {source}", root.display())]
    MemoryNotEnabled {
        /// The slots' root.
        root: PathBuf,
        /// Why.
        source: Box<ContainmentError>,
    },
    /// A memory limit without the memory controller.
    #[error("a memory limit needs the memory controller in {}", .0.display())]
    LimitWithoutController(PathBuf),
    /// A memory limit with the process tree.
    #[error("the slots are contained by the {0}")]
    LimitWithoutCgroup(String),
    /// `daemon.containment = "cgroup"` on a host that cannot give one.
    #[error("daemon.containment = \"cgroup\", but no writable cgroup v2 can hold the slots: {0}. {DELEGATE}, or set daemon.containment = \"auto\" or \"process-tree\"")]
    CgroupRequired(Box<ContainmentError>),
}

fn memory_fix(shared_parent: Option<&PathBuf>) -> String {
    match shared_parent {
        Some(parent) => format!(
            "it must be enabled in {}/cgroup.subtree_control (or run the daemon under systemd with Delegate=yes)",
            parent.display()
        ),
        None => "with systemd, Delegate=yes enables it".into(),
    }
}

impl ContainmentError {
    pub(super) fn proc(file: &'static str) -> impl FnOnce(tt_card_lock::procs::ProcError) -> Self {
        move |e| ContainmentError::Proc {
            file,
            source: Arc::new(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_place_and_the_fix() {
        let no_memory = ContainmentError::NoMemoryController {
            root: "/sys/fs/cgroup/tt".into(),
            available: "cpu io".into(),
            shared_parent: Some("/sys/fs/cgroup/shared".into()),
        };
        assert_eq!(
            no_memory.to_string(),
            "the memory controller is not available in /sys/fs/cgroup/tt (cgroup.controllers: cpu io); it must be enabled in /sys/fs/cgroup/shared/cgroup.subtree_control (or run the daemon under systemd with Delegate=yes)"
        );
        let required = ContainmentError::CgroupRequired(Box::new(ContainmentError::NoCgroupV2));
        let text = required.to_string();
        assert!(text.contains("a cgroup v1 only host"), "{text}");
        assert!(text.contains("Delegate=yes"), "{text}");
        assert!(
            text.ends_with("or set daemon.containment = \"auto\" or \"process-tree\""),
            "{text}"
        );
    }
}
