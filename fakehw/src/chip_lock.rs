//! tt-umd's chip lock, taken as tt-umd 0.9.14 takes it (`robust_mutex.cpp`;
//! docs/HARDWARE.md "tt-umd 0.9.14 chip lock"): a process-shared robust
//! pthread mutex in a 56-byte file, so that readers of the file (the
//! daemon) see what they would see beside a real engine.
//!
//! The file is created mode 0666 with `O_EXCL` by the first taker, sized
//! and set up under an `flock`, then mapped and the descriptor closed (the
//! mapping stays for the process's life, locked or not). Layout (x86-64
//! glibc): the `pthread_mutex_t` (40 bytes), `initialized` =
//! `0x5454554d444d5458`, then tt-umd's record of the holder: `owner_tid`,
//! `owner_pid`. A holder that died leaves the mutex to be recovered by the
//! next taker (`EOWNERDEAD`, `pthread_mutex_consistent`), silently.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use nix::fcntl::{Flock, FlockArg};
use nix::libc;

use crate::error::{FakeHwError, Result};

/// tt-umd's marker of a set-up mutex.
pub const INITIALIZED: u64 = 0x5454_554d_444d_5458;

/// The file's contents (`pthread_mutex_wrapper` in tt-umd).
#[repr(C)]
struct Shared {
    mutex: libc::pthread_mutex_t,
    initialized: u64,
    owner_tid: i32,
    owner_pid: i32,
}

/// The file's size: 56 bytes on x86-64.
pub const FILE_LEN: usize = std::mem::size_of::<Shared>();

/// A chip lock mapped by this process, and held until released or
/// dropped. Not `Send`: a pthread mutex is unlocked by the thread that
/// locked it.
#[derive(Debug)]
pub struct ChipLock {
    shared: NonNull<Shared>,
    held: bool,
    path: PathBuf,
}

fn io_error(what: &'static str, path: &Path, e: impl Into<io::Error>) -> FakeHwError {
    FakeHwError::io(what, path, e.into())
}

/// Opens the lock file, creating it mode 0666 if it is not there, never
/// through a link.
fn open(path: &Path) -> Result<File> {
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o666)
        .custom_flags(flags)
        .open(path)
    {
        Ok(file) => {
            // tt-umd clears its umask so every user may take the lock.
            file.set_permissions(std::fs::Permissions::from_mode(0o666))
                .map_err(|e| io_error("setting the mode of", path, e))?;
            Ok(file)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(path)
            .map_err(|e| io_error("opening", path, e)),
        Err(e) => Err(io_error("creating", path, e)),
    }
}

impl ChipLock {
    /// Maps the lock at `path` (setting it up if nobody has) and takes it,
    /// waiting for a live holder as tt-umd does.
    pub fn take(path: &Path) -> Result<ChipLock> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io_error("creating", dir, e))?;
        }
        let file = open(path)?;
        let file = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| io_error("locking", path, errno))?;
        let len = file
            .metadata()
            .map_err(|e| io_error("reading", path, e))?
            .len();
        if len < FILE_LEN as u64 {
            file.set_len(FILE_LEN as u64)
                .map_err(|e| io_error("sizing", path, e))?;
        }
        let length = std::num::NonZeroUsize::new(FILE_LEN)
            .ok_or_else(|| FakeHwError::Invalid("a zero-sized chip lock".into()))?;
        // SAFETY: a shared mapping of a file we hold open, at least
        // FILE_LEN long; the kernel keeps it after the descriptor closes.
        let mapped = unsafe {
            nix::sys::mman::mmap(
                None,
                length,
                nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
                nix::sys::mman::MapFlags::MAP_SHARED,
                &*file,
                0,
            )
        }
        .map_err(|e| io_error("mapping", path, e))?;
        let lock = ChipLock {
            shared: mapped.cast(),
            held: false,
            path: path.to_path_buf(),
        };
        let shared = lock.shared.as_ptr();
        // SAFETY: `shared` points at FILE_LEN mapped bytes; others set the
        // mutex up only under the flock we hold.
        unsafe {
            if std::ptr::addr_of!((*shared).initialized).read_volatile() != INITIALIZED {
                lock.init_mutex()?;
                std::ptr::addr_of_mut!((*shared).initialized).write_volatile(INITIALIZED);
            }
        }
        // The mapping stays; tt-umd closes the descriptor too.
        drop(file);
        let mut lock = lock;
        lock.lock()?;
        Ok(lock)
    }

    /// pthread_mutex_init with the attributes tt-umd gives it.
    ///
    /// # Safety
    /// The caller holds the file's flock (no one else sets it up) and no
    /// process uses the mutex (it has no marker yet).
    unsafe fn init_mutex(&self) -> Result<()> {
        let shared = self.shared.as_ptr();
        let mut attr = std::mem::MaybeUninit::<libc::pthread_mutexattr_t>::uninit();
        let check = |what: &str, rc: i32| match rc {
            0 => Ok(()),
            rc => Err(FakeHwError::Invalid(format!(
                "{what} failed for {}: {}",
                self.path.display(),
                io::Error::from_raw_os_error(rc)
            ))),
        };
        check(
            "pthread_mutexattr_init",
            libc::pthread_mutexattr_init(attr.as_mut_ptr()),
        )?;
        let set = check(
            "pthread_mutexattr_setpshared",
            libc::pthread_mutexattr_setpshared(attr.as_mut_ptr(), libc::PTHREAD_PROCESS_SHARED),
        )
        .and_then(|()| {
            check(
                "pthread_mutexattr_setrobust",
                libc::pthread_mutexattr_setrobust(attr.as_mut_ptr(), libc::PTHREAD_MUTEX_ROBUST),
            )
        })
        .and_then(|()| {
            check(
                "pthread_mutex_init",
                libc::pthread_mutex_init(std::ptr::addr_of_mut!((*shared).mutex), attr.as_ptr()),
            )
        });
        libc::pthread_mutexattr_destroy(attr.as_mut_ptr());
        set
    }

    /// Takes the mutex (recovering it from a dead holder) and records us.
    fn lock(&mut self) -> Result<()> {
        let shared = self.shared.as_ptr();
        // SAFETY: the mapping lives as long as self; the mutex is set up.
        unsafe {
            let mutex = std::ptr::addr_of_mut!((*shared).mutex);
            match libc::pthread_mutex_lock(mutex) {
                0 => {}
                libc::EOWNERDEAD => {
                    libc::pthread_mutex_consistent(mutex);
                }
                rc => {
                    return Err(FakeHwError::Invalid(format!(
                        "pthread_mutex_lock failed for {}: {}",
                        self.path.display(),
                        io::Error::from_raw_os_error(rc)
                    )))
                }
            }
            self.held = true;
            std::ptr::addr_of_mut!((*shared).owner_tid)
                .write_volatile(nix::unistd::gettid().as_raw());
            std::ptr::addr_of_mut!((*shared).owner_pid)
                .write_volatile(nix::unistd::getpid().as_raw());
        }
        Ok(())
    }

    /// Whether this process holds it now.
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Releases the mutex and keeps the file mapped, as a tt-umd process
    /// that closed its device and lives on. Releasing twice does nothing.
    pub fn release(&mut self) {
        if !self.held {
            return;
        }
        let shared = self.shared.as_ptr();
        // SAFETY: this thread holds the mutex (ChipLock is not Send).
        unsafe {
            std::ptr::addr_of_mut!((*shared).owner_tid).write_volatile(0);
            std::ptr::addr_of_mut!((*shared).owner_pid).write_volatile(0);
            libc::pthread_mutex_unlock(std::ptr::addr_of_mut!((*shared).mutex));
        }
        self.held = false;
    }
}

impl Drop for ChipLock {
    fn drop(&mut self) {
        self.release();
        // SAFETY: the mapping made in take, unused from here on.
        let _ = unsafe { nix::sys::mman::munmap(self.shared.cast(), FILE_LEN) };
    }
}
