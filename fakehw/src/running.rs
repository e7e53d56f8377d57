//! Whether a firmware loop runs on a root, and why the last one stopped.
//!
//! Without a firmware loop, heartbeats stand still and reset cards never
//! come back, which looks exactly like broken hardware. So the loop holds
//! an exclusive `flock` on `fakehw/firmware.lock` (with its pid in the
//! file) for as long as it runs — the kernel drops the lock however the
//! process ends — and writes the reason it stopped to `fakehw/firmware.stopped`.
//! `tt-fakehw status` and the fake `tt-smi -r` read both to say so.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::error::{FakeHwError, Result};
use crate::layout::{write_atomic, Layout};
use crate::state;

/// How the reason a loop stopped begins when one of its steps failed
/// ([`crate::run_firmware`]): the root's files are not what a step expects.
pub(crate) const STEP_FAILED: &str = "a firmware step failed";

/// The running loop's hold on its root.
#[derive(Debug)]
pub(crate) struct FirmwareLock {
    file: Flock<File>,
    layout: Layout,
}

impl FirmwareLock {
    /// Takes the root for this loop, or says which pid runs one already.
    pub(crate) fn acquire(layout: &Layout) -> Result<FirmwareLock> {
        let path = layout.firmware_lock();
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| FakeHwError::io("opening", &path, e))?;
        // `holder` takes the lock for an instant to look; retry past that.
        let mut tries = 0;
        let mut locked = loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(locked) => break locked,
                Err((back, Errno::EWOULDBLOCK)) if tries < 20 => {
                    file = back;
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err((mut back, Errno::EWOULDBLOCK)) => {
                    let pid = read_pid(&mut back).map_or("unknown".to_string(), |p| p.to_string());
                    return Err(FakeHwError::Invalid(format!(
                        "a firmware already runs on {} (pid {pid}); one is enough",
                        layout.root().display()
                    )));
                }
                Err((_, errno)) => {
                    return Err(FakeHwError::io("locking", &path, io::Error::from(errno)))
                }
            }
        };
        let pid = std::process::id();
        locked
            .set_len(0)
            .and_then(|()| locked.rewind())
            .and_then(|()| writeln!(locked, "{pid}"))
            .map_err(|e| FakeHwError::io("writing", &path, e))?;
        // A record of an earlier stop is stale now.
        let _ = std::fs::remove_file(layout.firmware_stopped());
        Ok(FirmwareLock {
            file: locked,
            layout: layout.clone(),
        })
    }

    /// Whether the root this loop locked is still there: false once it is
    /// removed, or removed and created again (a new root gets its own loop).
    pub(crate) fn root_is_ours(&self) -> bool {
        let (Ok(held), Ok(now)) = (
            self.file.metadata(),
            std::fs::metadata(self.layout.firmware_lock()),
        ) else {
            return false;
        };
        held.dev() == now.dev() && held.ino() == now.ino()
    }

    /// Records why the loop stopped, for `status` and `tt-smi -r`.
    pub(crate) fn record_stop(&self, reason: &str) {
        let line = format!("{} {reason}\n", state::now_unix_ms());
        let _ = write_atomic(&self.layout.firmware_stopped(), line.as_bytes());
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Whether a firmware loop runs on the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirmwareState {
    /// One runs, as this pid.
    Running {
        /// Its pid (0 when the file does not say).
        pid: u32,
    },
    /// None runs.
    Stopped {
        /// Why the last one stopped and when (unix ms), if one ran.
        last: Option<(u64, String)>,
    },
}

impl FirmwareState {
    /// Looks without disturbing a running loop (the lock is taken for an
    /// instant only when nobody holds it).
    pub(crate) fn of(layout: &Layout) -> FirmwareState {
        let stopped = || FirmwareState::Stopped {
            last: std::fs::read_to_string(layout.firmware_stopped())
                .ok()
                .and_then(|text| {
                    let (ms, reason) = text.trim().split_once(' ')?;
                    Some((ms.parse().ok()?, reason.to_string()))
                }),
        };
        let Ok(file) = File::open(layout.firmware_lock()) else {
            return stopped();
        };
        match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Ok(_free) => stopped(),
            Err((mut file, _)) => FirmwareState::Running {
                pid: read_pid(&mut file).unwrap_or(0),
            },
        }
    }

    /// One line for people: what runs, or what stopped and how to restart.
    pub fn describe(&self, root: &std::path::Path) -> String {
        match self {
            FirmwareState::Running { pid } => format!("firmware: running (pid {pid})"),
            FirmwareState::Stopped { last } => {
                let why = match last {
                    Some((ms, reason)) => {
                        let ago = state::now_unix_ms().saturating_sub(*ms) / 1000;
                        format!("the last one stopped {ago} s ago: {reason}")
                    }
                    None => "none was started".to_string(),
                };
                let failed = last
                    .as_ref()
                    .is_some_and(|(_, reason)| reason.starts_with(STEP_FAILED));
                if failed {
                    // A new loop would fail the same step at once: the
                    // root itself is damaged, so restarting is no remedy.
                    let cards = state::load_inventory(&Layout::new(root))
                        .map_or("N".to_string(), |i| i.cards.len().to_string());
                    return format!(
                        "firmware: NOT running ({why}); the root's files are inconsistent (a tt-fakehw bug), so a new firmware would stop the same way: lay the root out again with `tt-fakehw create --root {root} --cards {cards} --force` (a demo does that at its next start), then `tt-fakehw firmware --root {root} --detach`",
                        root = root.display()
                    );
                }
                format!(
                    "firmware: NOT running ({why}); heartbeats stand still and reset cards do not come back until one runs: tt-fakehw firmware --root {} --detach",
                    root.display()
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_firmware_stopped_by_a_failed_step_is_not_told_to_restart_alone() {
        let root = std::path::Path::new("/nonexistent/hw");
        let stopped = |reason: &str| FirmwareState::Stopped {
            last: Some((state::now_unix_ms(), reason.to_string())),
        };
        let signal = stopped("it received SIGTERM").describe(root);
        assert!(
            signal.ends_with("tt-fakehw firmware --root /nonexistent/hw --detach"),
            "{signal}"
        );
        let failed = stopped(&format!("{STEP_FAILED}: reading x: Is a directory")).describe(root);
        assert!(
            failed.contains("tt-fakehw create --root /nonexistent/hw --cards N --force"),
            "{failed}"
        );
    }
}
