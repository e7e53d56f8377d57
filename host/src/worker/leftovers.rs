//! Files an engine leaves outside its processes, removed for its slot:
//! Open MPI's shared-memory segments and tt-umd's hugepage files.
//!
//! ttnn's bundled Open MPI 5.0.7 makes a 16 MiB
//! `sm_segment.<node>.<uid>.<jobid>.<rank>` per process in `/dev/shm` and
//! leaves it there after a clean exit (its name holds no pid;
//! docs/HARDWARE.md), so a slot that restarts fills `/dev/shm`. Each worker
//! gets its own directory, `<dev_root>/shm/tt-serving/<slot>/` (mode 0700,
//! the daemon's), as `OMPI_MCA_btl_sm_backing_directory`, unless the
//! model's environment names one itself; whatever is in it is removed
//! before the next worker starts and after each one exits (its slot swept
//! first: nothing of it runs). For engines that ignore the variable,
//! `sm_segment.*` files in `<dev_root>/shm` itself are removed after the
//! exit when the worker's user made them after it started and no live
//! process has them open or mapped: never another user's, never one in
//! use, never a tt-umd lock.
//!
//! tt-umd maps 1 GiB hugepage files `<dev_root>/hugepages-1G/device_<N>_*`
//! per card and can leave them behind (Tenstorrent's Helm chart removes
//! them before a start); before a start, those of the slot's cards are
//! removed when no process has the card open or holds its chip.
//!
//! Nothing here follows a link: links are removed as links, or left.
//! Workers run as the daemon's user, so "the worker's user" is ours.

use crate::cards::discovery::HardwareRoot;
use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tt_card_lock::procs::{self, MappedFile};

/// Open MPI's btl/sm backing directory (its MCA parameter
/// `btl_sm_backing_directory`, read from the environment).
pub const BACKING_DIR_VAR: &str = "OMPI_MCA_btl_sm_backing_directory";
/// What Open MPI's segments are called (`%s/sm_segment.%s.%u.%x.%d`).
pub const SEGMENT_PREFIX: &str = "sm_segment.";
/// The daemon's directory in the shared-memory directory.
const OWN_DIR: &str = "tt-serving";
/// How much older than the worker's spawn a segment may look: the kernel
/// stamps files from a coarse clock.
const CLOCK_SLACK: Duration = Duration::from_secs(1);

/// Where one worker's shared-memory leftovers go and are looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftovers {
    /// The slot, for its log.
    slot: String,
    /// `<dev_root>/shm`.
    shm: PathBuf,
    /// The slot's own directory, when the worker was given it.
    own: Option<PathBuf>,
    /// When the worker was spawned (set by the spawn).
    since: Option<SystemTime>,
}

impl Leftovers {
    /// For a start of `slot`: make its directory, remove what an earlier
    /// worker left in it (one of a daemon that died before it could), and
    /// name it in `env` unless the model's environment names its own.
    pub fn for_start(dev_root: &Path, slot: &str, env: &mut BTreeMap<String, String>) -> Leftovers {
        let shm = dev_root.join("shm");
        let mut own = None;
        if let Some(theirs) = env.get(BACKING_DIR_VAR) {
            tracing::info!(slot = %slot, dir = %theirs, "the model sets {BACKING_DIR_VAR}; Open MPI's segments go there, not to the slot's directory");
        } else {
            match slot_dir(&shm, slot) {
                Ok(dir) => {
                    log_removed(
                        slot,
                        &dir,
                        "file(s) an earlier worker left in its directory",
                        empty_dir(&dir),
                    );
                    env.insert(BACKING_DIR_VAR.into(), dir.display().to_string());
                    own = Some(dir);
                }
                Err(e) => {
                    tracing::warn!(slot = %slot, error = %e, "no shared-memory directory for the worker; Open MPI's segments stay in {} (sm_segment.* there are removed after the worker exits)", shm.display())
                }
            }
        }
        Leftovers {
            slot: slot.to_string(),
            shm,
            own,
            since: None,
        }
    }

    /// The same, for a worker spawned at `at`.
    pub fn spawned_at(mut self, at: SystemTime) -> Leftovers {
        self.since = Some(at);
        self
    }

    /// After the worker exited and its slot was swept: empty its
    /// directory, and remove the segments it left in the shared one.
    /// Returns what was removed.
    pub fn clean(&self) -> Vec<String> {
        let mut removed = Vec::new();
        if let Some(dir) = &self.own {
            let gone = empty_dir(dir);
            log_removed(
                &self.slot,
                dir,
                "file(s) the worker left in its directory",
                gone.clone(),
            );
            removed.extend(gone.into_iter().map(|n| dir.join(n).display().to_string()));
        }
        if let Some(since) = self.since {
            let uid = nix::unistd::geteuid().as_raw();
            let gone = stale_segments(&self.shm, since, uid);
            log_removed(
                &self.slot,
                &self.shm,
                "Open MPI segment(s) the worker left in the shared directory",
                gone.clone(),
            );
            removed.extend(
                gone.into_iter()
                    .map(|n| self.shm.join(n).display().to_string()),
            );
        }
        removed
    }
}

fn log_removed(slot: &str, dir: &Path, what: &str, names: Vec<String>) {
    if !names.is_empty() {
        tracing::info!(slot = %slot, dir = %dir.display(), files = %names.join(", "), "removed {} {what}", names.len());
    }
}

/// A directory of ours: made mode 0700 if missing; refused unless it is a
/// directory (not a link) owned by us. Nobody else can then change what is
/// in it.
fn own_subdir(parent: &Path, name: &str) -> io::Result<PathBuf> {
    let dir = parent.join(name);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.file_type().is_dir() || meta.uid() != me {
        return Err(io::Error::other(format!(
            "{} is not a directory of the daemon's user (uid {me}) but {} owned by uid {}; it was not made by tt-servingd: remove it",
            dir.display(),
            if meta.file_type().is_symlink() {
                "a link"
            } else if meta.file_type().is_dir() {
                "a directory"
            } else {
                "a file"
            },
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}

/// `<shm>/tt-serving/<slot>/`, made safely: `shm` must be a directory
/// that others may not rename things in (the host's `/dev/shm` is sticky).
pub fn slot_dir(shm: &Path, slot: &str) -> io::Result<PathBuf> {
    let meta = std::fs::metadata(shm)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            shm.display()
        )));
    }
    if meta.mode() & 0o002 != 0 && meta.mode() & 0o1000 == 0 {
        return Err(io::Error::other(format!(
            "{} is writable by everyone without the sticky bit: anyone could swap the daemon's directory there",
            shm.display()
        )));
    }
    let base = own_subdir(shm, OWN_DIR)?;
    // A replica's slot is `model/1`; a name must not climb out.
    let mut name = slot.replace('/', "_");
    if name.is_empty() || name.starts_with('.') {
        name.insert(0, '_');
    }
    own_subdir(&base, &name)
}

/// Remove every regular file and link in `dir` (links as links); the
/// names removed. A directory there is left.
pub fn empty_dir(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if !(kind.is_file() || kind.is_symlink()) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => removed.push(entry.file_name().to_string_lossy().into_owned()),
            Err(e) => {
                tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove a worker's leftover")
            }
        }
    }
    removed.sort();
    removed
}

/// When a file was made: its birth time where the filesystem keeps one,
/// else its last change of contents.
fn made(meta: &std::fs::Metadata) -> Option<SystemTime> {
    meta.created().or_else(|_| meta.modified()).ok()
}

/// Remove Open MPI segments in `shm` that a worker of user `uid` spawned
/// at `since` left: `sm_segment.*` regular files of that user made after
/// it started, which no live process has open or mapped, and links so
/// named (removed as links). The names removed.
pub fn stale_segments(shm: &Path, since: SystemTime, uid: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(shm) else {
        return Vec::new();
    };
    let after = since.checked_sub(CLOCK_SLACK).unwrap_or(since);
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(SEGMENT_PREFIX) {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let kind = meta.file_type();
        let ours = meta.uid() == uid && made(&meta).is_some_and(|t| t >= after);
        if !ours || !(kind.is_file() || kind.is_symlink()) {
            continue;
        }
        if kind.is_file() {
            let file = MappedFile {
                dev: meta.dev(),
                ino: meta.ino(),
                path: path.clone(),
            };
            if let Some(pid) = procs::user_of(&file) {
                tracing::debug!(path = %path.display(), pid, "segment in use; kept");
                continue;
            }
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(name),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a worker's Open MPI segment")
            }
        }
    }
    removed.sort();
    removed
}

/// The hugepage files of `/dev/tenstorrent/<index>` in `dir`: regular
/// files named exactly `device_<index>_...` (not `device_<index>0_...`).
pub fn hugepage_files(dir: &Path, index: u32) -> Vec<PathBuf> {
    let prefix = format!("device_{index}_");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// Before a start: remove the stale hugepage files of the slot's cards
/// (`<dev_root>/hugepages-1G/device_<N>_*`, N each card's index now), of
/// each card that no process has open or holds, each file unless a live
/// process maps or opens it. Returns the paths removed.
pub fn clear_hugepages(hw: &HardwareRoot, slot: &str, cards: &[String]) -> Vec<PathBuf> {
    let dir = hw.dev_root.join("hugepages-1G");
    let mut removed = Vec::new();
    for bdf in cards {
        let Some(index) = hw.index_of(bdf) else {
            continue;
        };
        let files = hugepage_files(&dir, index);
        if files.is_empty() {
            continue;
        }
        let users = hw.processes(index);
        if !users.is_empty() {
            let who: Vec<String> = users
                .iter()
                .map(|p| format!("pid {} ({})", p.pid, p.command))
                .collect();
            tracing::info!(slot = %slot, card = %bdf, files = files.len(), users = %who.join(", "), "hugepage files of the card kept: it is open");
            continue;
        }
        let mut gone = Vec::new();
        for path in files {
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let file = MappedFile {
                dev: meta.dev(),
                ino: meta.ino(),
                path: path.clone(),
            };
            if !meta.file_type().is_file() || procs::user_of(&file).is_some() {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => gone.push(path),
                Err(e) => {
                    tracing::warn!(slot = %slot, path = %path.display(), error = %e, "cannot remove a stale hugepage file")
                }
            }
        }
        if !gone.is_empty() {
            let names: Vec<String> = gone.iter().map(|p| p.display().to_string()).collect();
            tracing::info!(slot = %slot, card = %bdf, files = %names.join(", "), "removed {} stale hugepage file(s) of the card: no process has it open", gone.len());
        }
        removed.extend(gone);
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn touch(path: &Path) {
        std::fs::write(path, b"").unwrap();
    }

    fn sticky_shm() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        dir
    }

    #[test]
    fn the_slot_directory_is_ours_and_private_and_a_planted_one_is_refused() {
        let shm = sticky_shm();
        let dir = slot_dir(shm.path(), "qwen/1").unwrap();
        assert_eq!(dir, shm.path().join("tt-serving/qwen_1"));
        for d in [dir.as_path(), &shm.path().join("tt-serving")] {
            let meta = std::fs::symlink_metadata(d).unwrap();
            assert!(meta.is_dir());
            assert_eq!(meta.mode() & 0o777, 0o700);
        }
        // Again: the same directory.
        assert_eq!(slot_dir(shm.path(), "qwen/1").unwrap(), dir);
        assert_eq!(
            slot_dir(shm.path(), "..").unwrap(),
            shm.path().join("tt-serving/_..")
        );
        // A link where the daemon's directory goes: refused, not followed.
        let other = sticky_shm();
        let target = tempfile::tempdir().unwrap();
        symlink(target.path(), other.path().join("tt-serving")).unwrap();
        let err = slot_dir(other.path(), "m").unwrap_err().to_string();
        assert!(err.contains("a link"), "{err}");
        assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0);
        // Another user's directory there (root can give it away).
        if nix::unistd::geteuid().is_root() {
            let third = sticky_shm();
            let planted = third.path().join("tt-serving");
            std::fs::create_dir(&planted).unwrap();
            std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
            let err = slot_dir(third.path(), "m").unwrap_err().to_string();
            assert!(err.contains("owned by uid 65534"), "{err}");
        }
        // A world-writable directory without the sticky bit is refused.
        let open = tempfile::tempdir().unwrap();
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(slot_dir(open.path(), "m").is_err());
    }

    #[test]
    fn the_model_may_name_its_own_backing_directory() {
        let dev = tempfile::tempdir().unwrap();
        std::fs::create_dir(dev.path().join("shm")).unwrap();
        let mut env = BTreeMap::new();
        let given = Leftovers::for_start(dev.path(), "m", &mut env);
        let dir = dev.path().join("shm/tt-serving/m");
        assert_eq!(given.own.as_deref(), Some(dir.as_path()));
        assert_eq!(env[BACKING_DIR_VAR], dir.display().to_string());
        // A stale file from an earlier worker is gone before the start.
        touch(&dir.join("sm_segment.h.0.10000.0"));
        Leftovers::for_start(dev.path(), "m", &mut BTreeMap::new());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);

        let mut theirs = BTreeMap::from([(BACKING_DIR_VAR.to_string(), "/scratch".to_string())]);
        let kept = Leftovers::for_start(dev.path(), "m2", &mut theirs);
        assert_eq!(kept.own, None);
        assert_eq!(theirs[BACKING_DIR_VAR], "/scratch");
        assert!(!dev.path().join("shm/tt-serving/m2").exists());
    }

    #[test]
    fn emptying_removes_files_and_links_never_their_targets() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("precious");
        std::fs::write(&target, "keep").unwrap();
        touch(&dir.path().join("sm_segment.h.0.e6730000.0"));
        symlink(&target, dir.path().join("sm_segment.h.0.1.0")).unwrap();
        symlink(outside.path(), dir.path().join("linked-dir")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        touch(&dir.path().join("sub/inner"));
        assert_eq!(
            empty_dir(dir.path()),
            [
                "linked-dir",
                "sm_segment.h.0.1.0",
                "sm_segment.h.0.e6730000.0"
            ]
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert!(dir.path().join("sub/inner").exists());
        assert_eq!(empty_dir(&dir.path().join("missing")), Vec::<String>::new());
    }

    #[test]
    fn only_our_users_new_unused_segments_are_removed_from_the_shared_directory() {
        let shm = sticky_shm();
        let p = |name: &str| shm.path().join(name);
        let me = nix::unistd::geteuid().as_raw();
        touch(&p("sm_segment.h.0.old.0"));
        let since = SystemTime::now() + Duration::from_secs(5);
        // Made "before" the spawn (5 s ahead of now, past the slack):
        // kept. Then a spawn now: the same file counts as new.
        assert_eq!(stale_segments(shm.path(), since, me), Vec::<String>::new());
        let since = SystemTime::now();
        touch(&p("sm_segment.h.0.new.0"));
        touch(&p("TT_UMD_LOCK.CHIP_IN_USE_0_PCIe"));
        touch(&p("not_a_segment"));
        // Open by a live process: kept.
        touch(&p("sm_segment.h.0.open.0"));
        let mut holder = std::process::Command::new("sh")
            .args(["-c", "exec 9<\"$0\" && exec sleep 30"])
            .arg(p("sm_segment.h.0.open.0"))
            .spawn()
            .unwrap();
        let open = MappedFile::at(&p("sm_segment.h.0.open.0")).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while procs::user_of(&open).is_none() {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(20));
        }
        // A link so named: removed as a link.
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("precious");
        std::fs::write(&target, "keep").unwrap();
        symlink(&target, p("sm_segment.h.0.link.0")).unwrap();
        // Another user's.
        if nix::unistd::geteuid().is_root() {
            touch(&p("sm_segment.h.65534.theirs.0"));
            std::os::unix::fs::chown(p("sm_segment.h.65534.theirs.0"), Some(65534), None).unwrap();
        }
        let removed = stale_segments(shm.path(), since, me);
        holder.kill().unwrap();
        holder.wait().unwrap();
        assert_eq!(
            removed,
            [
                "sm_segment.h.0.link.0",
                "sm_segment.h.0.new.0",
                "sm_segment.h.0.old.0"
            ]
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        for kept in [
            "TT_UMD_LOCK.CHIP_IN_USE_0_PCIe",
            "not_a_segment",
            "sm_segment.h.0.open.0",
        ] {
            assert!(p(kept).exists(), "{kept}");
        }
        if nix::unistd::geteuid().is_root() {
            assert!(p("sm_segment.h.65534.theirs.0").exists());
        }
    }

    #[test]
    fn hugepage_files_are_the_cards_own_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "device_1_a",
            "device_1_b",
            "device_10_a",
            "device_2_a",
            "xdevice_1_a",
        ] {
            touch(&dir.path().join(name));
        }
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path().join("t"), dir.path().join("device_1_link")).unwrap();
        std::fs::create_dir(dir.path().join("device_1_dir")).unwrap();
        assert_eq!(
            hugepage_files(dir.path(), 1),
            [dir.path().join("device_1_a"), dir.path().join("device_1_b")]
        );
        assert_eq!(hugepage_files(dir.path(), 3), Vec::<PathBuf>::new());
    }
}
