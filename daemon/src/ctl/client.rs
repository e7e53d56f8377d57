//! Connecting to the daemon's control socket.
//!
//! The channel itself comes from [`crate::uds::channel`], the one place that
//! builds gRPC channels over unix sockets. What this module adds is the
//! operator's view: the connection is made eagerly, under a deadline, so
//! that the most common mistakes (daemon not running, not in the socket's
//! group, a socket file left behind by a crash) are reported up front, each
//! with what to do, instead of as an opaque transport error on the first
//! call.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::Channel;
use tt_serving_proto::v1::control_client::ControlClient;

/// Where the NixOS module puts the control socket.
pub const DEFAULT_SOCKET: &str = "/run/tt-serving/control.sock";

/// A local socket answers in microseconds; a daemon that does not accept
/// within this is wedged, and the operator should hear so rather than wait.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the control socket could not be reached. Every variant means exit
/// code 3; each message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No file at the path: the daemon is not running (or the path is wrong).
    #[error(
        "tt-servingd is not running: no control socket at {} \
         (start it with 'systemctl start tenstorrent-serving', or pass --socket)",
        path.display()
    )]
    NotRunning {
        /// The socket path tried.
        path: PathBuf,
    },
    /// The socket exists but this user may not connect to it.
    #[error(
        "permission denied on {p}: add your user to the socket's group \
         (ls -l {p} shows it) or run as root",
        p = path.display()
    )]
    PermissionDenied {
        /// The socket path tried.
        path: PathBuf,
    },
    /// The file exists but nothing listens on it, typically a socket left
    /// behind by a daemon that crashed.
    #[error(
        "tt-servingd is not running: {} is a stale control socket, nothing is \
         listening on it (start the daemon with 'systemctl start tenstorrent-serving'; \
         check 'systemctl status tenstorrent-serving' for why it stopped)",
        path.display()
    )]
    Stale {
        /// The socket path tried.
        path: PathBuf,
    },
    /// Something other than a socket is at the path (a regular file, a
    /// directory): the path is wrong rather than the daemon down.
    #[error(
        "{} is not a socket; point --socket (or TTCTL_SOCKET) at tt-servingd's control \
         socket (default {DEFAULT_SOCKET})",
        path.display()
    )]
    NotASocket {
        /// The path tried.
        path: PathBuf,
    },
    /// The daemon did not accept the connection in time.
    #[error(
        "tt-servingd did not accept a connection on {} within {}s; it may be hung \
         (check 'systemctl status tenstorrent-serving' and its journal)",
        path.display(),
        CONNECT_TIMEOUT.as_secs()
    )]
    TimedOut {
        /// The socket path tried.
        path: PathBuf,
    },
    /// Anything else, with the underlying error.
    #[error("cannot connect to tt-servingd at {}: {detail}", path.display())]
    Other {
        /// The socket path tried.
        path: PathBuf,
        /// The underlying error, with its causes.
        detail: String,
    },
}

impl ConnectError {
    /// The socket path that could not be reached.
    pub fn path(&self) -> &Path {
        match self {
            ConnectError::NotRunning { path }
            | ConnectError::PermissionDenied { path }
            | ConnectError::Stale { path }
            | ConnectError::NotASocket { path }
            | ConnectError::TimedOut { path }
            | ConnectError::Other { path, .. } => path,
        }
    }
}

/// Connect to the Control service on the unix socket at `path`.
pub async fn connect(path: &Path) -> Result<ControlClient<Channel>, ConnectError> {
    match tokio::time::timeout(CONNECT_TIMEOUT, crate::uds::channel(path)).await {
        Err(_elapsed) => Err(ConnectError::TimedOut {
            path: path.to_path_buf(),
        }),
        Ok(Err(err)) => Err(classify(path, &err)),
        Ok(Ok(channel)) => Ok(ControlClient::new(channel)),
    }
}

/// Map a transport error to the operator's explanation, by the OS error the
/// connector hit (tonic wraps it a few layers deep).
fn classify(path: &Path, err: &(dyn std::error::Error + 'static)) -> ConnectError {
    let path = path.to_path_buf();
    match find_io_error(err).map(io::Error::kind) {
        Some(io::ErrorKind::NotFound) => ConnectError::NotRunning { path },
        Some(io::ErrorKind::PermissionDenied) => ConnectError::PermissionDenied { path },
        // Linux refuses connections to any non-socket file as well as to a
        // socket nobody listens on; only the second is a stale socket.
        Some(io::ErrorKind::ConnectionRefused) if is_non_socket(&path) => {
            ConnectError::NotASocket { path }
        }
        Some(io::ErrorKind::ConnectionRefused) => ConnectError::Stale { path },
        _ => ConnectError::Other {
            path,
            detail: error_chain(err),
        },
    }
}

fn is_non_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| !m.file_type().is_socket())
}

fn find_io_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a io::Error> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io);
        }
        cur = e.source();
    }
    None
}

/// `outer: cause: root cause`, skipping causes whose text repeats the outer
/// message (tonic and hyper often nest the same words).
pub(super) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let part = e.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cur = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io_err(kind: io::ErrorKind) -> io::Error {
        io::Error::new(kind, "from the OS")
    }

    #[test]
    fn missing_socket_says_the_daemon_is_not_running_and_how_to_start_it() {
        let err = classify(Path::new("/x/c.sock"), &io_err(io::ErrorKind::NotFound));
        assert!(matches!(err, ConnectError::NotRunning { .. }));
        assert_eq!(
            err.to_string(),
            "tt-servingd is not running: no control socket at /x/c.sock (start it with \
             'systemctl start tenstorrent-serving', or pass --socket)"
        );
    }

    #[test]
    fn permission_denied_names_the_socket_group_fix() {
        let err = classify(
            Path::new("/x/c.sock"),
            &io_err(io::ErrorKind::PermissionDenied),
        );
        assert_eq!(
            err.to_string(),
            "permission denied on /x/c.sock: add your user to the socket's group \
             (ls -l /x/c.sock shows it) or run as root"
        );
    }

    #[test]
    fn refused_connection_is_a_stale_socket() {
        let err = classify(
            Path::new("/x/c.sock"),
            &io_err(io::ErrorKind::ConnectionRefused),
        );
        assert!(matches!(err, ConnectError::Stale { .. }));
        assert!(err.to_string().contains("stale control socket"));
    }

    #[test]
    fn io_error_is_found_below_wrapping_errors() {
        #[derive(Debug, thiserror::Error)]
        #[error("transport error")]
        struct Wrapper(#[source] io::Error);
        let err = classify(
            Path::new("/x/c.sock"),
            &Wrapper(io_err(io::ErrorKind::NotFound)),
        );
        assert!(matches!(err, ConnectError::NotRunning { .. }));
    }

    #[tokio::test]
    async fn connecting_to_a_regular_file_says_it_is_not_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        std::fs::write(&path, "").unwrap();
        let err = connect(&path).await.unwrap_err();
        assert!(matches!(err, ConnectError::NotASocket { .. }), "{err:?}");
        assert!(err.to_string().contains("is not a socket"), "{err}");
    }

    #[tokio::test]
    async fn connecting_to_a_missing_path_reports_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let err = connect(&path).await.unwrap_err();
        assert!(matches!(err, ConnectError::NotRunning { .. }), "{err:?}");
        assert_eq!(err.path(), path);
    }

    #[tokio::test]
    async fn connecting_to_a_socket_nobody_listens_on_reports_stale() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        // Binding creates the socket file; dropping the listener leaves it
        // behind with nobody accepting, exactly what a crashed daemon leaves.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let err = connect(&path).await.unwrap_err();
        assert!(matches!(err, ConnectError::Stale { .. }), "{err:?}");
    }
}
