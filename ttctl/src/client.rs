//! Reaching the daemon: connecting to its control socket, and [`Daemon`],
//! the one client every command calls through.
//!
//! The channel itself comes from [`tt_serving_proto::uds::channel`], the one place that
//! builds gRPC channels over unix sockets. What this module adds is the
//! operator's view: the connection is made eagerly, under a deadline, so
//! that the most common mistakes (daemon not running, not in the socket's
//! group, a socket file left behind by a crash) are reported up front, each
//! with what to do, instead of as an opaque transport error on the first
//! call. After that, [`Daemon`] turns every error of every call into a
//! [`Failure`] in one place, so commands never see a `tonic::Status`.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};
use tt_serving_proto::v1::control_client::ControlClient;
use tt_serving_proto::v1::{
    AuditRequest, AuditResponse, BorrowEvent, BorrowRequest, BuildCacheProgress, BuildCacheRequest,
    GenerateRequest, GenerateResponse, ListCacheRequest, ListCacheResponse, LogLine, LogsRequest,
    ReloadReport, ReloadRequest, RemoveCacheRequest, RemoveCacheResponse, ResetCardRequest,
    ResetProgress, SlotReply, SlotRequest, StatusRequest, StatusResponse, UsageRequest,
    UsageResponse, VerifyCacheProgress, VerifyCacheRequest,
};

use super::outcome::Failure;

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
    match tokio::time::timeout(CONNECT_TIMEOUT, tt_serving_proto::uds::channel(path)).await {
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
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
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

impl From<ConnectError> for Failure {
    fn from(err: ConnectError) -> Self {
        Failure::Unreachable(err.to_string())
    }
}

/// Status is answered from the daemon's memory; a daemon that takes longer
/// than this is stuck, and a hanging `ttctl status` would hide that.
const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// The daemon only queues a slot restart for the slot's supervisor and
/// answers; the drain and the start happen after the reply.
const RESTART_TIMEOUT: Duration = Duration::from_secs(30);

/// Listing walks every variant dir to add up sizes, which takes a moment on
/// a big cache but not minutes.
const LIST_CACHE_TIMEOUT: Duration = Duration::from_secs(120);

/// The daemon, as ttctl's commands call it: one method per Control call,
/// each answering with the message or the [`Failure`] it means (exit 1 for
/// what the daemon refused, exit 3 for a daemon that went away or stopped
/// answering). Calls answered from the daemon's memory or a quick look at
/// the disk have a deadline; calls that wait for work to finish (a reload,
/// a removal, every stream) do not.
#[derive(Clone)]
pub(super) struct Daemon {
    /// The gRPC client on the control socket.
    client: ControlClient<Channel>,
    /// The control socket, named in failures.
    socket: PathBuf,
}

impl Daemon {
    /// [`connect`] to the control socket at `socket`.
    pub(super) async fn connect(socket: &Path) -> Result<Daemon, Failure> {
        Ok(Daemon {
            client: connect(socket).await?,
            socket: socket.to_path_buf(),
        })
    }

    /// A second handle on the same connection, for a call that runs beside
    /// another (the status stream beside a reload).
    pub(super) fn another(&self) -> Daemon {
        Daemon {
            client: self.client.clone(),
            socket: self.socket.clone(),
        }
    }

    /// `Status`: one snapshot.
    pub(super) async fn status(&mut self) -> Result<StatusResponse, Failure> {
        let call = self.client.status(StatusRequest {});
        answer_within(STATUS_TIMEOUT, call, &self.socket).await
    }

    /// `WatchStatus`: the current snapshot, then one after every change.
    pub(super) async fn watch_status(&mut self) -> Result<Answers<StatusResponse>, Failure> {
        let call = self.client.watch_status(StatusRequest {});
        open(call, &self.socket).await
    }

    /// `ResetCard`: each step of the reset, the last one `finished`.
    pub(super) async fn reset_card(
        &mut self,
        card: &str,
    ) -> Result<Answers<ResetProgress>, Failure> {
        let call = self.client.reset_card(ResetCardRequest {
            card: card.to_string(),
        });
        open(call, &self.socket).await
    }

    /// `BorrowCards`: the daemon's events while `requests` drive the loan.
    pub(super) async fn borrow_cards(
        &mut self,
        requests: mpsc::Receiver<BorrowRequest>,
    ) -> Result<Answers<BorrowEvent>, Failure> {
        let call = self.client.borrow_cards(ReceiverStream::new(requests));
        open(call, &self.socket).await
    }

    /// `Trial`: the daemon's events while `requests` drive the arms.
    pub(super) async fn trial(
        &mut self,
        requests: mpsc::Receiver<tt_serving_proto::v1::TrialRequest>,
    ) -> Result<Answers<tt_serving_proto::v1::TrialEvent>, Failure> {
        let call = self.client.trial(ReceiverStream::new(requests));
        open(call, &self.socket).await
    }

    /// `RestartSlot`: the slot as the queued request found it.
    pub(super) async fn restart_slot(&mut self, slot: &str) -> Result<SlotReply, Failure> {
        let call = self.client.restart_slot(SlotRequest {
            slot: slot.to_string(),
        });
        answer_within(RESTART_TIMEOUT, call, &self.socket).await
    }

    /// `StopSlot`: the slot as the request found it.
    pub(super) async fn stop_slot(&mut self, slot: &str) -> Result<SlotReply, Failure> {
        let call = self.client.stop_slot(SlotRequest {
            slot: slot.to_string(),
        });
        answer_within(RESTART_TIMEOUT, call, &self.socket).await
    }

    /// `StartSlot`: the slot as the request found it.
    pub(super) async fn start_slot(&mut self, slot: &str) -> Result<SlotReply, Failure> {
        let call = self.client.start_slot(SlotRequest {
            slot: slot.to_string(),
        });
        answer_within(RESTART_TIMEOUT, call, &self.socket).await
    }

    /// `Generate`: the text as it is decoded, then the final chunk.
    pub(super) async fn generate(
        &mut self,
        request: GenerateRequest,
    ) -> Result<Answers<GenerateResponse>, Failure> {
        let call = self.client.generate(request);
        open(call, &self.socket).await
    }

    /// `Logs`: a slot worker's recent lines, then new ones when following.
    pub(super) async fn logs(&mut self, request: LogsRequest) -> Result<Answers<LogLine>, Failure> {
        let call = self.client.logs(request);
        open(call, &self.socket).await
    }

    /// `Audit`: the trail's records.
    pub(super) async fn audit(&mut self, request: AuditRequest) -> Result<AuditResponse, Failure> {
        let call = self.client.audit(request);
        answer_within(LIST_CACHE_TIMEOUT, call, &self.socket).await
    }

    /// `Usage`: the ledger's sums per key and model.
    pub(super) async fn usage(&mut self, request: UsageRequest) -> Result<UsageResponse, Failure> {
        let call = self.client.usage(request);
        answer_within(LIST_CACHE_TIMEOUT, call, &self.socket).await
    }

    /// `ListCache`: every variant on disk.
    pub(super) async fn list_cache(&mut self) -> Result<ListCacheResponse, Failure> {
        let call = self.client.list_cache(ListCacheRequest {});
        answer_within(LIST_CACHE_TIMEOUT, call, &self.socket).await
    }

    /// `RemoveCache`. No deadline: deleting a large variant takes as long
    /// as the disk needs.
    pub(super) async fn remove_cache(&mut self, key: &str) -> Result<RemoveCacheResponse, Failure> {
        let call = self.client.remove_cache(RemoveCacheRequest {
            key: key.to_string(),
        });
        answer(call.await, &self.socket)
    }

    /// `BuildCache`: progress, the last message `finished`.
    pub(super) async fn build_cache(
        &mut self,
        model: &str,
    ) -> Result<Answers<BuildCacheProgress>, Failure> {
        let call = self.client.build_cache(BuildCacheRequest {
            model: model.to_string(),
        });
        open(call, &self.socket).await
    }

    /// `VerifyCache`: progress, the last message `finished`.
    pub(super) async fn verify_cache(
        &mut self,
        model: &str,
    ) -> Result<Answers<VerifyCacheProgress>, Failure> {
        let call = self.client.verify_cache(VerifyCacheRequest {
            model: model.to_string(),
        });
        open(call, &self.socket).await
    }

    /// `Reload`. No deadline: waiting for the started slots can take as
    /// long as a cold build.
    pub(super) async fn reload(&mut self, request: ReloadRequest) -> Result<ReloadReport, Failure> {
        let call = self.client.reload(request);
        answer(call.await, &self.socket)
    }
}

/// A stream of answers from the daemon, its errors already [`Failure`]s.
pub(super) struct Answers<T> {
    /// The gRPC response stream.
    stream: Streaming<T>,
    /// The control socket, named in failures.
    socket: PathBuf,
}

impl<T> Answers<T> {
    /// The next answer, or None once the daemon ended the stream.
    /// Cancel-safe, like the stream under it: a `select!` may drop it.
    pub(super) async fn next(&mut self) -> Result<Option<T>, Failure> {
        self.stream
            .message()
            .await
            .map_err(|status| status_failure(status, &self.socket))
    }

    /// The failure for a stream the daemon ended before ttctl was done with
    /// it: `what` says which (`the status stream; it is probably stopping`).
    pub(super) fn ended(&self, what: &str) -> Failure {
        Failure::Unreachable(format!(
            "tt-servingd at {} ended {what} (check 'systemctl status tenstorrent-serving')",
            self.socket.display()
        ))
    }
}

/// Open a streaming call.
async fn open<T>(
    call: impl Future<Output = Result<tonic::Response<Streaming<T>>, tonic::Status>>,
    socket: &Path,
) -> Result<Answers<T>, Failure> {
    Ok(Answers {
        stream: answer(call.await, socket)?,
        socket: socket.to_path_buf(),
    })
}

/// Await one unary call, giving up after `limit`: a daemon that takes
/// longer is stuck, and a hanging ttctl would hide that.
async fn answer_within<T>(
    limit: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    socket: &Path,
) -> Result<T, Failure> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => answer(result, socket),
        Err(_elapsed) => Err(Failure::Unreachable(format!(
            "tt-servingd at {} did not answer within {}s; it may be hung \
             (check 'systemctl status tenstorrent-serving' and its journal)",
            socket.display(),
            limit.as_secs()
        ))),
    }
}

fn answer<T>(
    result: Result<tonic::Response<T>, tonic::Status>,
    socket: &Path,
) -> Result<T, Failure> {
    result
        .map(tonic::Response::into_inner)
        .map_err(|status| status_failure(status, socket))
}

/// Classify an RPC error. A status the daemon sent carries only its code
/// and message, which are shown as they are (the daemon's messages are
/// written for operators). A status that tonic made locally from a broken
/// connection carries the transport error as its source: the daemon went
/// away mid-call.
fn status_failure(status: tonic::Status, socket: &Path) -> Failure {
    if let Some(source) = std::error::Error::source(&status) {
        return Failure::Unreachable(format!(
            "lost the connection to tt-servingd at {}: {} \
             (check 'systemctl status tenstorrent-serving')",
            socket.display(),
            error_chain(source)
        ));
    }
    if status.code() == Code::Unimplemented {
        return Failure::Failed(
            "the running tt-servingd does not know this command; it is probably older \
             than this ttctl (restart the daemon after upgrading)"
                .to_string(),
        );
    }
    if status.message().is_empty() {
        Failure::Failed(format!(
            "tt-servingd refused the request: {}",
            status.code().description()
        ))
    } else {
        Failure::Failed(status.message().to_string())
    }
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
