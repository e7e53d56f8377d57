//! An accepted connection with facts about it attached. tonic copies a
//! connection's [`Connected::ConnectInfo`] into every request's extensions,
//! so what is learnt once at accept time (the peer's credentials on the
//! control socket, the stream counter of a public connection) reaches each
//! handler through `request.extensions()`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// A stream `io` carrying `info` for every request made over it.
pub struct Tagged<IO, Info> {
    /// The accepted socket.
    io: IO,
    /// Cloned into each request's extensions.
    info: Info,
}

impl<IO, Info> Tagged<IO, Info> {
    /// Attach `info` to `io`.
    pub fn new(io: IO, info: Info) -> Self {
        Tagged { io, info }
    }
}

impl<IO, Info> Connected for Tagged<IO, Info>
where
    Info: Clone + Send + Sync + 'static,
{
    type ConnectInfo = Info;

    fn connect_info(&self) -> Info {
        self.info.clone()
    }
}

impl<IO: AsyncRead + Unpin, Info: Unpin> AsyncRead for Tagged<IO, Info> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin, Info: Unpin> AsyncWrite for Tagged<IO, Info> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
