//! The bounded buffer between a routed request's stream and its client, so
//! the request's place in the engine never waits on the client's socket.
//!
//! Why: the router's stream used to be polled by the connection that wrote
//! it, so a client that stopped reading stopped the worker's stream through
//! HTTP/2 flow control, and the request kept its place in the slot and the
//! engine's batch for as long as the socket stayed open (issue 54: sixteen
//! streams that never read held a model's every place for minutes). vLLM's
//! own server decodes into a per-request queue whatever the client's pace.
//!
//! Here a task per request (the pump) reads the worker's stream into a
//! channel of `limits.stream_buffer_chunks` chunks and the door takes from
//! it. While there is room the engine runs at its own pace; a request that
//! finishes into the buffer frees its place at once (the client reads the
//! rest later). A full buffer holds the request back; a client that then
//! takes nothing for its door's `write_timeout_secs` is cut: the worker's
//! stream is dropped (the sequence is cancelled in the engine), the request
//! counted `client_stalled`, and the peer logged at a bounded rate. A client
//! that goes away, or whose connection its door cut for the same reason,
//! is noticed at once, not at the next chunk.

use super::{ChunkStream, Outcome, RouteError};
use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tt_serving_proto::v1 as pb;

/// One item of a routed stream.
pub type Item = Result<pb::GenerateResponse, RouteError>;

/// Who reads a buffered stream, for the stall rule and its log line.
#[derive(Debug, Clone)]
pub struct Client {
    /// The door, for the log and the message (`openai`, `grpc`, `control`).
    pub door: &'static str,
    /// The config key of the door's write timeout, for messages.
    pub timeout_key: &'static str,
    /// How long a full buffer may go untouched.
    pub write_timeout: Duration,
    /// The client's address, when the door knows it.
    pub peer: Option<IpAddr>,
    /// Set by the door when it cut the client's connection for taking
    /// nothing for `write_timeout` (its socket full): the request then
    /// counts as stalled rather than cancelled.
    pub cut_by_door: Option<Arc<AtomicBool>>,
}

/// The client's end of a buffered stream: the chunks in order, then (when
/// the client was cut) one error saying why.
pub struct Buffered {
    chunks: mpsc::Receiver<Item>,
    /// Set by the pump when it cut the request.
    cut: Arc<Mutex<Option<RouteError>>>,
    host_sampling: Vec<&'static str>,
}

impl Buffered {
    /// The parameters of this request that put it on its engine's host
    /// sampling path.
    pub fn host_sampling(&self) -> &[&'static str] {
        &self.host_sampling
    }

    /// Every chunk ready now, up to `limit`, appended to `out`: a client
    /// behind its engine gets what piled up in one write. `Ready(0)`: the
    /// stream has ended.
    pub fn poll_ready_chunks(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Item>,
        limit: usize,
    ) -> Poll<usize> {
        match self.chunks.poll_recv_many(cx, out, limit) {
            Poll::Ready(0) => Poll::Ready(usize::from(self.take_cut(out))),
            other => other,
        }
    }

    /// After the last chunk: the error of a cut, once.
    fn take_cut(&mut self, out: &mut Vec<Item>) -> bool {
        let cut = self.cut.lock().unwrap_or_else(|e| e.into_inner()).take();
        match cut {
            Some(e) => {
                out.push(Err(e));
                true
            }
            None => false,
        }
    }
}

impl Stream for Buffered {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        match self.chunks.poll_recv(cx) {
            Poll::Ready(None) => {
                let mut out = Vec::new();
                self.take_cut(&mut out);
                Poll::Ready(out.pop())
            }
            other => other,
        }
    }
}

/// Start the pump of `stream` into a buffer of `capacity` chunks and
/// return the client's end.
pub fn buffer(stream: ChunkStream, capacity: usize, client: Client) -> Buffered {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let cut = Arc::new(Mutex::new(None));
    let host_sampling = stream.host_sampling().to_vec();
    tokio::spawn(pump(stream, tx, cut.clone(), client));
    Buffered {
        chunks: rx,
        cut,
        host_sampling,
    }
}

/// Move the chunks of `stream` into `tx` until the stream ends, the client
/// goes away, or it is cut. Dropping `stream` at the end frees the
/// request's place (and, before its end, cancels it in the worker).
async fn pump(
    mut stream: ChunkStream,
    tx: mpsc::Sender<Item>,
    cut: Arc<Mutex<Option<RouteError>>>,
    client: Client,
) {
    loop {
        let permit = match tx.try_reserve() {
            Ok(permit) => permit,
            Err(mpsc::error::TrySendError::Closed(())) => return gone(&mut stream, &client),
            // Full: the client has a write timeout's time to take one.
            Err(mpsc::error::TrySendError::Full(())) => {
                match tokio::time::timeout(client.write_timeout, tx.reserve()).await {
                    Ok(Ok(permit)) => permit,
                    Ok(Err(_)) => return gone(&mut stream, &client),
                    Err(_) => {
                        let why = stalled(&mut stream, &client);
                        *cut.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                        return;
                    }
                }
            }
        };
        let next = tokio::select! {
            next = stream.next() => next,
            () = tx.closed() => return gone(&mut stream, &client),
        };
        match next {
            Some(item) => permit.send(item),
            None => return,
        }
    }
}

/// The client's end was dropped before the stream's: it went away, or its
/// door cut its connection for taking nothing.
fn gone(stream: &mut ChunkStream, client: &Client) {
    if client
        .cut_by_door
        .as_ref()
        .is_some_and(|c| c.load(Ordering::Acquire))
    {
        stalled(stream, client);
    }
}

/// Count and log a stalled client; the error its stream ends with.
fn stalled(stream: &mut ChunkStream, client: &Client) -> RouteError {
    stream.end_as(Outcome::ClientStalled);
    log_stall(client, stream.model());
    RouteError::ClientStalled(format!(
        "the client took nothing of this stream for {} s ({}) while its buffer was full; the request was cancelled",
        client.write_timeout.as_secs(),
        client.timeout_key
    ))
}

/// How often at most one peer's stalls are logged.
const STALL_LOG_EVERY: Duration = Duration::from_secs(60);

/// Peers whose stalls were logged lately; bounded, so that clients from
/// many addresses cannot grow it.
const STALL_LOG_PEERS: usize = 1024;

/// One peer's stalls: when its last line was written, and stalls since.
type PeerStalls = (Option<Instant>, u64);

/// Per peer, its stalls.
static STALL_LOG: LazyLock<Mutex<HashMap<Option<IpAddr>, PeerStalls>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn log_stall(client: &Client, model: &str) {
    let mut log = STALL_LOG.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    if log.len() >= STALL_LOG_PEERS {
        log.retain(|_, (at, _)| at.is_some_and(|at| now.duration_since(at) < STALL_LOG_EVERY));
    }
    let entry = log.entry(client.peer).or_insert((None, 0));
    entry.1 += 1;
    if entry
        .0
        .is_some_and(|at| now.duration_since(at) < STALL_LOG_EVERY)
    {
        return;
    }
    let peer = client
        .peer
        .map_or_else(|| "?".to_string(), |p| p.to_string());
    tracing::warn!(
        door = client.door,
        %peer,
        model,
        stalled = entry.1,
        "cut a client that took nothing of its stream for {} s ({}) with its buffer full; its requests were cancelled in the engine (count since this peer's last such line, written at most every {} s)",
        client.write_timeout.as_secs(),
        client.timeout_key,
        STALL_LOG_EVERY.as_secs()
    );
    *entry = (Some(now), 0);
}
