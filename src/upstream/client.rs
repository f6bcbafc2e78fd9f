//! A connection to Valkey opened by walrus: connect (TCP or Unix socket, TLS over TCP with
//! `[upstream.tls]`) with a timeout, `AUTH`, optional
//! `HELLO 3`, `SELECT`, then either a simple request/response control client ([`Conn::call`],
//! decoding with the redis-protocol crate) or the bare socket handed to the proxy.
//!
//! Every exchange with Valkey has a bound, and this type owns it, from the [`Upstream`] the
//! connection was opened with, so that no path can forget it:
//! - `upstream.connect_timeout_ms` bounds opening a connection as a whole: the connect, the
//!   TLS handshake and the commands that set it up ([`Conn::control`]'s AUTH,
//!   [`Conn::for_client`]'s AUTH, CLIENT ID, RESET and HELLO);
//! - `upstream.reply_timeout_ms` bounds every wait on an open connection: each write, each
//!   reply, and each piece of a transfer ([`Conn::read_more`]), so that a bulk transfer (an
//!   RDB Valkey sends) is bounded by its progress, not by its total (Valkey sends a newline
//!   a second while it prepares one). The proxy's pipelined connections, which take the
//!   socket over ([`Conn::into_parts`]), apply the same setting to the replies they owe.
//!
//! A stopped or partitioned Valkey therefore costs whoever waits for it an error within
//! these bounds ([`UpstreamError::ConnectTimeout`], [`UpstreamError::NoReply`]), never a
//! hang.

pub use super::error::UpstreamError;
use super::tls::{explain, is_tls_error, Side};
use super::Upstream;
use crate::config::Credentials;
use crate::net::{Address, Stream};
use crate::resp::{write, ReplyScanner};
use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::types::OwnedFrame;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An open connection to Valkey with its read buffer.
pub struct Conn {
    pub stream: Stream,
    pub buf: BytesMut,
    scanner: ReplyScanner,
    /// Valkey's address on a TLS connection: TLS 1.3 reports a refused client certificate
    /// only at the first read, which then names the address as a handshake failure would.
    tls_addr: Option<String>,
    /// Valkey's reply to `CLIENT ID` on a connection that acts for a client
    /// ([`Conn::for_client`]): how walrus names it in `CLIENT KILL`.
    pub client_id: Option<Bytes>,
    /// How long any read or write may wait for Valkey (`upstream.reply_timeout_ms`).
    reply_timeout: Duration,
}

impl Conn {
    /// Connects without authenticating; with `[upstream.tls]`, the TLS handshake is within
    /// the same `upstream.connect_timeout_ms`.
    pub async fn connect(up: &Upstream) -> Result<Conn, UpstreamError> {
        let addr = Address::parse(&up.address);
        let open = async {
            let stream = Stream::connect(&addr)
                .await
                .map_err(|source| UpstreamError::Connect {
                    addr: up.address.clone(),
                    source,
                })?;
            match (&up.tls, stream) {
                (None, s) => Ok(s),
                (Some(tls), Stream::Tcp(tcp)) => tls.connect(tcp, &up.address).await,
                // The configuration refuses it (validate.rs); this is the guard behind it.
                (Some(_), _) => Err(UpstreamError::Unsupported(format!(
                    "upstream.tls over the Unix socket {}: TLS is for TCP addresses",
                    up.address
                ))),
            }
        };
        let stream = match tokio::time::timeout(up.connect_timeout, open).await {
            Err(_) => return Err(UpstreamError::ConnectTimeout(up.address.clone())),
            Ok(r) => r?,
        };
        let tls_addr = matches!(stream, Stream::Tls(_)).then(|| up.address.clone());
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(16 << 10),
            scanner: ReplyScanner::new(up.limits),
            tls_addr,
            client_id: None,
            reply_timeout: up.reply_timeout,
        })
    }

    /// Connects as walrus itself, with the configured credentials. The replies are to
    /// walrus's own commands (the command table, INFO, ROLE), not to clients': the limits
    /// that protect walrus from a client's reply do not apply to them.
    /// The AUTH is part of opening it, within `upstream.connect_timeout_ms`.
    pub async fn control(up: &Upstream) -> Result<Conn, UpstreamError> {
        opening(up, async {
            let mut conn = Conn::connect(up).await?;
            conn.scanner = ReplyScanner::new(crate::resp::Limits::default());
            if let Some(c) = &up.credentials {
                conn.auth(c).await?;
            }
            Ok(conn)
        })
        .await
    }

    /// Opens a connection that acts for a client: authenticated as the client's user (not as
    /// walrus), in the client's protocol. If Valkey refuses `HELLO 3` because the connection
    /// is not authenticated, the connection stays as it is: Valkey will answer that client's
    /// commands with the same `-NOAUTH` it would have sent directly.
    ///
    /// First, while the connection is still walrus's own, it asks Valkey's `CLIENT ID` for
    /// it (kept in [`Conn::client_id`]): should walrus drop the connection itself, Valkey
    /// must close it first, by a name that is its alone, and a client's user may not be
    /// allowed `CLIENT ID`. Then the client's `AUTH`, or `RESET` back to the default user, as
    /// a new connection has it. One write, so no more round trips than the `AUTH` alone.
    /// All of it within `upstream.connect_timeout_ms`. (Valkey answers each of these commands
    /// while a script keeps it busy: they are flagged `allow_busy`.)
    pub async fn for_client(
        up: &Upstream,
        creds: Option<&Credentials>,
        resp3: bool,
    ) -> Result<Conn, UpstreamError> {
        opening(up, Conn::set_up_for_client(up, creds, resp3)).await
    }

    async fn set_up_for_client(
        up: &Upstream,
        creds: Option<&Credentials>,
        resp3: bool,
    ) -> Result<Conn, UpstreamError> {
        let mut conn = Conn::connect(up).await?;
        let mut batch = Vec::new();
        if let Some(walrus) = &up.credentials {
            batch.extend_from_slice(&auth_command(walrus));
        }
        batch.extend_from_slice(&write::command(["CLIENT", "ID"]));
        let then = match (creds, &up.credentials) {
            (Some(c), _) => Some(auth_command(c)),
            (None, Some(_)) => Some(write::command(["RESET"])),
            (None, None) => None,
        };
        if let Some(cmd) = &then {
            batch.extend_from_slice(cmd);
        }
        conn.stream_write(&batch).await?;
        if up.credentials.is_some() {
            // Refused, CLIENT ID's reply says so too (and the connection is not walrus's).
            conn.read_frame().await?;
        }
        conn.client_id = Some(conn.read_frame().await?);
        if then.is_some() {
            // The connection must not stay walrus's: any refusal ends it.
            let reply = conn.read_frame().await?;
            if reply.first() == Some(&b'-') {
                return Err(UpstreamError::Refused(reply));
            }
        }
        if resp3 {
            match conn.expect_ok(write::command(["HELLO", "3"])).await {
                Err(UpstreamError::Refused(e)) if e.starts_with(b"-NOAUTH") => {}
                r => r?,
            }
        }
        Ok(conn)
    }

    /// `AUTH [user] password`; Valkey's error reply is returned as [`UpstreamError::Refused`].
    pub async fn auth(&mut self, c: &Credentials) -> Result<(), UpstreamError> {
        self.expect_ok(auth_command(c)).await
    }

    /// Writes bytes without reading a reply, within `upstream.reply_timeout_ms` (a Valkey
    /// that stopped reading fills the socket's buffers).
    pub async fn stream_write(&mut self, bytes: &[u8]) -> Result<(), UpstreamError> {
        let written = async {
            self.stream.write_all(bytes).await?;
            self.stream.flush().await
        };
        match tokio::time::timeout(self.reply_timeout, written).await {
            Err(_) => Err(UpstreamError::NoReply(self.reply_timeout)),
            Ok(r) => r.map_err(|e| self.io_error(e)),
        }
    }

    /// An I/O error, or on TLS the peer's alert or certificate problem behind it, explained.
    fn io_error(&self, e: std::io::Error) -> UpstreamError {
        match &self.tls_addr {
            Some(addr) if is_tls_error(&e) => UpstreamError::Tls {
                addr: addr.clone(),
                problem: explain(&e, Side::Client(None)),
            },
            _ => UpstreamError::Io(e),
        }
    }

    /// Sends one command and returns its raw reply, error replies included.
    pub async fn call_raw(&mut self, cmd: &[u8]) -> Result<Bytes, UpstreamError> {
        self.stream_write(cmd).await?;
        self.read_frame().await
    }

    /// Sends a command and checks for a non-error reply.
    pub async fn expect_ok(&mut self, cmd: Bytes) -> Result<(), UpstreamError> {
        let reply = self.call_raw(&cmd).await?;
        if reply.first() == Some(&b'-') {
            return Err(UpstreamError::Refused(reply));
        }
        Ok(())
    }

    /// Sends a command and decodes its RESP2 reply; an error reply becomes `Refused`.
    pub async fn call<I: IntoIterator<Item = A>, A: AsRef<[u8]>>(
        &mut self,
        args: I,
    ) -> Result<OwnedFrame, UpstreamError> {
        let reply = self.call_raw(&write::command(args)).await?;
        if reply.first() == Some(&b'-') {
            return Err(UpstreamError::Refused(reply));
        }
        decode_reply(&reply)
    }

    /// The socket, unread bytes and scanner state, for a proxy task to take over.
    pub fn into_parts(self) -> ConnParts {
        ConnParts {
            stream: self.stream,
            buf: self.buf,
            scanner: self.scanner,
            client_id: self.client_id,
        }
    }

    /// Reads exactly one complete reply frame.
    pub async fn read_frame(&mut self) -> Result<Bytes, UpstreamError> {
        loop {
            if let Some(n) = self.scanner.scan(&self.buf)? {
                return Ok(self.buf.split_to(n).freeze());
            }
            self.read_more().await?;
        }
    }

    /// Reads what Valkey sends next into [`Conn::buf`]: the one way this connection reads,
    /// whatever it reads (replies, status lines, an RDB), each read within
    /// `upstream.reply_timeout_ms`. `Closed` at the end of the stream.
    pub async fn read_more(&mut self) -> Result<(), UpstreamError> {
        let read = tokio::time::timeout(self.reply_timeout, self.stream.read_buf(&mut self.buf))
            .await
            .map_err(|_| UpstreamError::NoReply(self.reply_timeout))?;
        if read.map_err(|e| self.io_error(e))? == 0 {
            return Err(UpstreamError::Closed);
        }
        Ok(())
    }
}

/// Opens a connection with `open` (connect, then its set-up commands), within
/// `upstream.connect_timeout_ms` as a whole.
async fn opening(
    up: &Upstream,
    open: impl std::future::Future<Output = Result<Conn, UpstreamError>>,
) -> Result<Conn, UpstreamError> {
    tokio::time::timeout(up.connect_timeout, open)
        .await
        .unwrap_or_else(|_| Err(UpstreamError::ConnectTimeout(up.address.clone())))
}

pub struct ConnParts {
    pub stream: Stream,
    pub buf: BytesMut,
    pub scanner: ReplyScanner,
    pub client_id: Option<Bytes>,
}

/// `AUTH [user] password`.
pub fn auth_command(c: &Credentials) -> Bytes {
    match &c.username {
        Some(u) => write::command([b"AUTH".as_slice(), u.as_bytes(), c.password.as_bytes()]),
        None => write::command([b"AUTH".as_slice(), c.password.as_bytes()]),
    }
}

/// Decodes one whole RESP2 reply, as [`Conn::read_frame`] delimited it, into values.
pub fn decode_reply(reply: &[u8]) -> Result<OwnedFrame, UpstreamError> {
    match redis_protocol::resp2::decode::decode(reply) {
        Ok(Some((frame, _))) => Ok(frame),
        Ok(None) => Err(UpstreamError::Decode("incomplete frame".into())),
        Err(e) => Err(UpstreamError::Decode(e.to_string())),
    }
}

/// Helpers to read decoded control-plane replies.
pub fn frame_str(f: &OwnedFrame) -> Option<String> {
    match f {
        OwnedFrame::BulkString(b) | OwnedFrame::SimpleString(b) => {
            Some(String::from_utf8_lossy(b).into_owned())
        }
        _ => None,
    }
}

pub fn frame_int(f: &OwnedFrame) -> Option<i64> {
    match f {
        OwnedFrame::Integer(i) => Some(*i),
        OwnedFrame::BulkString(b) | OwnedFrame::SimpleString(b) => {
            std::str::from_utf8(b).ok()?.parse().ok()
        }
        _ => None,
    }
}
