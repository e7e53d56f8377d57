//! Process setup every worker does the same way: logs to stderr, death
//! with the daemon, and the socket bound before anything slow.

use crate::names;
use std::path::Path;
use std::time::Duration;
use tokio::net::UnixListener;

/// Logs to stderr (the daemon captures it into its journal and `ttctl
/// logs`), filtered by `TT_WORKER_LOG` (default `info`), coloured only at a
/// terminal.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env(names::LOG)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
}

/// Asks the kernel to send `signal` to this process when the thread that
/// forked it dies. A worker must not outlive the daemon: its cards would
/// stay busy under a process nobody supervises.
pub fn set_parent_death_signal(signal: libc::c_int) {
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a process attribute.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0);
    }
}

/// How often the parent watch looks.
const PARENT_POLL: Duration = Duration::from_millis(200);

/// The backstop to [`set_parent_death_signal`], whose signal the kernel
/// ties to the parent *thread* that spawned us, not the process
/// (docs/RELIABILITY.md): a thread that polls for being reparented, then
/// calls `on_gone` (which must only make calls safe while other threads
/// may hold locks) and leaves at once with status 1, without exit handlers
/// that could wait on a lock a stuck thread holds.
pub fn watch_parent(program: &'static str, on_gone: fn()) {
    let parent = std::os::unix::process::parent_id();
    if parent == 1 {
        return; // started by init itself: nothing to outlive
    }
    let watch = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || loop {
            std::thread::sleep(PARENT_POLL);
            if std::os::unix::process::parent_id() != parent {
                // Our stderr may have lost its reader with the parent:
                // write without panicking.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "{program}: my parent (pid {parent}) is gone; exiting"
                );
                on_gone();
                // SAFETY: _exit ends the process at once; nothing of ours
                // runs after it.
                unsafe { libc::_exit(names::EXIT_FAILURE as libc::c_int) }
            }
        });
    if let Err(e) = watch {
        eprintln!("{program}: cannot start the parent watch ({e}); relying on PR_SET_PDEATHSIG");
    }
}

/// Why the socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The socket's directory could not be created.
    #[error("cannot create the socket directory {dir}: {source}")]
    Directory {
        /// The directory.
        dir: String,
        /// Why.
        source: std::io::Error,
    },
    /// Something other than a socket sits at the path: never removed.
    #[error("{path} exists and is not a socket; remove it or point {var} elsewhere", var = names::SOCKET)]
    NotASocket {
        /// The path.
        path: String,
    },
    /// bind(2) failed.
    #[error("cannot bind the worker socket {path}: {source}")]
    Bind {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Binds the worker's socket (before the model loads, so Info and Health
/// answer from the first second). A socket left by a previous worker of
/// the slot is replaced; anything else at the path is refused, never
/// removed. Needs a tokio runtime.
pub fn bind(socket: &Path) -> Result<UnixListener, BindError> {
    if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| BindError::Directory {
            dir: dir.display().to_string(),
            source,
        })?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket {
                path: socket.display().to_string(),
            });
        }
        let _ = std::fs::remove_file(socket);
    }
    UnixListener::bind(socket).map_err(|source| BindError::Bind {
        path: socket.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_any_other_file_refused() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sub/w.sock");
        drop(bind(&socket).unwrap());
        assert!(socket.exists(), "the stale socket stays after its listener");
        drop(bind(&socket).unwrap());
        let file = dir.path().join("precious");
        std::fs::write(&file, b"keep").unwrap();
        let e = bind(&file).unwrap_err();
        assert!(matches!(e, BindError::NotASocket { .. }), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
        // A link planted at the socket path, even one to a socket, is not
        // ours: refused, and neither it nor its target is touched.
        let link = dir.path().join("planted.sock");
        std::os::unix::fs::symlink(&socket, &link).unwrap();
        let e = bind(&link).unwrap_err();
        assert!(matches!(e, BindError::NotASocket { .. }), "{e}");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        crate::serve::remove_socket(&link);
        assert!(
            std::fs::symlink_metadata(&link).is_ok(),
            "a link is never removed"
        );
        assert!(socket.exists());
    }
}
