//! tt-umd's chip lock read from outside: who holds a chip now.
//!
//! tt-umd (0.9.14: `robust_mutex.cpp`, docs/HARDWARE.md "tt-umd 0.9.14
//! chip lock") keeps a process-shared robust pthread mutex per chip in
//! `/dev/shm/TT_UMD_LOCK.CHIP_IN_USE_<N>_PCIe`, mapped by every process
//! that constructed the chip and kept mapped after unlocking, for the
//! process's whole life. So a mapping is no proof of a holder; the
//! mutex's own word is. The file (x86-64 glibc):
//!
//! ```text
//! 0..40   pthread_mutex_t   0..4 __lock: holder TID | 0x80000000 (waiters; glibc
//!                           keeps it after a contended take), 0 free,
//!                           0x40000000 (FUTEX_OWNER_DIED, | waiters): its holder died
//! 40..48  initialized       0x5454554d444d5458 ("XTMDMUTT") once tt-umd set it up
//! 48..52  owner_tid         tt-umd's own record, set after taking, zeroed before releasing
//! 52..56  owner_pid
//! ```
//!
//! The word's TID is the kernel's (robust futexes): it names the holding
//! thread in the holder's pid namespace, and a thread that dies holding it
//! leaves `FUTEX_OWNER_DIED` and no TID (the next taker recovers it). A TID
//! that is not a thread of ours that maps the file belongs to a holder in
//! another pid namespace (a container); then every process with the file
//! mapped counts as holding the chip, as a mapping did before.

use crate::procs::{self, MappedFile};
use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The bytes of glibc's `pthread_mutex_t` (40 on x86-64).
const MUTEX_LEN: usize = std::mem::size_of::<libc::pthread_mutex_t>();
/// Where tt-umd's `initialized` marker is.
pub const MARKER_AT: usize = MUTEX_LEN;
/// tt-umd's marker of a set-up mutex (bytes `XTMDMUTT`).
pub const MARKER: u64 = 0x5454_554d_444d_5458;
/// tt-umd's record of the holder's TID.
pub const OWNER_TID_AT: usize = MUTEX_LEN + 8;
/// tt-umd's record of the holder's pid.
pub const OWNER_PID_AT: usize = MUTEX_LEN + 12;
/// The file's size (56 on x86-64).
pub const FILE_LEN: usize = MUTEX_LEN + 16;

/// Bits of a robust futex word (linux/futex.h).
const FUTEX_WAITERS: u32 = 0x8000_0000;
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// What the lock file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockWord {
    /// No file, or one too short for the mutex: nobody holds it.
    Absent,
    /// Not tt-umd's layout (no marker): what it holds cannot be read.
    Foreign,
    /// Nobody holds it.
    Free,
    /// Its holder died holding it; the next taker recovers it.
    OwnerDied,
    /// Thread `tid` (in the holder's pid namespace) holds it.
    Held {
        /// The holding thread, from the mutex word.
        tid: u32,
        /// Whether another thread waits for it.
        waiters: bool,
        /// tt-umd's record `(pid, tid)` (zeros for a moment after taking).
        record: (u32, u32),
    },
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    if let Some(b) = bytes.get(at..at + 4) {
        word.copy_from_slice(b);
    }
    u32::from_le_bytes(word)
}

/// Read the lock from the file's bytes.
pub fn parse(bytes: &[u8]) -> LockWord {
    if bytes.len() < FILE_LEN {
        return LockWord::Absent;
    }
    let mut marker = [0u8; 8];
    marker.copy_from_slice(&bytes[MARKER_AT..MARKER_AT + 8]);
    if u64::from_le_bytes(marker) != MARKER {
        return LockWord::Foreign;
    }
    let word = u32_at(bytes, 0);
    match word & FUTEX_TID_MASK {
        0 if word & FUTEX_OWNER_DIED != 0 => LockWord::OwnerDied,
        0 => LockWord::Free,
        tid => LockWord::Held {
            tid,
            waiters: word & FUTEX_WAITERS != 0,
            record: (u32_at(bytes, OWNER_PID_AT), u32_at(bytes, OWNER_TID_AT)),
        },
    }
}

/// Read the lock file at `path` (never through a link, never blocking on
/// something planted there that is not a regular file), and which file it
/// is. A missing file is `Absent`.
pub fn read(path: &Path) -> (LockWord, Option<MappedFile>) {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path);
    let Ok(file) = opened else {
        return (LockWord::Absent, None);
    };
    let Ok(meta) = file.metadata() else {
        return (LockWord::Absent, None);
    };
    if !meta.file_type().is_file() {
        return (LockWord::Foreign, None);
    }
    let mut bytes = Vec::with_capacity(FILE_LEN);
    if file.take(FILE_LEN as u64).read_to_end(&mut bytes).is_err() {
        return (LockWord::Absent, None);
    }
    use std::os::unix::fs::MetadataExt;
    let which = MappedFile {
        dev: meta.dev(),
        ino: meta.ino(),
        path: path.to_path_buf(),
    };
    (parse(&bytes), Some(which))
}

/// Who holds a chip, by its lock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    /// The holding processes, in our pid namespace (usually one).
    pub pids: Vec<u32>,
    /// Why more than the lock's word went into `pids`, when it did.
    pub note: Option<String>,
}

/// Who holds the chip whose lock is at `path`. `openers` are the processes
/// the driver lists with the device open: where the lock's word cannot
/// name the holder here, those with the file mapped are taken for it (for
/// a held lock, all processes when none of them maps it).
pub fn holders(path: &Path, openers: &[u32]) -> Holders {
    let (word, file) = read(path);
    let Some(file) = file else {
        return Holders::default();
    };
    // Every process is read only when the lock says it is held and none
    // of the openers maps it: reading each one's maps costs.
    let by_mapping = |note: String, everyone: bool| {
        let mut pids: Vec<u32> = openers
            .iter()
            .copied()
            .filter(|pid| procs::maps(*pid, &file))
            .collect();
        if pids.is_empty() && everyone {
            pids = procs::mapping(&file);
        }
        Holders {
            note: (!pids.is_empty()).then_some(note),
            pids,
        }
    };
    match word {
        LockWord::Absent | LockWord::Free | LockWord::OwnerDied => Holders::default(),
        LockWord::Foreign => by_mapping(format!(
            "{} is not in tt-umd 0.9.14's layout, so its holder cannot be read: every process with it mapped counts as holding the chip",
            path.display()
        ), false),
        LockWord::Held { tid, .. } => {
            // The thread is ours when its process maps the very file: a
            // TID from another pid namespace may name an unrelated
            // process here.
            match procs::thread_group(tid).filter(|pid| procs::maps(*pid, &file)) {
                Some(pid) => Holders {
                    pids: vec![pid],
                    note: None,
                },
                None => by_mapping(format!(
                    "the lock names thread {tid}, which is not a thread of this pid namespace (a holder in a container): every process with the lock mapped counts as holding the chip"
                ), true),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock file in tt-umd's layout with this mutex word and record.
    fn file(word: u32, owner: u32, record: (u32, u32)) -> Vec<u8> {
        let mut b = vec![0u8; FILE_LEN];
        b[0..4].copy_from_slice(&word.to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..12].copy_from_slice(&owner.to_le_bytes());
        b[16..20].copy_from_slice(&0x90u32.to_le_bytes());
        b[MARKER_AT..MARKER_AT + 8].copy_from_slice(&MARKER.to_le_bytes());
        b[OWNER_TID_AT..OWNER_TID_AT + 4].copy_from_slice(&record.1.to_le_bytes());
        b[OWNER_PID_AT..OWNER_PID_AT + 4].copy_from_slice(&record.0.to_le_bytes());
        b
    }

    #[test]
    #[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
    fn the_layout_is_tt_umds_on_x86_64() {
        assert_eq!(
            (MARKER_AT, OWNER_TID_AT, OWNER_PID_AT, FILE_LEN),
            (40, 48, 52, 56)
        );
        assert_eq!(&MARKER.to_le_bytes(), b"XTMDMUTT");
    }

    #[test]
    fn a_held_lock_names_its_thread_and_the_waiter_bit_is_not_part_of_it() {
        assert_eq!(
            parse(&file(16736, 16736, (16736, 16736))),
            LockWord::Held {
                tid: 16736,
                waiters: false,
                record: (16736, 16736)
            }
        );
        assert_eq!(
            parse(&file(0x8000_0000 | 4242, 4242, (4240, 4242))),
            LockWord::Held {
                tid: 4242,
                waiters: true,
                record: (4240, 4242)
            }
        );
        // Just taken: tt-umd has not written its record yet.
        assert!(matches!(
            parse(&file(77, 77, (0, 0))),
            LockWord::Held { tid: 77, .. }
        ));
    }

    #[test]
    fn released_and_dead_holders_hold_nothing() {
        // Released: word and owner 0, tt-umd's record zeroed.
        assert_eq!(parse(&file(0, 0, (0, 0))), LockWord::Free);
        // kill -9: the kernel leaves FUTEX_OWNER_DIED, a stale owner and
        // tt-umd's record of the dead holder.
        assert_eq!(
            parse(&file(0x4000_0000, 5151, (5151, 5151))),
            LockWord::OwnerDied
        );
        // The holder had taken it after a wait: glibc leaves the waiters
        // bit set, and the kernel keeps it at the death (seen with
        // tt-umd 0.9.14: 0xc0000000).
        assert_eq!(
            parse(&file(0xc000_0000, 5151, (5151, 5151))),
            LockWord::OwnerDied
        );
        // Recovered by the next taker: its TID, without the bit.
        assert!(matches!(
            parse(&file(0x4000_0000 | 6000, 6000, (6000, 6000))),
            LockWord::Held { tid: 6000, .. }
        ));
    }

    #[test]
    fn a_short_file_is_nobodys_and_a_missing_marker_is_not_tt_umds() {
        let full = file(1234, 1234, (1234, 1234));
        assert_eq!(parse(&[]), LockWord::Absent);
        assert_eq!(parse(&full[..FILE_LEN - 1]), LockWord::Absent);
        let mut other = full.clone();
        other[MARKER_AT..MARKER_AT + 8].copy_from_slice(b"not umd!");
        assert_eq!(parse(&other), LockWord::Foreign);
        // Created and sized, not set up yet (tt-umd does so under flock).
        assert_eq!(parse(&[0u8; FILE_LEN]), LockWord::Foreign);
        // Longer than tt-umd's: the rest is not read.
        let mut longer = full;
        longer.extend_from_slice(&[0xff; 8]);
        assert!(matches!(parse(&longer), LockWord::Held { tid: 1234, .. }));
    }

    #[test]
    fn files_are_read_without_following_links_or_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("TT_UMD_LOCK.CHIP_IN_USE_0_PCIe");
        assert_eq!(read(&path).0, LockWord::Absent);
        assert_eq!(holders(&path, &[]), Holders::default());
        std::fs::write(&path, file(0, 0, (0, 0))).unwrap();
        let (word, which) = read(&path);
        assert_eq!(word, LockWord::Free);
        assert_eq!(which.map(|w| w.path), Some(path.clone()));
        // A link there is not followed, even to a held lock.
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, file(1, 1, (1, 1))).unwrap();
        let link = dir.path().join("TT_UMD_LOCK.CHIP_IN_USE_1_PCIe");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(read(&link).0, LockWord::Absent);
        // A FIFO does not hang the reader.
        let fifo = dir.path().join("TT_UMD_LOCK.CHIP_IN_USE_2_PCIe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        assert_eq!(read(&fifo).0, LockWord::Foreign);
    }

    #[test]
    fn a_held_word_naming_no_thread_of_ours_falls_back_to_the_mappers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("TT_UMD_LOCK.CHIP_IN_USE_0_PCIe");
        // A TID no process here has (pid_max is at most 2^22).
        std::fs::write(&path, file(0x3fff_fff0, 0x3fff_fff0, (7, 0x3fff_fff0))).unwrap();
        // Nobody maps it: nobody is named.
        assert_eq!(holders(&path, &[std::process::id()]), Holders::default());
        // Our own TID, but we do not map the file: not a holder either.
        let me = std::process::id();
        std::fs::write(&path, file(me, me, (me, me))).unwrap();
        assert_eq!(holders(&path, &[me]), Holders::default());
        // Mapped by us: we hold it, and only we.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // SAFETY: a shared mapping of a file of this test; nothing reads
        // or writes through it.
        let mapping = unsafe {
            nix::sys::mman::mmap(
                None,
                std::num::NonZeroUsize::new(FILE_LEN).unwrap(),
                nix::sys::mman::ProtFlags::PROT_READ,
                nix::sys::mman::MapFlags::MAP_SHARED,
                &opened,
                0,
            )
        }
        .unwrap();
        assert_eq!(
            holders(&path, &[]),
            Holders {
                pids: vec![me],
                note: None
            }
        );
        // Held by a thread of another pid namespace: we map it, so we are
        // taken for its holder, and the note says why.
        std::fs::write(&path, file(0x3fff_fff0, 0x3fff_fff0, (7, 0x3fff_fff0))).unwrap();
        let found = holders(&path, &[me]);
        assert_eq!(found.pids, [me]);
        assert!(
            found
                .note
                .as_deref()
                .is_some_and(|n| n.contains("thread 1073741808")),
            "{found:?}"
        );
        // Released: nobody, though we still map it.
        std::fs::write(&path, file(0, 0, (0, 0))).unwrap();
        assert_eq!(holders(&path, &[me]), Holders::default());
        // Not tt-umd's layout: the openers that map it, and only them.
        let mut foreign = file(me, me, (me, me));
        foreign[MARKER_AT..MARKER_AT + 8].copy_from_slice(b"not umd!");
        std::fs::write(&path, &foreign).unwrap();
        let found = holders(&path, &[me]);
        assert_eq!(found.pids, [me]);
        assert!(found
            .note
            .is_some_and(|n| n.contains("not in tt-umd 0.9.14's layout")));
        assert_eq!(holders(&path, &[]), Holders::default());
        // SAFETY: the mapping above, unused since.
        unsafe { nix::sys::mman::munmap(mapping, FILE_LEN) }.unwrap();
    }
}
