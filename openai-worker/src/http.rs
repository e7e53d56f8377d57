//! A small HTTP/1.1 client towards the engine on loopback, over hyper's
//! connection API, and the SSE framing of its streamed answers.
//!
//! Every request gets its own connection, owned by the returned
//! [`Response`]: dropping it closes the socket. That is how a cancelled
//! Generate call reaches the engine: vLLM and llama-server abort a request
//! whose client disconnects, and a pooled connection kept alive would hide
//! the disconnect. Loopback connects cost microseconds, far below a token.
//!
//! The connection has no task of its own: whoever reads the body drives it
//! (`Response::poll_chunk`), so a token that arrives wakes one task, the
//! one that relays it, instead of a connection task that hands it on.

use http_body_util::Full;
use hyper::body::Body as _;
use hyper::body::{Bytes, Incoming};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;

/// hyper's half of one connection: reads and writes the socket when
/// polled; dropping it closes the socket.
type Connection = hyper::client::conn::http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// Bodies of non-streamed answers (`/metrics`, `/v1/models`, errors) are
/// read up to this size; more means the engine is not what we think it is.
const MAX_BODY: usize = 8 << 20;

/// What went wrong talking to the engine.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Nothing listens on the port (yet), or the connection broke.
    #[error("cannot reach the engine at 127.0.0.1:{port}{path}: {source}")]
    Connect {
        /// The engine's port.
        port: u16,
        /// The request path.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("HTTP exchange with the engine on {path} failed: {source}")]
    Exchange {
        /// The request path.
        path: String,
        /// What failed.
        source: hyper::Error,
    },
    /// The answer did not come within the time allowed.
    #[error("the engine did not answer {path} within {timeout:?}")]
    Timeout {
        /// The request path.
        path: String,
        /// The time allowed.
        timeout: Duration,
    },
    /// The body was larger than [`MAX_BODY`].
    #[error("the engine's answer to {path} is larger than {MAX_BODY} bytes")]
    TooLarge {
        /// The request path.
        path: String,
    },
}

/// An answer whose body is read as it arrives, holding its connection
/// (dropping the answer closes the socket).
pub struct Response {
    /// The status code.
    pub status: StatusCode,
    body: Incoming,
    /// `None` once hyper is done with it.
    connection: Option<Connection>,
    /// How the connection ended, if it failed: said when the body has
    /// nothing more to give.
    broken: Option<hyper::Error>,
}

/// Polls the connection, which moves bytes between the socket and the
/// body; drops it (closing the socket) once it is done, keeping its error.
fn drive(
    connection: &mut Option<Connection>,
    broken: &mut Option<hyper::Error>,
    cx: &mut Context<'_>,
) {
    if let Some(conn) = connection {
        if let Poll::Ready(outcome) = Pin::new(conn).poll(cx) {
            // Dropping hyper's dispatcher hands an unfinished body an
            // "incomplete" error, so the body never waits on a dead socket.
            *connection = None;
            if let Err(e) = outcome {
                *broken = Some(e);
            }
        }
    }
}

impl Response {
    /// The next piece of the body; `None` at its end. Drives the
    /// connection, so whichever task polls this is woken by the socket.
    pub fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, hyper::Error>>> {
        drive(&mut self.connection, &mut self.broken, cx);
        loop {
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => return Poll::Ready(Some(Ok(data))),
                    Err(_) => continue, // trailers
                },
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Some(Err(self.broken.take().unwrap_or(e))))
                }
                Poll::Ready(None) => return Poll::Ready(self.broken.take().map(Err)),
                Poll::Pending if self.connection.is_none() => {
                    // Nothing drives the body any more: its end (or the
                    // connection's error) is all there is.
                    return Poll::Ready(self.broken.take().map(Err));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The next piece of the body; `None` at its end.
    pub async fn chunk(&mut self) -> Option<Result<Bytes, hyper::Error>> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }

    /// The whole body (bounded), for answers that are not streamed.
    pub async fn text(mut self, path: &str) -> Result<String, HttpError> {
        let mut out = Vec::new();
        while let Some(chunk) = self.chunk().await {
            let chunk = chunk.map_err(|source| HttpError::Exchange {
                path: path.to_string(),
                source,
            })?;
            if out.len() + chunk.len() > MAX_BODY {
                return Err(HttpError::TooLarge {
                    path: path.to_string(),
                });
            }
            out.extend_from_slice(&chunk);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// The engine's API key, when its environment (which it inherits from the
/// worker) sets one: vLLM then refuses every `/v1` call without it
/// (`VLLM_API_KEY`, vllm `entrypoints/openai/api_server.py`), and
/// llama-server every call (`LLAMA_API_KEY`, its `--api-key`). Read once;
/// never logged.
fn engine_bearer() -> Option<&'static hyper::header::HeaderValue> {
    static BEARER: std::sync::OnceLock<Option<hyper::header::HeaderValue>> =
        std::sync::OnceLock::new();
    BEARER
        .get_or_init(|| {
            ["VLLM_API_KEY", "LLAMA_API_KEY"]
                .iter()
                .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
                .and_then(|key| {
                    let mut value =
                        hyper::header::HeaderValue::from_str(&format!("Bearer {key}")).ok()?;
                    value.set_sensitive(true);
                    Some(value)
                })
        })
        .as_ref()
}

/// Sends one request to `127.0.0.1:port` and returns once the answer's
/// head has arrived (for a streamed answer, before its body).
pub async fn send(
    port: u16,
    method: hyper::Method,
    path: &str,
    json: Option<Vec<u8>>,
) -> Result<Response, HttpError> {
    send_with(port, method, path, json, &[]).await
}

/// [`send`] with more headers (a request's W3C trace context).
pub async fn send_with(
    port: u16,
    method: hyper::Method,
    path: &str,
    json: Option<Vec<u8>>,
    headers: &[(&'static str, String)],
) -> Result<Response, HttpError> {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|source| HttpError::Connect {
            port,
            path: path.to_string(),
            source,
        })?;
    // Tokens are small writes; do not hold them back.
    let _ = stream.set_nodelay(true);
    let exchange = |source| HttpError::Exchange {
        path: path.to_string(),
        source,
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(exchange)?;
    let mut connection = Some(conn);
    let mut broken = None;
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, format!("127.0.0.1:{port}"));
    if let Some(bearer) = engine_bearer() {
        request = request.header(hyper::header::AUTHORIZATION, bearer);
    }
    if json.is_some() {
        request = request.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let request = request
        .body(Full::new(Bytes::from(json.unwrap_or_default())))
        .map_err(|e| HttpError::Connect {
            port,
            path: path.to_string(),
            source: std::io::Error::other(e),
        })?;
    // The connection writes the request and reads the head while this
    // waits; a connection that ends first drops the request, which then
    // fails.
    let mut answer = std::pin::pin!(sender.send_request(request));
    let answer = std::future::poll_fn(|cx| {
        drive(&mut connection, &mut broken, cx);
        answer.as_mut().poll(cx)
    })
    .await;
    let (head, body) = match answer {
        Ok(a) => a.into_parts(),
        Err(e) => return Err(exchange(broken.unwrap_or(e))),
    };
    Ok(Response {
        status: head.status,
        body,
        connection,
        broken,
    })
}

/// GET `path` and read the whole answer within `timeout`.
pub async fn get(
    port: u16,
    path: &str,
    timeout: Duration,
) -> Result<(StatusCode, String), HttpError> {
    let exchange = async {
        let response = send(port, hyper::Method::GET, path, None).await?;
        let status = response.status;
        Ok((status, response.text(path).await?))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| HttpError::Timeout {
            path: path.to_string(),
            timeout,
        })?
}

/// Server-sent events, split from a body that arrives in arbitrary pieces.
///
/// Lines end with `\n` (a `\r` before it is dropped); `data:` lines are
/// joined with `\n` until a blank line ends the event; comments (`:`) and
/// other fields are ignored. Only the framing: the JSON inside is the
/// caller's.
#[derive(Debug, Default)]
pub struct SseSplitter {
    line: Vec<u8>,
    data: Option<String>,
}

/// One whole line (without its `\n`): a blank line ends the event being
/// built, a `data:` line adds to it.
fn take_line(data: &mut Option<String>, line: &[u8], events: &mut Vec<String>) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        if let Some(done) = data.take() {
            events.push(done);
        }
    } else if let Some(value) = line.strip_prefix(b"data:") {
        let value = value.strip_prefix(b" ").unwrap_or(value);
        let value = String::from_utf8_lossy(value);
        match data {
            Some(d) => {
                d.push('\n');
                d.push_str(&value);
            }
            None => *data = Some(value.into_owned()),
        }
    }
}

/// A line longer than this is not SSE from a sane engine.
const MAX_SSE_LINE: usize = 16 << 20;

impl SseSplitter {
    /// Feeds a piece of the body; returns the events it completed. Whole
    /// lines inside the piece are read in place; only a line cut by the
    /// piece's end is kept for the next.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<Vec<String>, String> {
        let mut events = Vec::new();
        while !bytes.is_empty() {
            let end = bytes.iter().position(|b| *b == b'\n');
            let piece = &bytes[..end.unwrap_or(bytes.len())];
            if self.line.len() + piece.len() > MAX_SSE_LINE {
                return Err(format!(
                    "the engine sent a stream line longer than {MAX_SSE_LINE} bytes"
                ));
            }
            let Some(end) = end else {
                self.line.extend_from_slice(piece);
                break;
            };
            bytes = &bytes[end + 1..];
            if self.line.is_empty() {
                take_line(&mut self.data, piece, &mut events);
            } else {
                self.line.extend_from_slice(piece);
                take_line(&mut self.data, &self.line, &mut events);
                self.line.clear();
            }
        }
        Ok(events)
    }

    /// The event left when the body ended without its blank line.
    pub fn finish(&mut self) -> Option<String> {
        if !self.line.is_empty() {
            let _ = self.feed(b"\n");
        }
        self.data.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_pieces_come_out_whole() {
        let mut s = SseSplitter::default();
        let body =
            b"data: {\"a\":1}\r\n\r\ndata: {\"b\":\r\ndata: 2}\n\n: keep-alive\n\ndata: [DONE]\n\n";
        let mut events = Vec::new();
        for piece in body.chunks(3) {
            events.extend(s.feed(piece).unwrap());
        }
        assert_eq!(events, ["{\"a\":1}", "{\"b\":\n2}", "[DONE]"]);
        assert_eq!(s.finish(), None);
        // The same body in one piece, as a fast engine's reads bring it.
        let mut s = SseSplitter::default();
        assert_eq!(s.feed(body).unwrap(), events);
    }

    #[test]
    fn an_event_cut_off_by_the_end_of_the_body_is_kept() {
        let mut s = SseSplitter::default();
        assert!(s.feed(b"data: {\"x\":1}").unwrap().is_empty());
        assert_eq!(s.finish().as_deref(), Some("{\"x\":1}"));
    }
}
