//! One exclusive lock per card, shared by everyone who may touch the card.
//!
//! The field lesson: two engine processes on one card block or corrupt each
//! other, so the daemon, `ttctl card borrow` and benchmark scripts must agree
//! on who owns a card. The agreement is a `flock` on
//! `<lock_dir>/<BDF>.lock` (scripts can use `flock(1)` on the same path). The
//! kernel drops a flock when its holder dies, so a killed daemon never leaves
//! a stale lock. The holder writes its pid and purpose into the file; for
//! holders that do not (plain `flock(1)`), `/proc/locks` names the pid.
//!
//! Who may hold a card lock: root (the daemon) and the admin group
//! (`daemon.control_admin_group`; the field's scripts and benchmarks run as
//! operators). Lock files are mode 0660 with the admin group, or 0600 when
//! there is none, because `flock` works on any descriptor its caller could
//! open: a world-readable lock file would let any local user keep the daemon
//! away from a card. Lock files are opened without following links and only
//! when they are plain files with one link (see [`nofollow`]).

pub mod nofollow;
pub mod procs;
pub mod umd;

use fs2::FileExt;
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Who holds a card's lock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockHolder {
    /// Holder's pid (0 when it could not be determined).
    pub pid: u32,
    /// What the holder said it is doing (empty when it did not say).
    pub purpose: String,
    /// The holder's user name (or `uid N`); empty when unknown.
    pub user: String,
    /// The holder's command line; empty when unknown.
    pub command: String,
}

impl LockHolder {
    /// `pid 4242 (alice: flock … bench.sh)` or `pid 4242 for <purpose>`,
    /// whatever is known.
    pub fn describe(&self) -> String {
        let mut text = if self.pid == 0 {
            "an unknown process".to_string()
        } else {
            format!("pid {}", self.pid)
        };
        let who: Vec<&str> = [self.user.as_str(), self.command.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        if !who.is_empty() {
            text.push_str(&format!(" ({})", who.join(": ")));
        }
        if !self.purpose.is_empty() {
            text.push_str(&format!(" for {}", self.purpose));
        }
        text
    }
}

/// Why a lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Someone else holds it.
    #[error("card {bdf} is locked by {} ({}); wait for it to finish or stop it", holder_text(.holder), .path.display())]
    Held {
        /// The card.
        bdf: String,
        /// The lock file.
        path: PathBuf,
        /// Who holds it, when known (boxed: errors stay small).
        holder: Option<Box<LockHolder>>,
    },
    /// Processes of users who may not hold card locks have the lock file
    /// open: they opened it while its mode let them (a lock file that a
    /// script's `flock(1)` created readable by everyone), and a descriptor
    /// outlives the mode's repair, so they can `flock` it whenever the card
    /// is free.
    #[error("the lock file {} of card {bdf} is open in {}, of a user who may not hold card locks (opened while the file was readable by others; its mode is repaired now, but an open descriptor can still take the lock whenever the card is free); stop that process (kill {}), then the card is the daemon's again", .path.display(), describe_all(.openers), pids(.openers))]
    Foreign {
        /// The card.
        bdf: String,
        /// The lock file.
        path: PathBuf,
        /// The processes.
        openers: Vec<LockHolder>,
    },
    /// The lock file could not be opened.
    #[error("cannot open lock file {}: {source}; check that the lock dir exists and that you are root or in the admin group", .path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

fn describe_all(holders: &[LockHolder]) -> String {
    holders
        .iter()
        .map(LockHolder::describe)
        .collect::<Vec<_>>()
        .join(", ")
}

fn pids(holders: &[LockHolder]) -> String {
    holders
        .iter()
        .map(|h| h.pid.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn holder_text(holder: &Option<Box<LockHolder>>) -> String {
    match holder {
        Some(h) => h.describe(),
        None => "another process".into(),
    }
}

/// Mode and group of the lock files this process creates or repairs.
#[derive(Debug, Clone, Copy)]
pub struct LockPolicy {
    /// Mode of a lock file.
    pub mode: u32,
    /// Group to give it (the admin group), None: leave the group alone.
    pub group: Option<u32>,
    /// Whether to repair the mode and group of an existing file.
    pub repair: bool,
}

impl LockPolicy {
    /// The daemon's: 0660 with the admin group, 0600 when there is none
    /// (the group then grants nothing and is left alone: a daemon that is
    /// not root may not give a file to root's group, and warned at every
    /// lock when it tried, as under the NixOS unit); existing files are
    /// repaired.
    pub fn daemon(admin_gid: Option<u32>) -> LockPolicy {
        LockPolicy {
            mode: if admin_gid.is_some() { 0o660 } else { 0o600 },
            group: admin_gid,
            repair: true,
        }
    }

    /// A borrower's (`ttctl card borrow`, run by an admin): a file it
    /// creates is 0660 (the lock dir's setgid bit gives it the admin
    /// group); the daemon's files are left as they are.
    pub fn borrower() -> LockPolicy {
        LockPolicy {
            mode: 0o660,
            group: None,
            repair: false,
        }
    }
}

impl Default for LockPolicy {
    fn default() -> Self {
        LockPolicy::daemon(None)
    }
}

/// A held card lock; dropping it releases the lock.
#[derive(Debug)]
pub struct CardLock {
    file: File,
    bdf: String,
}

impl CardLock {
    /// The card this lock is for.
    pub fn bdf(&self) -> &str {
        &self.bdf
    }

    /// Let a child process inherit this lock: the lock then lasts until
    /// every process holding the descriptor is gone, not only this one
    /// (`ttctl card borrow` hands its locks to the job this way, so a job
    /// that outlives a killed ttctl keeps the card from the daemon).
    pub fn share_with_children(&self) -> io::Result<()> {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        let flags = fcntl(&self.file, FcntlArg::F_GETFD).map_err(io::Error::from)?;
        let flags = FdFlag::from_bits_truncate(flags) - FdFlag::FD_CLOEXEC;
        fcntl(&self.file, FcntlArg::F_SETFD(flags)).map_err(io::Error::from)?;
        Ok(())
    }
}

impl Drop for CardLock {
    fn drop(&mut self) {
        // Clear our record first so nobody reads a stale holder; the kernel
        // releases the flock when the file closes anyway.
        let _ = self.file.set_len(0);
        let _ = FileExt::unlock(&self.file);
    }
}

/// The lock file for a card.
pub fn lock_path(lock_dir: &Path, bdf: &str) -> PathBuf {
    lock_dir.join(format!("{bdf}.lock"))
}

fn open(path: &Path, policy: LockPolicy) -> Result<File, LockError> {
    let io_error = |source| LockError::Io {
        path: path.to_path_buf(),
        source,
    };
    match nofollow::open_in_place(path, policy.mode) {
        Ok(file) => {
            repair_mode(path, &file, policy);
            Ok(file)
        }
        // An operator in the admin group may not write the daemon's lock
        // files when the mode lacks group write; flock works on a
        // read-only descriptor too.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            let file = nofollow::open_read(path).map_err(io_error)?;
            nofollow::check_plain(path, &file).map_err(io_error)?;
            Ok(file)
        }
        Err(e) => Err(io_error(e)),
    }
}

/// Give a lock file the policy's mode and group, whoever made it (a
/// script's `flock(1)` creates it with its umask, often 0644, which would
/// let every user hold the card). Done on the open descriptor, so it cannot
/// be redirected; only root or the file's owner may.
fn repair_mode(path: &Path, file: &File, policy: LockPolicy) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = file.metadata() else { return };
    let me = nix::unistd::geteuid();
    if !policy.repair || (!me.is_root() && meta.uid() != me.as_raw()) {
        return;
    }
    if let Some(gid) = policy.group.filter(|g| *g != meta.gid()) {
        if let Err(e) = std::os::unix::fs::fchown(file, None, Some(gid)) {
            tracing::warn!(path = %path.display(), error = %e, "cannot give the lock file to the admin group");
        }
    }
    if meta.mode() & 0o7777 != policy.mode {
        if let Err(e) = file.set_permissions(std::fs::Permissions::from_mode(policy.mode)) {
            tracing::warn!(path = %path.display(), error = %e, "cannot set the lock file's mode");
        }
    }
}

/// Take the card's lock without waiting; on success record our pid and
/// purpose in the file.
pub fn try_lock(
    lock_dir: &Path,
    bdf: &str,
    purpose: &str,
    policy: LockPolicy,
) -> Result<CardLock, LockError> {
    let path = lock_path(lock_dir, bdf);
    let mut file = open(&path, policy)?;
    // The daemon's policy: no one who may not hold the lock keeps a way
    // to it.
    if policy.repair {
        let openers = foreign_openers(&file, policy);
        if !openers.is_empty() {
            return Err(LockError::Foreign {
                bdf: bdf.to_string(),
                path,
                openers,
            });
        }
    }
    if file.try_lock_exclusive().is_err() {
        return Err(LockError::Held {
            bdf: bdf.to_string(),
            holder: holder_of(&path).map(Box::new),
            path,
        });
    }
    let record = format!("pid={}\npurpose={purpose}\n", std::process::id());
    let written = file
        .set_len(0)
        .and_then(|_| file.rewind())
        .and_then(|_| file.write_all(record.as_bytes()));
    if let Err(e) = written {
        // Read-only descriptor: the lock holds; /proc/locks names us.
        tracing::debug!(path = %path.display(), error = %e, "cannot record the lock holder");
    }
    Ok(CardLock {
        file,
        bdf: bdf.to_string(),
    })
}

/// The other processes with the lock file open whose user may not hold
/// card locks: not root, not this process's user, not in the policy's
/// (admin) group.
fn foreign_openers(file: &File, policy: LockPolicy) -> Vec<LockHolder> {
    let Ok(meta) = file.metadata() else {
        return Vec::new();
    };
    let me = nix::unistd::geteuid().as_raw();
    procs::with_open(meta.dev(), meta.ino())
        .into_iter()
        .filter(|pid| {
            let Some(ids) = procs::ids(*pid) else {
                return false;
            };
            let allowed = ids.uid == 0
                || ids.uid == me
                || policy
                    .group
                    .is_some_and(|g| ids.gid == g || ids.groups.contains(&g));
            !allowed
        })
        .map(|pid| {
            let (user, command) = procs::identity(pid);
            LockHolder {
                pid,
                purpose: String::new(),
                user,
                command,
            }
        })
        .collect()
}

/// Who holds the lock at `path` now, if anyone. The kernel's `/proc/locks`
/// names the process that took the flock; when that process is gone but
/// the lock lives on in a descriptor it handed to children (a borrowed job
/// that outlived its ttctl), the holders are the processes that still have
/// the file open. The purpose comes from the file's record.
pub fn holder_of(path: &Path) -> Option<LockHolder> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let locker = procs::flock_holder(meta.dev(), meta.ino())?;
    let mut text = String::new();
    if let Ok(mut f) = nofollow::open_read(path) {
        let _ = f.read_to_string(&mut text);
    }
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
    };
    let recorded_pid = field("pid=").and_then(|p| p.parse::<u32>().ok());
    let purpose = if recorded_pid == Some(locker) {
        field("purpose=").unwrap_or_default()
    } else {
        // A plain flock(1) holder leaves an older record in place.
        String::new()
    };
    let pid = if procs::has_open(locker, meta.dev(), meta.ino()) {
        locker
    } else {
        procs::with_open(meta.dev(), meta.ino())
            .into_iter()
            .next()
            .unwrap_or(locker)
    };
    let (user, command) = procs::identity(pid);
    Some(LockHolder {
        pid,
        purpose,
        user,
        command,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn second_lock_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = try_lock(
            dir.path(),
            "0000:01:00.0",
            "slot qwen",
            LockPolicy::default(),
        )
        .unwrap();
        // flock locks are per open file description, so a second open in the
        // same process conflicts just like another process would.
        match try_lock(dir.path(), "0000:01:00.0", "other", LockPolicy::default()) {
            Err(LockError::Held { holder, .. }) => {
                let holder = holder.expect("holder is known");
                assert_eq!(holder.pid, std::process::id());
                assert_eq!(holder.purpose, "slot qwen");
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        try_lock(dir.path(), "0000:01:00.0", "again", LockPolicy::default())
            .expect("released on drop");
    }

    #[test]
    fn external_flock_holder_pid_comes_from_the_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let path = lock_path(dir.path(), "0000:02:00.0");
        std::fs::write(&path, "").unwrap();
        // `flock FILE cat` holds the lock until we close cat's stdin.
        let mut child = Command::new("flock")
            .arg("-x")
            .arg(&path)
            .arg("cat")
            .stdin(Stdio::piped())
            .spawn()
            .expect("flock(1) is part of util-linux");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let holder = loop {
            match try_lock(dir.path(), "0000:02:00.0", "x", LockPolicy::default()) {
                Err(LockError::Held { holder, .. }) => break holder,
                Ok(lock) => drop(lock),
                Err(e) => panic!("{e}"),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "flock never took the lock"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(holder.map(|h| h.pid), Some(child.id()));
        drop(child.stdin.take());
        child.wait().unwrap();
        try_lock(dir.path(), "0000:02:00.0", "x", LockPolicy::default())
            .expect("free after flock exits");
    }

    #[test]
    fn lock_files_only_root_and_the_admin_group_can_open() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        drop(try_lock(dir.path(), "0000:03:00.0", "x", LockPolicy::default()).unwrap());
        let mode = std::fs::metadata(lock_path(dir.path(), "0000:03:00.0"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "no admin group: only root may lock");
        let policy = LockPolicy::daemon(Some(nix::unistd::getegid().as_raw()));
        // A script's flock(1) made this one with its umask: repaired.
        let path = lock_path(dir.path(), "0000:04:00.0");
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(try_lock(dir.path(), "0000:04:00.0", "x", policy).unwrap());
        if nix::unistd::geteuid().is_root() {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o660);
        }
    }

    #[test]
    fn a_planted_link_at_a_lock_path_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("precious");
        std::fs::write(&victim, "keep me").unwrap();
        std::os::unix::fs::symlink(&victim, lock_path(dir.path(), "0000:05:00.0")).unwrap();
        let err = try_lock(dir.path(), "0000:05:00.0", "x", LockPolicy::default()).unwrap_err();
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    }

    #[test]
    fn a_lock_inherited_by_a_child_names_the_child_after_its_taker_exits() {
        let dir = tempfile::tempdir().unwrap();
        let path = lock_path(dir.path(), "0000:06:00.0");
        std::fs::write(&path, "").unwrap();
        // flock(1) takes the lock and execs `sh`, which starts a
        // background `sleep` that inherits the descriptor, then exits.
        let out = Command::new("flock")
            .arg("-x")
            .arg(&path)
            .args(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"])
            .output()
            .expect("flock(1) is part of util-linux");
        let sleeper: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let holder = match try_lock(dir.path(), "0000:06:00.0", "x", LockPolicy::default()) {
            Err(LockError::Held { holder, .. }) => holder.expect("holder known"),
            other => panic!("expected Held, got {other:?}"),
        };
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(sleeper as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        assert_eq!(holder.pid, sleeper, "{holder:?}");
        assert!(holder.command.contains("sleep 30"), "{holder:?}");
        assert!(!holder.user.is_empty(), "{holder:?}");
    }
}
