//! One stream type for every connection walrus has: TCP, a Unix socket, or TLS over TCP.
//!
//! Both directions of a connection are usually driven apart (the proxy reads a client's
//! requests while it writes earlier replies), so a stream splits into halves. TCP and Unix
//! halves are the kernel's two directions, free of any lock; the TLS halves share the one
//! rustls session behind a mutex that is held only inside a poll, never across an await.
//!
//! The halves also offer the readiness calls the client session is built on (`try_write`,
//! `writable`, `try_read_buf`, `readable`, `peek`). On TLS, a write the socket does not take
//! at once stays encrypted in rustls's buffer: [`WriteHalf::unflushed`] says so, and
//! [`WriteHalf::writable`] pushes it out before it reports room. For the same reason a
//! `write_all` on a stream that may be TLS is followed by `flush`, as with any buffered
//! writer (a no-op on TCP and Unix).

use super::Address;
use bytes::BytesMut;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{tcp, unix, TcpStream, UnixStream};
use tokio_rustls::TlsStream;

type Tls = TlsStream<TcpStream>;

/// A connected stream.
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<Tls>),
}

impl Stream {
    /// Connects to `addr` (TCP with Nagle off: replies are latency-bound).
    pub async fn connect(addr: &Address) -> io::Result<Stream> {
        match addr {
            Address::Tcp(a) => {
                let s = TcpStream::connect(a.as_str()).await?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            Address::Unix(p) => Ok(Stream::Unix(super::unix_connect::connect(p).await?)),
        }
    }

    /// The TCP connection under this stream, if it has one.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s),
            Stream::Unix(_) => None,
            Stream::Tls(s) => Some(s.get_ref().0),
        }
    }

    /// This end's address, as the peer names the connection (`CLIENT KILL ADDR`); none on a
    /// Unix socket, where every client has the same one.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp().and_then(|s| s.local_addr().ok())
    }

    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), WriteHalf::Unix(w))
            }
            Stream::Tls(s) => {
                let shared = Arc::new(Mutex::new(*s));
                (ReadHalf::Tls(shared.clone()), WriteHalf::Tls(shared))
            }
        }
    }
}

/// Polls `f` once, without a task to wake: `Pending` is reported as `WouldBlock`.
fn try_now<T>(f: impl FnOnce(&mut Context<'_>) -> Poll<io::Result<T>>) -> io::Result<T> {
    match f(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(r) => r,
        Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
    }
}

fn lock(s: &Mutex<Tls>) -> std::sync::MutexGuard<'_, Tls> {
    // A poll that panicked left the session as it was between records: usable.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, b),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, b),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write(cx, b),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// The reading half of a [`Stream`].
pub enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
    Tls(Arc<Mutex<Tls>>),
}

impl ReadHalf {
    /// Reads what is there now; `WouldBlock` when nothing is.
    ///
    /// Through `poll_read`, not the sockets' own `try_read_buf`: a read that leaves room in
    /// `buf` found the socket empty, and `poll_read` then forgets the readiness, so the next
    /// call answers `WouldBlock` without a `recv` until the socket shows more (a session's
    /// next read, after each request, would otherwise be a `recv` that finds nothing).
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            ReadHalf::Tcp(r) => try_now(|cx| poll_read_buf(Pin::new(r), cx, buf)),
            ReadHalf::Unix(r) => try_now(|cx| poll_read_buf(Pin::new(r), cx, buf)),
            // rustls may hold decrypted bytes the socket no longer shows: read through it.
            ReadHalf::Tls(s) => try_now(|cx| {
                let mut g = lock(s);
                poll_read_buf(Pin::new(&mut *g), cx, buf)
            }),
        }
    }

    /// Waits until a read may find something (after `try_read_buf` found nothing).
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            ReadHalf::Tcp(r) => r.readable().await,
            ReadHalf::Unix(r) => r.readable().await,
            ReadHalf::Tls(s) => {
                std::future::poll_fn(|cx| lock(s).get_ref().0.poll_read_ready(cx)).await
            }
        }
    }

    /// Waits until the peer sends more or goes away, consuming nothing: `Ok(0)` when it
    /// closed its side. On TLS, what the socket holds is encrypted: any byte counts (a
    /// close_notify too, which the next read turns into the end).
    pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ReadHalf::Tcp(r) => r.peek(buf).await,
            // No peek on a Unix socket in tokio; walrus accepts no client on one.
            ReadHalf::Unix(r) => r.readable().await.map(|_| 1),
            ReadHalf::Tls(s) => {
                std::future::poll_fn(|cx| {
                    let mut rb = ReadBuf::new(buf);
                    lock(s).get_ref().0.poll_peek(cx, &mut rb)
                })
                .await
            }
        }
    }
}

fn poll_read_buf<R: AsyncRead>(
    r: Pin<&mut R>,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    if buf.capacity() == buf.len() {
        buf.reserve(4096);
    }
    let spare = buf.spare_capacity_mut();
    let mut rb = ReadBuf::uninit(spare);
    std::task::ready!(r.poll_read(cx, &mut rb))?;
    let n = rb.filled().len();
    // SAFETY: poll_read initialized the first `n` spare bytes.
    unsafe { buf.set_len(buf.len() + n) };
    Poll::Ready(Ok(n))
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Unix(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Tls(s) => Pin::new(&mut *lock(s)).poll_read(cx, buf),
        }
    }
}

/// The writing half of a [`Stream`].
pub enum WriteHalf {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
    Tls(Arc<Mutex<Tls>>),
}

impl WriteHalf {
    /// Writes what the socket takes now; `WouldBlock` when it takes nothing. On TLS the
    /// bytes may stay encrypted in rustls's buffer: see [`WriteHalf::unflushed`].
    pub fn try_write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            WriteHalf::Tcp(w) => w.try_write(b),
            WriteHalf::Unix(w) => w.try_write(b),
            WriteHalf::Tls(s) => {
                let mut g = lock(s);
                let n = try_now(|cx| Pin::new(&mut *g).poll_write(cx, b))?;
                match try_now(|cx| Pin::new(&mut *g).poll_flush(cx)) {
                    Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
                    _ => Ok(n),
                }
            }
        }
    }

    /// Writes all of `b` and flushes it: what every writer but the client session's
    /// readiness loop uses.
    pub async fn send_all(&mut self, b: &[u8]) -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.write_all(b).await?;
        self.flush().await
    }

    /// Encrypted bytes written to rustls and not yet to the socket.
    pub fn unflushed(&self) -> bool {
        match self {
            WriteHalf::Tls(s) => lock(s).get_ref().1.wants_write(),
            _ => false,
        }
    }

    /// On TLS, queues a close_notify alert and sends what the socket takes now, without
    /// waiting (the connection closes next); nothing on TCP and Unix.
    pub fn close_notify(&mut self) {
        if let WriteHalf::Tls(s) = self {
            let mut g = lock(s);
            g.get_mut().1.send_close_notify();
            let _ = try_now(|cx| Pin::new(&mut *g).poll_flush(cx));
        }
    }

    /// Waits until the socket takes more (on TLS: once rustls's buffer reached it).
    pub async fn writable(&self) -> io::Result<()> {
        match self {
            WriteHalf::Tcp(w) => w.writable().await,
            WriteHalf::Unix(w) => w.writable().await,
            WriteHalf::Tls(s) => {
                std::future::poll_fn(|cx| {
                    let mut g = lock(s);
                    std::task::ready!(Pin::new(&mut *g).poll_flush(cx))?;
                    g.get_ref().0.poll_write_ready(cx)
                })
                .await
            }
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_write(cx, b),
            WriteHalf::Unix(w) => Pin::new(w).poll_write(cx, b),
            WriteHalf::Tls(s) => Pin::new(&mut *lock(s)).poll_write(cx, b),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Unix(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Tls(s) => Pin::new(&mut *lock(s)).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Unix(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Tls(s) => Pin::new(&mut *lock(s)).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
