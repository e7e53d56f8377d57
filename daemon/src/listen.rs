//! TCP listeners with a listen backlog fit for a burst of clients: the
//! daemon's (the gRPC port, the OpenAI door, the metrics endpoint, at
//! [`BACKLOG`]) and bench-cpu's zero-cost engine (at vLLM's 2048).
//!
//! tokio's `TcpListener::bind` asks the kernel for a backlog of 128 (mio
//! 1.2 `TcpListener::bind`, the standard library's value). A thousand
//! clients connecting at once overflowed it: the kernel dropped the
//! handshakes past it, and each of those clients waited out the 1 s SYN
//! retransmit (`bench-cpu --hold 1000`: first token p50 1.1 s through the
//! door against 74 ms on the engine's own port, `ListenOverflows` in
//! `nstat`). vLLM's server (uvicorn 0.55 `Config.backlog`) asks 2048.

use std::io;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpSocket};

/// Asked of `listen(2)`; the kernel caps it at `net.core.somaxconn`
/// (4096 by default since Linux 5.4).
pub const BACKLOG: u32 = 4096;

/// Listens on `address` ("host:port" as the config gives it) with
/// `backlog`, trying each address it resolves to in turn, as
/// `TcpListener::bind` does.
pub async fn bind(address: &str, backlog: u32) -> io::Result<TcpListener> {
    let mut failed = None;
    for addr in tokio::net::lookup_host(address).await? {
        match listen_on(addr, backlog) {
            Ok(listener) => return Ok(listener),
            Err(e) => failed = Some(e),
        }
    }
    Err(failed.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{address} resolves to no address"),
        )
    }))
}

fn listen_on(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As tokio's bind: a restarted daemon rebinds at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backlog the kernel keeps for a listener: `ss` shows it as the
    /// LISTEN socket's Send-Q; /proc/net/tcp does not, so ask the socket.
    fn backlog_of(listener: &TcpListener) -> Option<u32> {
        use std::os::fd::AsRawFd;
        // TCP_INFO's tcpi_sacked holds a listener's backlog (Linux
        // net/ipv4/tcp.c, tcp_get_info: "sk_max_ack_backlog").
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = unsafe {
            libc::getsockopt(
                listener.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        (rc == 0).then_some(info.tcpi_sacked)
    }

    #[tokio::test]
    async fn the_listener_keeps_more_than_tokios_128_waiting_connections() {
        let listener = bind("127.0.0.1:0", BACKLOG).await.expect("bind");
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096);
        assert_eq!(backlog_of(&listener), Some(BACKLOG.min(somaxconn)));
        let plain = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        assert_eq!(
            backlog_of(&plain),
            Some(128.min(somaxconn)),
            "tokio's own, for contrast"
        );
    }

    #[tokio::test]
    async fn an_address_that_is_taken_or_malformed_is_an_error() {
        let held = bind("127.0.0.1:0", BACKLOG).await.expect("bind");
        let taken = held.local_addr().expect("addr").to_string();
        assert!(bind(&taken, BACKLOG).await.is_err());
        assert!(bind("127.0.0.1", BACKLOG).await.is_err(), "no port");
    }
}
