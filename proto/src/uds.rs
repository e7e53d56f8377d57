//! The unix-socket stream under the engine contract's gRPC (daemon to
//! worker), registered for readability only.
//!
//! Linux wakes the writer of an `AF_UNIX` stream every time the reader
//! frees what it read (`sock_wfree` calls `unix_write_space`, which wakes
//! `EPOLLOUT` waiters whenever the socket is writable: net/unix/af_unix.c),
//! and tokio registers every `UnixStream` for writability too. So each
//! token a worker sent woke it a second time, for nothing, when the daemon
//! read it: a context switch per token (bench/cpu, docs/PERFORMANCE.md).
//! This stream writes straight to the socket and asks for writability only
//! while a write is waiting for room: then a duplicate of the descriptor is
//! registered for `EPOLLOUT` alone, and dropped once the write went through.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// See the module doc.
pub struct QuietUnixStream {
    read: AsyncFd<StdUnixStream>,
    /// Registered for writability while a write waits for room.
    waiting_write: Option<AsyncFd<OwnedFd>>,
}

impl QuietUnixStream {
    /// Takes over a connected tokio stream.
    pub fn new(stream: tokio::net::UnixStream) -> io::Result<QuietUnixStream> {
        // `into_std` leaves the socket non-blocking.
        let stream = stream.into_std()?;
        Ok(QuietUnixStream {
            read: register(stream, Interest::READABLE)?,
            waiting_write: None,
        })
    }

    /// Connects to the socket at `path`.
    pub async fn connect(path: &std::path::Path) -> io::Result<QuietUnixStream> {
        QuietUnixStream::new(tokio::net::UnixStream::connect(path).await?)
    }

    /// Waits until the socket has room again; `Ready(Ok)` means try again.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.waiting_write.is_none() {
            let fd = self.read.get_ref().as_fd().try_clone_to_owned()?;
            // Registering reports the current state too: room that came
            // between the refused write and now is not missed.
            self.waiting_write = Some(register(fd, Interest::WRITABLE)?);
        }
        let Some(waiting) = self.waiting_write.as_ref() else {
            return Poll::Ready(Ok(()));
        };
        let mut guard = ready!(waiting.poll_write_ready(cx))?;
        guard.clear_ready();
        Poll::Ready(Ok(()))
    }

    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(&StdUnixStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            match write(self.read.get_ref()) {
                Ok(n) => {
                    self.waiting_write = None;
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.poll_room(cx))?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Registers an owned descriptor with the runtime.
fn register<T: std::os::fd::AsRawFd>(inner: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    // SAFETY: `T` (a std socket or an `OwnedFd`) owns its descriptor,
    // which stays open and the same for as long as the `AsyncFd` holds it.
    Ok(unsafe { AsyncFd::register_with_interest(inner, interest) }?)
}

impl AsyncRead for QuietUnixStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.read.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|s| (&mut s.get_ref()).read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // Not readable after all: readiness cleared, wait again.
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for QuietUnixStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_with(cx, |mut s: &StdUnixStream| s.write(data))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_with(cx, |mut s: &StdUnixStream| s.write_vectored(data))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.read.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

impl tonic::transport::server::Connected for QuietUnixStream {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// The accepted connections of `listener`, as quiet streams.
pub fn incoming(
    listener: tokio::net::UnixListener,
) -> impl tokio_stream::Stream<Item = io::Result<QuietUnixStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::UnixListenerStream::new(listener)
        .map(|accepted| accepted.and_then(QuietUnixStream::new))
}

/// Connects a tonic channel to the unix socket at `path` (the control
/// socket, a worker's socket), over a [`QuietUnixStream`]. The URI is a
/// placeholder that tonic requires; the connector ignores it.
pub async fn channel(
    path: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let socket = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                let stream = QuietUnixStream::connect(&socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// More than the socket buffer holds, both ways at once: writes that
    /// wait for room are woken when the reader drains it.
    #[tokio::test]
    async fn a_full_socket_waits_for_room_and_loses_nothing() {
        let (a, b) = tokio::net::UnixStream::pair().expect("pair");
        let (mut a, mut b) = (
            QuietUnixStream::new(a).expect("a"),
            QuietUnixStream::new(b).expect("b"),
        );
        let data: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            a.write_all(&sent).await.expect("write");
            a.shutdown().await.expect("shutdown");
            a
        });
        // Let the writer fill the buffer and wait before reading.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.expect("read");
        assert_eq!(got.len(), data.len());
        assert!(got == data, "the bytes arrived changed");
        writer.await.expect("writer");
    }
}
