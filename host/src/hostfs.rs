//! Files and directories the daemon writes on the host, written so that a
//! hostile local user cannot turn them against the host.
//!
//! The daemon runs as root. Every path it creates, truncates, renames or
//! removes (card locks, the records in `state_dir`, cache markers and
//! variants, sockets, temp files) could be aimed at another file by a link
//! planted at that path, by anyone who can write into its directory. Two
//! rules close that:
//!
//! 1. **Trusted directories.** Each directory the daemon writes into is
//!    owned by root or the daemon's user and writable by nobody else (the
//!    lock dir may also be writable by the admin group, whose scripts take
//!    card locks); every directory above it is too, or is sticky like
//!    `/tmp` (whose other users cannot rename or remove our entries).
//!    [`ensure_dir`] creates and checks them at startup and refuses one that
//!    fails, naming who could plant links and the fix.
//! 2. **The last component is never followed.** Files are opened with
//!    `O_NOFOLLOW`; a file the daemon truncates or writes in place must be a
//!    regular file with one link (a hard link to `/etc/shadow` is refused,
//!    not truncated); whole files are written under a fresh temp name
//!    (`O_CREAT|O_EXCL|O_NOFOLLOW`) and renamed into place, and a rename
//!    replaces a link rather than writing through it. Removing uses
//!    `unlink`, which removes a link, never its target.

use crate::config::Config;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory the daemon relies on that others could plant links in.
#[derive(Debug, thiserror::Error)]
#[error("{key} {}: {problem}; {fix}", .path.display())]
pub struct UntrustedDir {
    /// The config key that names the directory.
    pub key: String,
    /// The directory (or the ancestor at fault).
    pub path: PathBuf,
    /// What is wrong: who could plant links.
    pub problem: String,
    /// How to fix it.
    pub fix: String,
}

/// Who besides the owner may write into a directory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sharing {
    /// A group whose members may write into the directory itself (the admin
    /// group for the lock dir); None: nobody but the owner.
    pub group: Option<u32>,
}

fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| format!("{} (uid {uid})", u.name))
        .unwrap_or_else(|| format!("uid {uid}"))
}

fn group_name(gid: u32) -> String {
    nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
        .ok()
        .flatten()
        .map(|g| format!("`{}` (gid {gid})", g.name))
        .unwrap_or_else(|| format!("gid {gid}"))
}

/// Check one directory's owner and mode. `last`: the directory the daemon
/// writes into (a sticky bit does not help there: others could still create
/// the names the daemon has not created yet).
fn check_one(
    key: &str,
    path: &Path,
    meta: &std::fs::Metadata,
    last: bool,
    sharing: Sharing,
) -> Result<(), UntrustedDir> {
    let me = nix::unistd::geteuid().as_raw();
    let mode = meta.mode();
    let sticky = mode & 0o1000 != 0;
    let untrusted = |problem: String, fix: String| UntrustedDir {
        key: key.to_string(),
        path: path.to_path_buf(),
        problem,
        fix,
    };
    if meta.uid() != 0 && meta.uid() != me {
        return Err(untrusted(
            format!(
                "owned by {}, who could replace the files the daemon keeps there",
                user_name(meta.uid())
            ),
            format!(
                "make it owned by root or {} (chown), or choose another directory",
                user_name(me)
            ),
        ));
    }
    if sticky && !last {
        // Others may add entries but cannot rename or remove ours.
        return Ok(());
    }
    if mode & 0o002 != 0 {
        return Err(untrusted(
            "writable by every user, who could plant links the daemon would write through"
                .to_string(),
            format!("chmod o-w {}", path.display()),
        ));
    }
    if mode & 0o020 != 0 && meta.gid() != 0 {
        let allowed = last && sharing.group == Some(meta.gid());
        if !allowed {
            return Err(untrusted(
                format!(
                    "writable by the members of group {}, who could plant links the daemon would write through",
                    group_name(meta.gid())
                ),
                match (last, sharing.group) {
                    (true, Some(admin)) => format!(
                        "chmod g-w {} or give it to the admin group {} (daemon.control_admin_group)",
                        path.display(),
                        group_name(admin)
                    ),
                    _ => format!("chmod g-w {}", path.display()),
                },
            ));
        }
    }
    Ok(())
}

/// Check that `path` (an existing directory) and every directory above it
/// can only be changed by trusted users. Links on the way are followed only
/// after the directory holding them passed (only a trusted user could have
/// put them there), and their targets are checked the same way.
pub fn check_trusted(key: &str, path: &Path, sharing: Sharing) -> Result<(), UntrustedDir> {
    check_chain(key, path, sharing, 0, true)
}

/// Check a directory the daemon will create its own directory in: like
/// [`check_trusted`], except that it may be sticky and world-writable
/// (`/run/lock`, `/tmp`), since others cannot rename or remove what the
/// daemon creates there, and the new directory is checked once made.
pub fn check_trusted_parent(key: &str, path: &Path) -> Result<(), UntrustedDir> {
    check_chain(key, path, Sharing::default(), 0, false)
}

fn check_chain(
    key: &str,
    path: &Path,
    sharing: Sharing,
    depth: u32,
    final_is_target: bool,
) -> Result<(), UntrustedDir> {
    let io_error = |p: &Path, e: io::Error| UntrustedDir {
        key: key.to_string(),
        path: p.to_path_buf(),
        problem: format!("cannot be checked: {e}"),
        fix: "create it, or point the key at a directory that exists".to_string(),
    };
    if depth > 8 {
        return Err(UntrustedDir {
            key: key.to_string(),
            path: path.to_path_buf(),
            problem: "too many symbolic links on the way".to_string(),
            fix: "name the directory by its real path".to_string(),
        });
    }
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| io_error(path, e))?
            .join(path)
    };
    let components: Vec<Component> = absolute.components().collect();
    let mut prefix = PathBuf::new();
    for (i, component) in components.iter().enumerate() {
        prefix.push(component);
        let last = final_is_target && i + 1 == components.len();
        let meta = std::fs::symlink_metadata(&prefix).map_err(|e| io_error(&prefix, e))?;
        if meta.file_type().is_symlink() {
            // The directory holding the link passed, so the link is trusted;
            // its target must be too.
            let target = std::fs::canonicalize(&prefix).map_err(|e| io_error(&prefix, e))?;
            let rest: PathBuf = components[i + 1..].iter().collect();
            if rest.as_os_str().is_empty() {
                return check_chain(key, &target, sharing, depth + 1, final_is_target);
            }
            check_chain(key, &target, Sharing::default(), depth + 1, false)?;
            return check_chain(key, &target.join(rest), sharing, depth + 1, final_is_target);
        }
        if !meta.is_dir() {
            return Err(UntrustedDir {
                key: key.to_string(),
                path: prefix.clone(),
                problem: "is not a directory".to_string(),
                fix: "point the key at a directory".to_string(),
            });
        }
        check_one(key, &prefix, &meta, last, sharing)?;
    }
    Ok(())
}

/// Create `path` (and missing parents, mode 0755) if needed, then check it
/// is trusted ([`check_trusted`]). Directories are created one component at
/// a time after their parent passed, so creation never goes through a link
/// an untrusted user planted.
pub fn ensure_dir(key: &str, path: &Path, sharing: Sharing) -> Result<(), UntrustedDir> {
    let mut missing = Vec::new();
    let mut existing = path.to_path_buf();
    while std::fs::symlink_metadata(&existing).is_err() {
        missing.push(existing.clone());
        if !existing.pop() || existing.as_os_str().is_empty() {
            break;
        }
    }
    // Before creating anything below the deepest existing ancestor, that
    // ancestor must be trusted (the directory itself is checked at the end).
    if !missing.is_empty()
        && !existing.as_os_str().is_empty()
        && std::fs::symlink_metadata(&existing).is_ok()
    {
        check_trusted_parent(key, &existing)?;
    }
    for dir in missing.iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(UntrustedDir {
                    key: key.to_string(),
                    path: dir.clone(),
                    problem: format!("cannot be created: {e}"),
                    fix: "create it, or check the permissions of its parent".to_string(),
                })
            }
        }
    }
    check_trusted(key, path, sharing)
}

/// The directories the daemon writes into, with their config keys and who
/// besides the owner may share them: the lock dir the admin group (its
/// scripts take card locks), the others nobody.
pub fn daemon_dirs(config: &Config) -> Vec<(&'static str, PathBuf, Sharing)> {
    let d = &config.daemon;
    let admin = Sharing {
        group: d
            .control_admin_group
            .as_deref()
            .and_then(|name| nix::unistd::Group::from_name(name).ok().flatten())
            .map(|g| g.gid.as_raw()),
    };
    vec![
        ("daemon.state_dir", d.state_dir.clone(), Sharing::default()),
        ("daemon.lock_dir", d.lock_dir.clone(), admin),
        ("daemon.cache_dir", d.cache_dir.clone(), Sharing::default()),
        (
            "daemon.control_socket (its directory)",
            d.control_socket_dir(),
            Sharing::default(),
        ),
        (
            "daemon.control_socket (the workers' sockets)",
            d.worker_socket_dir(),
            Sharing::default(),
        ),
    ]
}

/// The control socket's directory may be missing only where the daemon's
/// service makes it (systemd's `RuntimeDirectory=`, one level under a
/// directory that exists): a longer missing tree is a mistyped path, which
/// the daemon would otherwise create, as root, wherever it points.
fn control_socket_dir_problem(config: &Config) -> Option<UntrustedDir> {
    let dir = config.daemon.control_socket_dir();
    if std::fs::symlink_metadata(&dir).is_ok() {
        return None;
    }
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty())?;
    if std::fs::symlink_metadata(parent).is_ok() {
        return None;
    }
    Some(UntrustedDir {
        key: "daemon.control_socket".to_string(),
        path: dir.clone(),
        problem: format!(
            "does not exist, nor does {}: the daemon would create that whole tree",
            parent.display()
        ),
        fix: format!(
            "check the path; create the directory first (mkdir -p {}, owned by the daemon's user) or put the socket in an existing directory (the default /run/tt-serving is made by the unit's RuntimeDirectory)",
            dir.display()
        ),
    })
}

/// At startup: create the daemon's directories where missing and refuse
/// to start when one of them is not trusted.
pub fn ensure_daemon_dirs(config: &Config) -> Result<(), UntrustedDir> {
    if let Some(problem) = control_socket_dir_problem(config) {
        return Err(problem);
    }
    for (key, dir, sharing) in daemon_dirs(config) {
        ensure_dir(key, &dir, sharing)?;
    }
    Ok(())
}

/// For `check-config`: every daemon directory that is not trusted, without
/// creating anything (a missing one is judged by the directory it would be
/// created in).
pub fn check_daemon_dirs(config: &Config) -> Vec<UntrustedDir> {
    let mut problems: Vec<UntrustedDir> = control_socket_dir_problem(config).into_iter().collect();
    for (key, dir, sharing) in daemon_dirs(config) {
        let mut existing = dir.clone();
        while std::fs::symlink_metadata(&existing).is_err() {
            if !existing.pop() || existing.as_os_str().is_empty() {
                break;
            }
        }
        if existing.as_os_str().is_empty() {
            continue;
        }
        let checked = if existing == dir {
            check_trusted(key, &existing, sharing)
        } else {
            check_trusted_parent(key, &existing)
        };
        if let Err(e) = checked {
            problems.push(e);
        }
    }
    problems
}

/// Create a directory (and missing parents) below a trusted one, refusing
/// to go through a link: each component must be a real directory.
pub fn create_dir_all_no_follow(path: &Path) -> io::Result<()> {
    let mut prefix = PathBuf::new();
    for component in path.components() {
        prefix.push(component);
        match std::fs::symlink_metadata(&prefix) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(meta) if meta.file_type().is_symlink() && prefix.components().count() <= 2 => {
                // A link right under `/` (e.g. `/var/run`) is the system's.
                continue;
            }
            Ok(_) => {
                return Err(io::Error::other(format!(
                    "{} is not a directory (a link or a file is in the way); remove it",
                    prefix.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match std::fs::DirBuilder::new().mode(0o755).create(&prefix) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        // Created by someone else in the meantime: check again.
                        if !std::fs::symlink_metadata(&prefix)?.is_dir() {
                            return Err(io::Error::other(format!(
                                "{} is not a directory; remove it",
                                prefix.display()
                            )));
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

// Opening files without following links is shared with the card locks
// (tt-card-lock), which ttctl uses too.
pub use tt_card_lock::nofollow::{is_plain_file, open_in_place, read};

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Write a whole file so that readers see the old contents or the new,
/// never a torn mix, and never through a link: a fresh temp file beside it
/// (`O_EXCL|O_NOFOLLOW`, so a planted name fails instead of being followed),
/// fsync, rename over the destination.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} names no file", path.display())))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp.{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        // The umask may have narrowed `mode`; say exactly what we mean.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Open a record the daemon only ever appends to (the audit trail),
/// creating it with `mode` if absent: `O_APPEND|O_NOFOLLOW`, and only a
/// plain file with one link that the daemon's own user owns. A planted
/// link, a hard link, or a file someone else made there is refused, so no
/// one else's file grows and no one else holds a handle that can rewrite
/// the record.
pub fn open_append(path: &Path, mode: u32) -> io::Result<std::fs::File> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::other(format!(
                    "{} is a symbolic link; the daemon only writes plain files it can trust there. Remove it (it was not made by tt-servingd)",
                    path.display()
                ))
            } else {
                e
            }
        })?;
    tt_card_lock::nofollow::check_plain(path, &file)?;
    let meta = file.metadata()?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(io::Error::other(format!(
            "{} is owned by {}, not the daemon's user {}; remove it (it was not made by tt-servingd)",
            path.display(),
            user_name(meta.uid()),
            user_name(me)
        )));
    }
    if meta.mode() & 0o077 != mode & 0o077 {
        // Someone widened it (the owner: root); put it back.
        file.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))?;
    }
    Ok(file)
}

/// Remove a file; a link is removed, never its target. Missing is fine.
pub fn remove_file(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn write_atomic_replaces_a_planted_link_instead_of_writing_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let record = dir.path().join("clean-shutdown");
        symlink(&victim, &record).unwrap();
        write_atomic(&record, b"ours\n", 0o644).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!std::fs::symlink_metadata(&record)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&record).unwrap(), "ours\n");
    }

    #[test]
    fn open_in_place_refuses_links_and_hard_links() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let soft = dir.path().join("soft.lock");
        symlink(&victim, &soft).unwrap();
        let err = open_in_place(&soft, 0o600).unwrap_err().to_string();
        assert!(err.contains("is a symbolic link"), "{err}");
        let hard = dir.path().join("hard.lock");
        std::fs::hard_link(&victim, &hard).unwrap();
        let err = open_in_place(&hard, 0o600).unwrap_err().to_string();
        assert!(err.contains("2 hard links"), "{err}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn open_append_refuses_links_and_appends_to_its_own_file() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let soft = dir.path().join("audit.jsonl");
        symlink(&victim, &soft).unwrap();
        let err = open_append(&soft, 0o600).unwrap_err().to_string();
        assert!(err.contains("is a symbolic link"), "{err}");
        std::fs::remove_file(&soft).unwrap();
        std::fs::hard_link(&victim, &soft).unwrap();
        let err = open_append(&soft, 0o600).unwrap_err().to_string();
        assert!(err.contains("2 hard links"), "{err}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        std::fs::remove_file(&soft).unwrap();
        open_append(&soft, 0o600)
            .unwrap()
            .write_all(b"one\n")
            .unwrap();
        open_append(&soft, 0o600)
            .unwrap()
            .write_all(b"two\n")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&soft).unwrap(), "one\ntwo\n");
        let mode = std::fs::metadata(&soft).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A file another user made there (possible only as root here).
        if nix::unistd::geteuid().is_root() {
            let theirs = dir.path().join("theirs.jsonl");
            std::fs::write(&theirs, "").unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            let err = open_append(&theirs, 0o600).unwrap_err().to_string();
            assert!(err.contains("is owned by"), "{err}");
        }
    }

    #[test]
    fn a_world_writable_directory_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let locks = dir.path().join("locks");
        std::fs::create_dir(&locks).unwrap();
        std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure_dir("daemon.lock_dir", &locks, Sharing::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("daemon.lock_dir"), "{err}");
        assert!(err.contains("writable by every user"), "{err}");
        assert!(err.contains("chmod o-w"), "{err}");
        // A sticky world-writable ancestor (like /tmp) is fine; the
        // directory itself is not.
        std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(ensure_dir("daemon.lock_dir", &locks, Sharing::default()).is_err());
        std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure_dir("daemon.lock_dir", &locks.join("a/b"), Sharing::default()).unwrap();
        // Created inside a sticky shared dir (like /run/lock): fine.
        let shared = dir.path().join("run-lock");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        ensure_dir(
            "daemon.lock_dir",
            &shared.join("tenstorrent"),
            Sharing::default(),
        )
        .unwrap();
    }
}
