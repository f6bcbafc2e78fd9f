//! The loopback port Valkey connects to as walrus's replica during a restore, open to that
//! Valkey alone.
//!
//! Valkey replicates over TCP only, so the restore cannot use the Unix socket walrus reaches
//! Valkey on: walrus listens on 127.0.0.1 and sends `REPLICAOF 127.0.0.1 <port>`. Any local
//! process may connect there too, and whoever completes the handshake first would get the
//! whole dataset (and break the restore). So before `REPLICAOF`, walrus sets a random,
//! one-time `masterauth` on Valkey ([`OneTimeAuth`]), which Valkey sends in its handshake
//! (`AUTH [masteruser] <masterauth>`, right after its PING: Valkey's replication.c,
//! `syncWithPrimary`). The listener ([`accept_replica`]) answers a PING before AUTH with
//! `-NOAUTH` (as a primary with a password does, which Valkey's replica accepts), drops any
//! connection that sends anything else before a correct AUTH, and keeps accepting until one
//! authenticates and asks for the stream. Afterwards Valkey's previous `masterauth` is put
//! back.
//!
//! Nor may a stranger hold the restore up: a connection from a user other than Valkey's is
//! dropped before it is answered (when walrus knows Valkey's user: [`OneTimeAuth::set`]); each
//! connection has [`AUTH_TIMEOUT`] from its accept to authenticate, with one PING; and when
//! [`MAX_HANDSHAKES`] are handshaking, the oldest that has not authenticated makes room for
//! the new one, so that silent connections cannot keep Valkey's out.

use crate::net::{ReadHalf, Stream, WriteHalf};
use crate::resp::{Limits, ReplyScanner};
use crate::upstream::client::{frame_str, Conn, UpstreamError};
use crate::upstream::tls::{explain, Side};
use crate::upstream::Upstream;
use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::types::OwnedFrame;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

/// How long a new connection has from its accept to authenticate (its TLS handshake
/// included). Valkey sends its AUTH right after the PING's reply, within milliseconds; a
/// connection slower than this is not Valkey's (one that was is dropped, and Valkey
/// connects again at its next replication cron, a second later).
const AUTH_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections handshaking at once, so that silent ones cannot make walrus hold an
/// unbounded number; the oldest that has not authenticated gives way to a new one.
const MAX_HANDSHAKES: usize = 16;
/// What a connection may send before it authenticated: PING and AUTH are short, and a
/// stranger must not make walrus buffer Valkey-sized frames.
const PRE_AUTH_LIMITS: Limits = Limits {
    max_bulk_bytes: 1024,
    max_array_len: 8,
    max_inline_bytes: 1024,
    max_reply_depth: 2,
    max_reply_bytes: 4096,
};
/// Marks the passwords walrus sets, to recognise one a killed walrus left on Valkey.
const SECRET_PREFIX: &str = "walrus-restore-";

/// The password the restored Valkey presents to the listener, set as its `masterauth`.
pub struct OneTimeAuth {
    /// `None`: Valkey refused the `CONFIG SET` (walrus's user may not run it): the listener
    /// then takes the first connection that completes the handshake.
    secret: Option<Arc<str>>,
    /// Valkey's `masterauth` before, put back by [`OneTimeAuth::restore`].
    previous: String,
    /// The user Valkey runs as, when walrus reaches it on a Unix socket (which tells):
    /// connections from any other user are dropped before they are answered.
    valkey_uid: Option<u32>,
}

impl OneTimeAuth {
    /// Sets a new random `masterauth` on Valkey, remembering the one it had.
    pub async fn set(up: &Upstream) -> Result<OneTimeAuth, UpstreamError> {
        let mut conn = Conn::control(up).await?;
        let valkey_uid = match &conn.stream {
            Stream::Unix(s) => s.peer_cred().ok().map(|c| c.uid()),
            _ => None,
        };
        let mut previous = match conn.call(["CONFIG", "GET", "masterauth"]).await? {
            OwnedFrame::Array(items) if items.len() == 2 => {
                frame_str(&items[1]).unwrap_or_default()
            }
            _ => String::new(),
        };
        if previous.starts_with(SECRET_PREFIX) {
            // Set by a walrus killed during a restore: the value before it is unknown, and
            // this one must not outlive the restore either.
            previous.clear();
        }
        let mut bytes = [0u8; 24];
        getrandom::fill(&mut bytes)
            .map_err(|e| UpstreamError::Io(std::io::Error::other(e.to_string())))?;
        let secret: String = std::iter::once(SECRET_PREFIX.to_string())
            .chain(bytes.iter().map(|b| format!("{b:02x}")))
            .collect();
        match conn.call(["CONFIG", "SET", "masterauth", &secret]).await {
            Ok(_) => Ok(OneTimeAuth {
                secret: Some(secret.into()),
                previous,
                valkey_uid,
            }),
            Err(UpstreamError::Refused(e)) => {
                tracing::warn!(
                    reply = %String::from_utf8_lossy(&e).trim_end(),
                    "restore: Valkey refused CONFIG SET masterauth to walrus's user, so the restore listener cannot tell Valkey from another local process that connects first (and would be sent the dataset); allow walrus's user +config|set"
                );
                Ok(OneTimeAuth {
                    secret: None,
                    previous,
                    valkey_uid,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Puts Valkey's previous `masterauth` back (after the restore, whatever its outcome: a
    /// Valkey left a replica of the listener retries with it, and finds it gone).
    pub async fn restore(self, up: &Upstream) {
        if self.secret.is_none() {
            return;
        }
        let put_back = async {
            Conn::control(up)
                .await?
                .call(["CONFIG", "SET", "masterauth", &self.previous])
                .await
        };
        if let Err(e) = put_back.await {
            tracing::warn!("restore: cannot put Valkey's masterauth back: {e}");
        }
    }
}

/// A connection that authenticated and sent `PSYNC` (or `SYNC`): the restored Valkey.
pub struct Replica {
    pub rd: ReadHalf,
    pub wr: WriteHalf,
    /// What it sent after the PSYNC.
    pub buf: BytesMut,
}

/// Accepts connections on `listener` until one authenticates with `auth`'s password and
/// asks for the stream, handshaking with several at once (a silent one holds up no other);
/// the others are dropped. Within `timeout` (else `TimedOut`).
pub async fn accept_replica(
    listener: &TcpListener,
    auth: &OneTimeAuth,
    tls: Option<TlsAcceptor>,
    timeout: Duration,
) -> std::io::Result<Replica> {
    let deadline = tokio::time::Instant::now() + timeout;
    let local = listener.local_addr()?;
    let mut handshakes = JoinSet::new();
    // Each handshake's abort handle and whether it authenticated, oldest first.
    let mut slots: VecDeque<(tokio::task::AbortHandle, Arc<AtomicBool>)> = VecDeque::new();
    let mut strangers = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (sock, peer) = accepted?;
                slots.retain(|(task, _)| !task.is_finished());
                if slots.len() >= MAX_HANDSHAKES {
                    match slots.iter().position(|(_, authed)| !authed.load(Ordering::Relaxed)) {
                        Some(oldest) => {
                            let (task, _) = slots.remove(oldest).expect("a position in slots");
                            task.abort();
                            tracing::warn!("restore: {MAX_HANDSHAKES} connections to the restore listener are handshaking; dropped the oldest that has not authenticated");
                        }
                        None => {
                            tracing::warn!(%peer, "restore: {MAX_HANDSHAKES} authenticated connections to the restore listener are handshaking; dropped another");
                            continue;
                        }
                    }
                }
                let secret = auth.secret.clone();
                let tls = tls.clone();
                let valkey_uid = auth.valkey_uid;
                let authed = Arc::new(AtomicBool::new(false));
                let flag = authed.clone();
                let task = handshakes.spawn(async move {
                    let served = async {
                        if let Some(uid) = valkey_uid {
                            valkeys_user(local, peer, uid).await?;
                        }
                        let served = handshake(sock, secret, tls, &flag).await;
                        served.map_err(|why| Dropped::Refused(format!("from {peer}: {why}")))
                    };
                    tokio::time::timeout(timeout, served)
                        .await
                        .unwrap_or_else(|_| Err(Dropped::Refused("no PSYNC in time".into())))
                });
                slots.push_back((task, authed));
            }
            Some(done) = handshakes.join_next() => match done {
                // The other handshakes end as the set is dropped.
                Ok(Ok(replica)) => {
                    if strangers > 1 {
                        tracing::warn!("restore: dropped {strangers} connections to the restore listener from users other than Valkey's");
                    }
                    return Ok(replica);
                }
                Ok(Err(Dropped::Stranger(who))) => {
                    strangers += 1;
                    if strangers == 1 {
                        tracing::warn!("restore: dropped a connection to the restore listener from {who}, not Valkey's user; more are counted at the end");
                    }
                }
                Ok(Err(Dropped::Refused(why))) => tracing::warn!("restore: dropped a connection to the restore listener: {why}"),
                Err(e) if e.is_cancelled() => {}
                Err(e) => tracing::warn!("restore: a handshake task failed: {e}"),
            },
            _ = tokio::time::sleep_until(deadline) => {
                return Err(std::io::ErrorKind::TimedOut.into())
            }
        }
    }
}

/// Why a connection to the restore listener was dropped.
enum Dropped {
    /// Another user's (who, as the log says it): counted, not logged one by one.
    Stranger(String),
    Refused(String),
}

/// Whether the connection from `peer` is `uid`'s, Valkey's user's. The kernel's socket
/// table is read on a blocking thread: it may be long, and the accept loop must not wait
/// for it. One that cannot be read lets the connection through: the password still guards
/// the dataset.
async fn valkeys_user(local: SocketAddr, peer: SocketAddr, uid: u32) -> Result<(), Dropped> {
    let found = tokio::task::spawn_blocking(move || crate::net::tcp_peer_uid(local, peer)).await;
    match found {
        Ok(Ok(Some(u))) if u == uid => Ok(()),
        Ok(Ok(Some(u))) => Err(Dropped::Stranger(format!("{peer}, uid {u}"))),
        Ok(Ok(None)) => Err(Dropped::Stranger(format!(
            "{peer}, gone before walrus saw whose"
        ))),
        Ok(Err(e)) => {
            tracing::warn!("restore: cannot read /proc/net/tcp to tell who connected to the restore listener: {e}");
            Ok(())
        }
        Err(e) => Err(Dropped::Refused(format!("from {peer}: {e}"))),
    }
}

/// Answers one connection's replica handshake until its PSYNC (or SYNC); an error says why
/// it is dropped. Before a correct AUTH (when there is a password) one PING is answered,
/// and nothing else; `authed` is set once it authenticated. With `tls` (Valkey's
/// `tls-replication yes`), the TLS handshake comes first, within the time AUTH has.
async fn handshake(
    sock: TcpStream,
    secret: Option<Arc<str>>,
    tls: Option<TlsAcceptor>,
    authed: &AtomicBool,
) -> Result<Replica, String> {
    let auth_by = tokio::time::Instant::now() + AUTH_TIMEOUT;
    let late = || format!("no AUTH within {AUTH_TIMEOUT:?} of connecting");
    sock.set_nodelay(true).map_err(|e| e.to_string())?;
    let stream = match tls {
        None => Stream::Tcp(sock),
        Some(acceptor) => match tokio::time::timeout_at(auth_by, acceptor.accept(sock)).await {
            Err(_) => return Err(late()),
            Ok(Err(e)) => {
                return Err(format!(
                    "TLS handshake (Valkey has tls-replication yes): {}",
                    explain(&e, Side::Server)
                ))
            }
            Ok(Ok(s)) => Stream::Tls(Box::new(s.into())),
        },
    };
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = BytesMut::with_capacity(4096);
    let mut authenticated = secret.is_none();
    authed.store(authenticated, Ordering::Relaxed);
    let mut pinged = false;
    loop {
        let args = if authenticated {
            read_command(&mut rd, &mut buf, Limits::default()).await
        } else {
            let read = read_command(&mut rd, &mut buf, PRE_AUTH_LIMITS);
            tokio::time::timeout_at(auth_by, read)
                .await
                .map_err(|_| late())?
        }
        .map_err(|e| e.to_string())?;
        let name = args
            .first()
            .map(|a| a.to_ascii_uppercase())
            .unwrap_or_default();
        let reply: &[u8] = match (&name[..], authenticated) {
            (b"PSYNC" | b"SYNC", true) => return Ok(Replica { rd, wr, buf }),
            (b"PING", true) => b"+PONG\r\n",
            // What a primary with a password answers; Valkey's replica goes on to its AUTH.
            (b"PING", false) if !pinged => {
                pinged = true;
                b"-NOAUTH Authentication required.\r\n"
            }
            // AUTH [masteruser] <masterauth>: the password alone is walrus's to check.
            (b"AUTH", _) if (2..=3).contains(&args.len()) => {
                let given = args.last().expect("2 or 3 arguments");
                match &secret {
                    Some(s) if !bool::from(given.as_ref().ct_eq(s.as_bytes())) => {
                        return Err("AUTH with a wrong password".into())
                    }
                    _ => {
                        authenticated = true;
                        authed.store(true, Ordering::Relaxed);
                        b"+OK\r\n"
                    }
                }
            }
            // REPLCONF listening-port, capa, ip-address, version.
            (b"REPLCONF", true) => b"+OK\r\n",
            (_, false) => return Err(format!("{} before AUTH", String::from_utf8_lossy(&name))),
            (_, true) => b"-ERR walrus restore: unexpected command\r\n",
        };
        wr.send_all(reply).await.map_err(|e| e.to_string())?;
    }
}

/// Reads one command (a RESP array of bulk strings) from Valkey; a frame of another shape is
/// `InvalidData`, the connection's end `UnexpectedEof`.
pub(super) async fn read_command(
    rd: &mut ReadHalf,
    buf: &mut BytesMut,
    limits: Limits,
) -> std::io::Result<Vec<Bytes>> {
    let mut scanner = ReplyScanner::new(limits);
    loop {
        // A bare newline is a keepalive.
        while buf.first() == Some(&b'\n') {
            let _ = buf.split_to(1);
        }
        if let Some(n) = scanner
            .scan(buf)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?
        {
            let frame = buf.split_to(n);
            return match redis_protocol::resp2::decode::decode(&frame) {
                Ok(Some((redis_protocol::resp2::types::OwnedFrame::Array(items), _))) => Ok(items
                    .into_iter()
                    .map(|f| match f {
                        redis_protocol::resp2::types::OwnedFrame::BulkString(b) => Bytes::from(b),
                        _ => Bytes::new(),
                    })
                    .collect()),
                _ => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("unexpected frame {:?}", String::from_utf8_lossy(&frame)),
                )),
            };
        }
        if rd.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

#[cfg(test)]
#[path = "listener_tests.rs"]
mod tests;
