//! How the front door accepts and keeps its connections, plain or TLS (one
//! path for both): a cap on open connections for the door and for each
//! peer address, a deadline for every request head, one for a kept-alive
//! connection with nothing in progress, and a clean end at shutdown.
//!
//! Why: with axum's own accept loop the door had no timeout and no cap;
//! one unprivileged local user held 200 idle and trickling connections
//! open for minutes (issue 46). hyper's `header_read_timeout` alone does
//! not fit: its timer also runs while a kept-alive connection waits for
//! its next request, so the idle limit could never be longer than the
//! head's. Each connection here is watched instead by its own task, which
//! knows whether a request is in progress (from the service call to the
//! end of the response body, so a long stream is never idle) and when
//! the next head began (from the bytes read).

use super::tls::HttpTls;
use crate::config::OpenaiConfig;
use crate::shutdown::Shutdown;
use axum::body::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tower::ServiceExt;

/// How often at most a refused connection is logged; the line counts the
/// refusals since the last one.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Refused plain-HTTP connections being answered at once; past this a
/// refused connection is closed without an answer, so a flood of them
/// cannot hold file descriptors through the answer's linger.
const MAX_ANSWERING_REFUSALS: usize = 64;

/// How long a refused connection's 503 may take to leave, and the client's
/// request to be read off the socket (closing with unread bytes would send
/// a reset, which can discard the 503 before the client reads it).
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// The door's timeouts and caps, from `[openai]`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `header_read_timeout_secs`.
    header_read: Duration,
    /// `idle_timeout_secs`.
    idle: Duration,
    /// `max_connections`.
    max_connections: u32,
    /// `max_connections_per_peer`.
    max_per_peer: u32,
    /// `body_read_timeout_secs`.
    body_read: Duration,
    /// `write_timeout_secs`.
    write: Duration,
}

impl Limits {
    /// The limits `[openai]` sets.
    pub fn of(config: &OpenaiConfig) -> Limits {
        Limits {
            header_read: Duration::from_secs(config.header_read_timeout_secs),
            idle: Duration::from_secs(config.idle_timeout_secs),
            max_connections: config.max_connections,
            max_per_peer: config.max_connections_per_peer,
            body_read: Duration::from_secs(config.body_read_timeout_secs),
            write: Duration::from_secs(config.write_timeout_secs),
        }
    }
}

/// Accept connections on `listener` and serve `app` on each until
/// shutdown; then wait for the connections to finish what is in progress.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    tls: Option<HttpTls>,
    limits: Limits,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let open = Arc::new(Open::new(limits));
    let refusals = Arc::new(Refusals::default());
    // Each connection task holds a sender; when the last one is dropped
    // the receiver's `recv` ends: every connection has finished.
    let (alive, mut all_done) = mpsc::channel::<()>(1);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, mostly: wait for some to close.
                    tracing::warn!(error = %e, "OpenAI front door: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.clone().wait() => break,
        };
        let accepted_at = Instant::now();
        let place = match open.admit(peer.ip()) {
            Ok(place) => place,
            Err(over) => {
                refusals.note(over, peer, limits);
                refusals.refuse(tcp, over, tls.is_none());
                continue;
            }
        };
        // Tokens are small writes; Nagle's algorithm with delayed ACKs
        // would hold each one back.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let (app, tls, shutdown, alive) =
            (app.clone(), tls.clone(), shutdown.clone(), alive.clone());
        tokio::spawn(async move {
            let _place = place;
            let _alive = alive;
            let activity = Arc::new(Activity::new(accepted_at));
            let connection = Connection {
                peer: peer.ip(),
                cut: Arc::new(AtomicBool::new(false)),
            };
            match tls {
                None => run(tcp, app, activity, connection, limits, shutdown).await,
                Some(tls) => {
                    // The handshake counts against the first head's deadline.
                    let deadline = accepted_at + limits.header_read;
                    match tokio::time::timeout_at(deadline, tls.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            run(stream, app, activity, connection, limits, shutdown).await
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "OpenAI front door: TLS handshake failed")
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "OpenAI front door: TLS handshake timed out")
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    drop(alive);
    let _ = all_done.recv().await;
    Ok(())
}

/// Serve one connection until it ends, its deadline passes, or shutdown
/// finds it with nothing in progress.
async fn run<IO>(
    io: IO,
    app: axum::Router,
    activity: Arc<Activity>,
    connection: Connection,
    limits: Limits,
    shutdown: Shutdown,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn({
        let activity = activity.clone();
        let connection = connection.clone();
        move |request: hyper::Request<Incoming>| {
            let busy = activity.begin();
            let app = app.clone();
            // The body's deadline runs from the end of its head.
            let mut request = request.map(|body| {
                axum::body::Body::new(TimedBody {
                    body,
                    deadline: Box::pin(tokio::time::sleep(limits.body_read)),
                })
            });
            request.extensions_mut().insert(connection.clone());
            async move {
                let response = match app.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                Ok::<_, Infallible>(response.map(|body| Tracked { body, _busy: busy }))
            }
        }
    });
    let watched = Watched {
        io,
        activity: activity.clone(),
        write_timeout: limits.write,
        stalled: None,
        cut: connection.cut.clone(),
    };
    // hyper's own header timer is off: `Activity` keeps both deadlines
    // (see the module's docs).
    let connection = hyper::server::conn::http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(watched), service);
    tokio::pin!(connection);
    let mut stopping = false;
    loop {
        let deadline = activity.deadline(limits);
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "OpenAI front door connection ended with an error");
                }
                return;
            }
            _ = sleep_until(deadline) => {
                if activity.deadline(limits).is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!(
                        "OpenAI front door: closing a connection that sent no complete request head within openai.header_read_timeout_secs, or stayed idle past openai.idle_timeout_secs"
                    );
                    return;
                }
            }
            // A request ended: the idle deadline starts now.
            _ = activity.changed.notified() => {}
            _ = shutdown.clone().wait(), if !stopping => {
                if activity.deadline(limits).is_some() {
                    // Nothing in progress: nothing to finish.
                    return;
                }
                // Finish the response under way, then close.
                connection.as_mut().graceful_shutdown();
                stopping = true;
            }
        }
    }
}

/// Sleep until `deadline`, or for ever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// What a connection is doing, for its deadlines.
struct Activity {
    phase: Mutex<Phase>,
    /// Signalled when a request ends, so the watcher starts the idle
    /// deadline (a stored permit is harmless: the watcher re-reads).
    changed: Notify,
}

struct Phase {
    /// Requests in progress: from hyper's call of the service to the end
    /// of the response body.
    busy: u32,
    /// When the connection was accepted, or its last request ended.
    since: Instant,
    /// When the first byte after `since` was read: a head has begun.
    head_from: Option<Instant>,
    /// Whether a request was ever made on this connection.
    served: bool,
}

impl Activity {
    fn new(accepted: Instant) -> Activity {
        Activity {
            phase: Mutex::new(Phase {
                busy: 0,
                since: accepted,
                head_from: None,
                served: false,
            }),
            changed: Notify::new(),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request's head was read; it is in progress until the returned
    /// guard is dropped.
    fn begin(self: &Arc<Self>) -> Busy {
        let mut phase = self.phase();
        phase.busy += 1;
        phase.served = true;
        Busy(self.clone())
    }

    /// Bytes arrived.
    fn read(&self) {
        let mut phase = self.phase();
        if phase.busy == 0 && phase.head_from.is_none() {
            phase.head_from = Some(Instant::now());
        }
    }

    /// When the connection is to be closed: None while a request is in
    /// progress. The first head must be complete `header_read` after the
    /// accept; a later one `header_read` after its first byte, and until
    /// that byte comes the connection may wait `idle`.
    fn deadline(&self, limits: Limits) -> Option<Instant> {
        let phase = self.phase();
        if phase.busy > 0 {
            return None;
        }
        Some(match (phase.served, phase.head_from) {
            (false, _) => phase.since + limits.header_read,
            (true, Some(head)) => head + limits.header_read,
            (true, None) => phase.since + limits.idle,
        })
    }
}

/// One request in progress on its connection; dropped with the response
/// body (when hyper has sent it all, or the client went away).
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut phase = self.0.phase();
        phase.busy = phase.busy.saturating_sub(1);
        if phase.busy == 0 {
            phase.since = Instant::now();
            phase.head_from = None;
        }
        drop(phase);
        self.0.changed.notify_one();
    }
}

/// A response body that keeps its request in progress until it is sent.
struct Tracked {
    body: axum::body::Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The connection's stream, telling its [`Activity`] when bytes arrive,
/// and cutting a client that takes nothing for `write_timeout`: a write
/// that has waited that long on a full socket fails, which ends the
/// connection (and with it the response body, whose buffer's pump then
/// cancels the request in its engine). Any write the socket takes restarts
/// the clock. The kernel wakes a waiting writer only once a third of the
/// socket's send buffer is free, so a client is cut when it takes less
/// than that in `write_timeout` (with a buffer autotuned to megabytes,
/// tens of KB/s at 30 s; the router's buffer in front absorbs the rest).
struct Watched<IO> {
    io: IO,
    activity: Arc<Activity>,
    write_timeout: Duration,
    /// Running while a write waits on the socket.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Set when this connection was cut so.
    cut: Arc<AtomicBool>,
}

impl<IO> Watched<IO> {
    /// After the socket answered a write: `Pending` starts (or goes on
    /// with) the stall clock, anything else stops it.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timeout = self.write_timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stalled.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.cut.store(true, Ordering::Release);
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client took nothing for {} s (openai.write_timeout_secs)",
                timeout.as_secs()
            ),
        )))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.read();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// What a request's handler knows of its connection (a request
/// extension): the client's address, and whether the connection was cut
/// for taking nothing.
#[derive(Debug, Clone)]
pub struct Connection {
    /// The client's address.
    pub peer: IpAddr,
    /// Set when the connection was cut by `openai.write_timeout_secs`.
    pub cut: Arc<AtomicBool>,
}

/// A request body with a deadline (`openai.body_read_timeout_secs`, from
/// the end of the head): one that has not arrived by then fails with
/// [`BodyTimedOut`], which the handler answers with 408.
struct TimedBody {
    body: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

/// The error of a body that did not arrive in time.
#[derive(Debug)]
pub struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive within openai.body_read_timeout_secs")
    }
}

impl std::error::Error for BodyTimedOut {}

impl hyper::body::Body for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending if this.deadline.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Whether a body failed for want of arriving in time.
pub fn is_body_timeout(rejection: &axum::extract::rejection::BytesRejection) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(e) = source {
        if e.is::<BodyTimedOut>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Which cap a connection met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// `max_connections`.
    Door,
    /// `max_connections_per_peer`.
    Peer,
}

/// The connections open now, on the door and per peer address.
struct Open {
    limits: Limits,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: u32,
    /// Only peers with a connection open: the map cannot grow past
    /// `max_connections` entries.
    per_peer: HashMap<IpAddr, u32>,
}

impl Open {
    fn new(limits: Limits) -> Open {
        Open {
            limits,
            counts: Mutex::default(),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one more connection from `ip`, or the cap it meets.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Place, Over> {
        let ip = peer(ip);
        let mut counts = self.counts();
        if counts.total >= self.limits.max_connections {
            return Err(Over::Door);
        }
        let from_peer = counts.per_peer.entry(ip).or_default();
        if *from_peer >= self.limits.max_per_peer {
            return Err(Over::Peer);
        }
        *from_peer += 1;
        counts.total += 1;
        Ok(Place {
            open: self.clone(),
            ip,
        })
    }

    #[cfg(test)]
    fn total(&self) -> u32 {
        self.counts().total
    }
}

/// The peer `ip` counts as for `max_connections_per_peer`: what one
/// client can vary costs it nothing. An IPv4 client of a dual-stack socket
/// is one peer however its address is written; every loopback address is
/// one peer, since a local user may send from any of 127.0.0.0/8; an IPv6
/// address is its /64, which a host is commonly given whole.
fn peer(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        ip if ip.is_loopback() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
        v4 => v4,
    }
}

/// One open connection's place; freed when dropped.
struct Place {
    open: Arc<Open>,
    ip: IpAddr,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = self.open.counts();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_peer.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.per_peer.remove(&self.ip);
            }
        }
    }
}

/// Refused connections: answered, and logged at most once per
/// [`REFUSAL_LOG_EVERY`].
#[derive(Default)]
struct Refusals {
    log: Mutex<RefusalLog>,
    /// Refusals whose 503 is being sent now.
    answering: Arc<AtomicUsize>,
}

#[derive(Default)]
struct RefusalLog {
    /// When the last line was written.
    logged: Option<Instant>,
    /// Refused since then, by cap.
    door: u64,
    peer: u64,
}

impl Refusals {
    /// Count a refusal; write a line when the last was long enough ago.
    fn note(&self, over: Over, peer: SocketAddr, limits: Limits) {
        crate::metrics::get().openai_connection_refused(match over {
            Over::Door => "max_connections",
            Over::Peer => "max_connections_per_peer",
        });
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        match over {
            Over::Door => log.door += 1,
            Over::Peer => log.peer += 1,
        }
        if log
            .logged
            .is_some_and(|at| at.elapsed() < REFUSAL_LOG_EVERY)
        {
            return;
        }
        tracing::warn!(
            last_peer = %peer.ip(),
            over_max_connections = log.door,
            over_max_connections_per_peer = log.peer,
            max_connections = limits.max_connections,
            max_connections_per_peer = limits.max_per_peer,
            "OpenAI front door: refused connections over openai.max_connections or openai.max_connections_per_peer (counts since the last such line, written at most every {} s); raise them if these clients are legitimate",
            REFUSAL_LOG_EVERY.as_secs()
        );
        log.logged = Some(Instant::now());
        log.door = 0;
        log.peer = 0;
    }

    /// Close a refused connection: with a 503 on plain HTTP (a client
    /// learns why), at once on TLS (a handshake is work the cap exists to
    /// save) or while many refusals are being answered already.
    fn refuse(&self, mut tcp: TcpStream, over: Over, plain: bool) {
        if !plain {
            return;
        }
        let answering = self.answering.clone();
        if answering.fetch_add(1, Ordering::AcqRel) >= MAX_ANSWERING_REFUSALS {
            answering.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REFUSAL_LINGER, async {
                tcp.write_all(refusal(over).as_bytes()).await?;
                tcp.shutdown().await?;
                let mut sink = [0u8; 4096];
                while tcp.read(&mut sink).await? > 0 {}
                Ok::<_, io::Error>(())
            })
            .await;
            answering.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// The whole HTTP answer to a refused connection: a 503 with OpenAI's
/// error JSON, closing the connection.
fn refusal(over: Over) -> String {
    let message = match over {
        Over::Door => "the server has as many connections open as it accepts; retry shortly",
        Over::Peer => {
            "this client address has as many connections open as the server accepts from one address; close one or reuse it, and retry"
        }
    };
    let body = serde_json::json!({
        "error": {
            "message": message,
            "type": "unavailable_error",
            "param": null,
            "code": "too_many_connections",
        }
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: u32, per_peer: u32) -> Limits {
        Limits {
            header_read: Duration::from_secs(2),
            idle: Duration::from_secs(5),
            max_connections: max,
            max_per_peer: per_peer,
            body_read: Duration::from_secs(30),
            write: Duration::from_secs(30),
        }
    }

    /// The server's end of a real loopback connection, watched with
    /// `write_timeout`, and the client's end with a small receive buffer.
    async fn watched_pair(write_timeout: Duration) -> (Watched<TcpStream>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let (client, accepted) = tokio::join!(
            socket.connect(listener.local_addr().unwrap()),
            listener.accept()
        );
        let accepted = accepted.unwrap().0;
        // A fixed small send buffer: the kernel wakes a waiting writer when
        // a third of it is free, so the clock measures the client's pace,
        // not how much an autotuned buffer holds.
        nix::sys::socket::setsockopt(&accepted, nix::sys::socket::sockopt::SndBuf, &16384).unwrap();
        let watched = Watched {
            io: accepted,
            activity: Arc::new(Activity::new(Instant::now())),
            write_timeout,
            stalled: None,
            cut: Arc::new(AtomicBool::new(false)),
        };
        (watched, client.unwrap())
    }

    #[tokio::test]
    async fn a_client_that_takes_nothing_is_cut_after_the_write_timeout() {
        let (mut server, _client) = watched_pair(Duration::from_millis(300)).await;
        let chunk = vec![b'x'; 64 * 1024];
        let started = std::time::Instant::now();
        // The socket's buffers fill, then a write waits 300 ms and fails.
        let err = loop {
            match tokio::time::timeout(Duration::from_secs(20), server.write_all(&chunk)).await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => break e,
                Err(_) => panic!("a write to a client that reads nothing was never cut"),
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(
            err.to_string().contains("openai.write_timeout_secs"),
            "{err}"
        );
        assert!(server.cut.load(Ordering::Acquire), "the cut was not marked");
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_client_that_reads_slowly_is_not_cut() {
        let (mut server, mut client) = watched_pair(Duration::from_millis(300)).await;
        // 1 MiB, far more than the socket holds, taken at about 3 MiB/s
        // (16 KiB reads, a 5 ms pause each): the writer waits often, never
        // 300 ms at once.
        const TOTAL: usize = 1024 * 1024;
        let reader = tokio::spawn(async move {
            let mut buf = vec![0; 16 * 1024];
            let mut got = 0;
            while got < TOTAL {
                match client.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            got
        });
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..TOTAL / chunk.len() {
            server
                .write_all(&chunk)
                .await
                .expect("a reading client is not cut");
        }
        assert_eq!(reader.await.unwrap(), TOTAL);
        assert!(!server.cut.load(Ordering::Acquire));
    }

    #[test]
    fn places_are_capped_per_peer_and_for_the_door_and_freed_on_drop() {
        let open = Arc::new(Open::new(limits(3, 2)));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = open.admit(a).unwrap();
        let _a2 = open.admit(a).unwrap();
        assert_eq!(open.admit(a).err(), Some(Over::Peer));
        // The same peer written as an IPv4-mapped IPv6 address.
        assert_eq!(
            open.admit("::ffff:10.0.0.1".parse().unwrap()).err(),
            Some(Over::Peer)
        );
        let _b1 = open.admit(b).unwrap();
        assert_eq!(open.admit(b).err(), Some(Over::Door));
        drop(a1);
        assert_eq!(open.total(), 2);
        assert!(open.admit(b).is_ok());
        assert!(open.counts().per_peer.len() <= 2);
    }

    /// `deadline` lies between `before + d` and `after + d`.
    fn between(deadline: Option<Instant>, before: Instant, d: Duration) {
        let deadline = deadline.expect("a deadline");
        assert!(
            deadline >= before + d && deadline <= Instant::now() + d,
            "{deadline:?}"
        );
    }

    #[test]
    fn the_first_head_is_timed_from_the_accept_and_later_ones_from_their_first_byte() {
        let limits = limits(10, 10);
        let accepted = Instant::now();
        let activity = Arc::new(Activity::new(accepted));
        assert_eq!(
            activity.deadline(limits),
            Some(accepted + limits.header_read)
        );
        // A trickled first head gains nothing by its first byte.
        activity.read();
        assert_eq!(
            activity.deadline(limits),
            Some(accepted + limits.header_read)
        );

        // In progress, a stream included: no deadline.
        let busy = activity.begin();
        activity.read();
        assert_eq!(activity.deadline(limits), None);
        let ended = Instant::now();
        drop(busy);

        // Then idle, until the next head begins.
        between(activity.deadline(limits), ended, limits.idle);
        let head = Instant::now();
        activity.read();
        between(activity.deadline(limits), head, limits.header_read);
    }

    #[test]
    fn a_peer_is_what_one_client_cannot_vary_for_free() {
        let peer = |s: &str| peer(s.parse().unwrap()).to_string();
        assert_eq!(peer("10.1.2.3"), "10.1.2.3");
        assert_eq!(peer("::ffff:10.1.2.3"), "10.1.2.3");
        assert_eq!(peer("127.0.0.1"), "127.0.0.1");
        assert_eq!(peer("127.8.9.10"), "127.0.0.1");
        assert_eq!(peer("::1"), "127.0.0.1");
        assert_eq!(peer("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(peer("2001:db8:1:2:bbbb::9"), "2001:db8:1:2::");
    }

    #[test]
    fn the_refusal_is_a_whole_http_answer() {
        let text = refusal(Over::Peer);
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "too_many_connections");
    }
}
