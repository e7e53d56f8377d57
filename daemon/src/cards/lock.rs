//! One exclusive lock per card, shared by everyone who may touch the card.
//!
//! The field lesson: two engine processes on one card block or corrupt each
//! other, so the daemon, `ttctl card borrow` and benchmark scripts must agree
//! on who owns a card. The agreement is a `flock` on
//! `<lock_dir>/<BDF>.lock` (scripts can use `flock(1)` on the same path). The
//! kernel drops a flock when its holder dies, so a killed daemon never leaves
//! a stale lock. The holder writes its pid and purpose into the file; for
//! holders that do not (plain `flock(1)`), `/proc/locks` names the pid.

use fs2::FileExt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Who holds a card's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// Holder's pid (0 when it could not be determined).
    pub pid: u32,
    /// What the holder said it is doing (empty when it did not say).
    pub purpose: String,
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
        /// Who holds it, when known.
        holder: Option<LockHolder>,
    },
    /// The lock file could not be opened.
    #[error("cannot open lock file {}: {source}; check that the lock dir exists and is writable", .path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

fn holder_text(holder: &Option<LockHolder>) -> String {
    match holder {
        Some(h) if h.purpose.is_empty() => format!("pid {}", h.pid),
        Some(h) => format!("pid {} for {}", h.pid, h.purpose),
        None => "another process".into(),
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

fn open(path: &Path) -> Result<File, LockError> {
    let writable = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path);
    match writable {
        Ok(f) => Ok(f),
        // An operator in the card group may not write the daemon's lock
        // files; flock works on a read-only descriptor too.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => File::open(path),
        Err(e) => Err(e),
    }
    .map_err(|source| LockError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Take the card's lock without waiting; on success record our pid and
/// purpose in the file.
pub fn try_lock(lock_dir: &Path, bdf: &str, purpose: &str) -> Result<CardLock, LockError> {
    let path = lock_path(lock_dir, bdf);
    let mut file = open(&path)?;
    if file.try_lock_exclusive().is_err() {
        return Err(LockError::Held {
            bdf: bdf.to_string(),
            holder: holder_of(&path),
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

/// Who holds the lock at `path` now, if anyone: the kernel's view from
/// `/proc/locks` for the pid, the file's record for the purpose.
pub fn holder_of(path: &Path) -> Option<LockHolder> {
    let meta = std::fs::metadata(path).ok()?;
    let kernel_pid = flock_holder_pid(meta.ino(), meta.dev());
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
    };
    let recorded_pid = field("pid=").and_then(|p| p.parse::<u32>().ok());
    let pid = kernel_pid.or(recorded_pid)?;
    // The record belongs to the holder only if the pids agree (a plain
    // flock(1) holder leaves an older record in place).
    let purpose = if recorded_pid == Some(pid) {
        field("purpose=").unwrap_or_default()
    } else {
        String::new()
    };
    Some(LockHolder { pid, purpose })
}

/// Find the pid holding a flock on the file with this inode and device, from
/// the real `/proc/locks` (locks are kernel objects, not hardware, so this is
/// not under `proc_root`).
fn flock_holder_pid(ino: u64, dev: u64) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // "1: FLOCK ADVISORY WRITE <pid> <maj>:<min>:<ino> 0 EOF"; waiters
        // carry a "->" after the id and are skipped.
        if fields.len() < 6 || fields[1] != "FLOCK" {
            return None;
        }
        let mut id = fields[5].split(':');
        let maj = u32::from_str_radix(id.next()?, 16).ok()?;
        let min = u32::from_str_radix(id.next()?, 16).ok()?;
        let inode = id.next()?.parse::<u64>().ok()?;
        (inode == ino && maj == major && min == minor)
            .then(|| fields[4].parse::<u32>().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn second_lock_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = try_lock(dir.path(), "0000:01:00.0", "slot qwen").unwrap();
        // flock locks are per open file description, so a second open in the
        // same process conflicts just like another process would.
        match try_lock(dir.path(), "0000:01:00.0", "other") {
            Err(LockError::Held { holder, .. }) => {
                let holder = holder.expect("holder is known");
                assert_eq!(holder.pid, std::process::id());
                assert_eq!(holder.purpose, "slot qwen");
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        try_lock(dir.path(), "0000:01:00.0", "again").expect("released on drop");
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
            match try_lock(dir.path(), "0000:02:00.0", "x") {
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
        try_lock(dir.path(), "0000:02:00.0", "x").expect("free after flock exits");
    }
}
