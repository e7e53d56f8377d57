//! Serving engine.proto on the contract's socket: bound before anything
//! slow, stopped by a Shutdown call or SIGTERM/SIGINT, closed with a short
//! grace for the last answers, the socket removed.

use crate::args::Contract;
use crate::backend::Backend;
use crate::process::{self, BindError};
use crate::service::EngineService;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use tt_serving_proto::v1::engine_server::EngineServer;

/// How long the server may take to send its last answers (the Shutdown
/// call's own) and close, once asked to stop; a stuck client is not waited
/// for.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// Why serving should end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopRequest {
    /// A Shutdown call, which drained the backend already.
    Shutdown,
    /// SIGTERM or SIGINT (named): the worker drains by itself.
    Signal(&'static str),
}

/// Why serving could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The signal handlers.
    #[error("cannot handle signals: {0}")]
    Signals(std::io::Error),
}

/// The contract's socket, bound, with the stop signals handled: what a
/// worker holds before it has a backend to serve (bind first, so a socket
/// that cannot be bound fails the start before an engine is spawned).
pub struct Bound {
    listener: UnixListener,
    socket: PathBuf,
    term: Signal,
    int: Signal,
}

impl Bound {
    /// Starts serving `backend` on the socket.
    pub fn serve<B: Backend>(self, contract: &Contract, backend: Arc<B>) -> Server {
        // Spans are made only with a collector to send them to.
        let exporter =
            contract.otlp_endpoint.as_deref().and_then(
                |endpoint| match tt_serving_telemetry::start(endpoint, B::SERVICE_NAME, Vec::new())
                {
                    Ok(exporter) => Some(exporter),
                    Err(e) => {
                        tracing::warn!(error = %e, "traces are off for this worker");
                        None
                    }
                },
            );
        let shut_down = Arc::new(Notify::new());
        let service = EngineService::new(contract, backend, shut_down.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(EngineServer::new(service))
                .serve_with_incoming_shutdown(
                    tt_serving_proto::uds::incoming(self.listener),
                    async {
                        let _ = stopped.await;
                    },
                ),
        );
        Server {
            socket: self.socket,
            shut_down,
            term: self.term,
            int: self.int,
            stop,
            task,
            exporter,
        }
    }

    /// Gives up before serving: the socket is removed.
    pub fn abandon(self) {
        drop(self.listener);
        remove_socket(&self.socket);
    }
}

/// The engine.proto server on the contract's socket.
pub struct Server {
    socket: PathBuf,
    shut_down: Arc<Notify>,
    term: Signal,
    int: Signal,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    /// The span exporter, while traces are on.
    exporter: Option<tt_serving_telemetry::Exporter>,
}

impl Server {
    /// Handles SIGTERM and SIGINT and binds the contract's socket. Needs a
    /// tokio runtime.
    pub fn bind(contract: &Contract) -> Result<Bound, ServeError> {
        let term = signal(SignalKind::terminate()).map_err(ServeError::Signals)?;
        let int = signal(SignalKind::interrupt()).map_err(ServeError::Signals)?;
        let listener = process::bind(&contract.socket)?;
        Ok(Bound {
            listener,
            socket: contract.socket.clone(),
            term,
            int,
        })
    }

    /// Binds and starts serving `backend` at once.
    pub fn start<B: Backend>(contract: &Contract, backend: Arc<B>) -> Result<Self, ServeError> {
        Ok(Self::bind(contract)?.serve(contract, backend))
    }

    /// Waits for a Shutdown call or a signal. Cancel-safe: use it in a
    /// `select!` beside the engine's own events.
    pub async fn stop_requested(&mut self) -> StopRequest {
        tokio::select! {
            _ = self.shut_down.notified() => StopRequest::Shutdown,
            _ = self.term.recv() => StopRequest::Signal("SIGTERM"),
            _ = self.int.recv() => StopRequest::Signal("SIGINT"),
        }
    }

    /// Stops serving: in-flight answers get [`STOP_GRACE`], then the socket
    /// is removed (only if it is still a socket).
    pub async fn close(self) {
        let _ = self.stop.send(());
        match tokio::time::timeout(STOP_GRACE, self.task).await {
            Ok(Ok(Err(e))) => tracing::warn!("the engine.proto server ended with an error: {e}"),
            Ok(Err(e)) => tracing::warn!("the engine.proto server task failed: {e}"),
            _ => {}
        }
        remove_socket(&self.socket);
        // The last spans (the drained requests') go out before the exit.
        if let Some(exporter) = self.exporter {
            let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
        }
    }
}

/// Removes the socket we bound; never some other file that took its place.
pub fn remove_socket(socket: &std::path::Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(socket);
    }
}
