//! Dedicated upstream connections for pinned sessions, opened with the client's identity
//! (user, protocol, database, name); and the relay for the modes in which Valkey stops
//! answering one reply per request (RESP2 Pub/Sub, MONITOR).
//!
//! In the relay, requests are still parsed, so the same limits and protocol errors apply,
//! and only the commands those modes allow pass ([`route::allowed_in_relay`]): none of them
//! reads or writes data. Anything else closes the connection with an error, rather than
//! letting data through ungated. What Valkey sends back is read a message at a time: a
//! keyspace notification or a redirected tracking invalidation reports a write, and waits
//! for the journal ([`super::pushes`]). MONITOR's lines (`proxy.allow_monitor`) pass as they
//! come. Valkey's silence is normal there (a subscriber waits for messages), but a Valkey
//! that stops reading is not: each write to it has `upstream.reply_timeout_ms`, as on any
//! other connection.

use super::identity::Identity;
use super::pushes::{self, PushReceiver, PushSender};
use super::route;
use super::Shared;
use crate::net::{read_chunk, room_to_read, ReadHalf, WriteHalf};
use crate::resp::{write, ReplyScanner, Request, RequestParser};
use crate::upstream::client::Conn;
use bytes::{Buf, Bytes, BytesMut};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// Opens the dedicated connection; `Err` is the reply for the client.
pub async fn open(shared: &Shared, id: &Identity) -> Result<Conn, Bytes> {
    let fail = |e: &dyn std::fmt::Display| {
        crate::metrics::UPSTREAM_ERRORS.inc();
        write::error(&format!(
            "ERR walrus: cannot open a dedicated Valkey connection: {}",
            e.to_string().replace(['\r', '\n'], " ")
        ))
    };
    let mut conn = Conn::for_client(shared.pools.upstream(), id.creds.as_ref(), id.resp3)
        .await
        .map_err(|e| fail(&e))?;
    if id.db != 0 {
        conn.expect_ok(write::command([
            b"SELECT".as_slice(),
            id.db.to_string().as_bytes(),
        ]))
        .await
        .map_err(|e| fail(&e))?;
    }
    if let Some(name) = &id.name {
        conn.expect_ok(write::command([b"CLIENT".as_slice(), b"SETNAME", name]))
            .await
            .map_err(|e| fail(&e))?;
    }
    Ok(conn)
}

/// Relays until either side closes. The client's unparsed bytes and parser state carry over.
#[allow(clippy::too_many_arguments)]
pub async fn relay(
    shared: Arc<Shared>,
    conn: Conn,
    first: Request,
    mut rd: ReadHalf,
    mut rbuf: BytesMut,
    mut parser: RequestParser,
    mut wr: WriteHalf,
    mut shutdown: watch::Receiver<bool>,
) {
    crate::metrics::PINNED_SESSIONS.inc();
    count_relayed(&shared, &first);
    let monitor = first.name().eq_ignore_ascii_case(b"monitor");
    let parts = conn.into_parts();
    let (mut up_rd, mut up_wr) = parts.stream.into_split();
    let bound = shared.pools.upstream().reply_timeout;
    let mut up_buf = parts.buf;
    let mut messages = (!monitor).then(|| Messages::new(&shared, parts.scanner));
    let mut out = BytesMut::with_capacity(read_chunk::CLIENT);
    out.extend_from_slice(&first.raw);
    // What goes to the client next.
    let mut down = BytesMut::new();
    let mut reading = true;
    loop {
        // What Valkey sent: MONITOR's lines as they come, messages once they may go.
        match &mut messages {
            None => {
                down.extend_from_slice(&up_buf);
                up_buf.clear();
            }
            Some(m) => {
                if let Err(why) = m.take(&mut up_buf, &mut down) {
                    let _ = wr.send_all(&down).await;
                    let _ = wr.send_all(&why).await;
                    return;
                }
            }
        }
        // Forward every complete request already buffered.
        loop {
            match parser.next(&mut rbuf) {
                Ok(Some(req)) if route::allowed_in_relay(&req) => {
                    count_relayed(&shared, &req);
                    out.extend_from_slice(&req.raw);
                }
                Ok(Some(req)) => {
                    let name = String::from_utf8_lossy(req.name()).replace(['\r', '\n'], " ");
                    to_valkey(&mut up_wr, &out, bound).await;
                    let _ = wr.send_all(&down).await;
                    let msg = format!(
                        "ERR walrus: '{name}' is not allowed on a connection in Pub/Sub, MONITOR or replica mode; \
                         use a separate connection"
                    );
                    let _ = wr.send_all(&write::error(&msg)).await;
                    return;
                }
                Ok(None) => break,
                Err(e) => {
                    // Replies to earlier commands may still be on their way; a client that
                    // breaks the protocol on a pinned connection loses them, as it is closed.
                    crate::metrics::PROTOCOL_ERRORS.inc();
                    let _ = wr.send_all(&down).await;
                    let _ = wr.send_all(&e.reply()).await;
                    return;
                }
            }
        }
        if !out.is_empty() {
            if !to_valkey(&mut up_wr, &out, bound).await {
                break;
            }
            out.clear();
        }
        if !down.is_empty() {
            if wr.send_all(&down).await.is_err() {
                return;
            }
            down.clear();
        }
        room_to_read(&mut rbuf, read_chunk::CLIENT, parser.bytes_wanted());
        room_to_read(&mut up_buf, read_chunk::CLIENT, 0);
        tokio::select! {
            r = up_rd.read_buf(&mut up_buf) => {
                if !matches!(r, Ok(n) if n > 0) {
                    break;
                }
            }
            r = rd.read_buf(&mut rbuf), if reading => {
                if !matches!(r, Ok(n) if n > 0) {
                    return;
                }
                if rbuf.len() > shared.max_query_buffer_bytes {
                    tracing::warn!("closing client that reached max query buffer length ({} bytes)", rbuf.len());
                    return;
                }
            }
            // A held message may go (or never will).
            m = released(&mut messages) => match m {
                Ok(m) => down.extend_from_slice(&m),
                Err(why) => {
                    let _ = wr.send_all(&down).await;
                    let _ = wr.send_all(&why).await;
                    return;
                }
            },
            _ = shutdown.changed(), if reading => reading = false,
        }
    }
    // Valkey closed the dedicated connection (QUIT, or it went away): what it sent goes to
    // the client, a held message once it may.
    let ended = match messages {
        None => {
            down.extend_from_slice(&up_buf);
            Ok(())
        }
        Some(m) => m.finish(&mut up_buf, &mut down).await,
    };
    let _ = wr.send_all(&down).await;
    if let Err(why) = ended {
        let _ = wr.send_all(&why).await;
    }
    let _ = wr.shutdown().await;
}

/// A Pub/Sub relay's messages from Valkey, read a frame at a time and queued for the client
/// as a dedicated connection's pushes are ([`super::pushes`]): a keyspace notification or a
/// redirected tracking invalidation waits for the write it reports, and what follows it
/// waits behind it.
struct Messages {
    scanner: ReplyScanner,
    queue: PushSender,
    released: PushReceiver,
}

impl Messages {
    fn new(shared: &Shared, scanner: ReplyScanner) -> Messages {
        let gate = shared.pools.ctx().durability.as_ref();
        let (queue, released) = pushes::channel(shared.max_push_bytes, gate);
        // The relay's connection was opened just now, in the gate's current epoch.
        let queue = queue.in_epoch(gate.map_or(0, |g| g.epoch()));
        Messages {
            scanner,
            queue,
            released,
        }
    }

    /// Queues the complete messages in `up`, and moves those that may go now to `down`.
    /// `Err`: what the client gets before it is closed.
    fn take(&mut self, up: &mut BytesMut, down: &mut BytesMut) -> Result<(), Bytes> {
        while let Some(n) = self
            .scanner
            .scan(up)
            .map_err(|e| write::error(&format!("ERR walrus: {e}")))?
        {
            // A copy: a message held for the journal must not keep the read buffer alive.
            let frame = Bytes::copy_from_slice(&up[..n]);
            up.advance(n);
            if let Err(queued) = self.queue.send(frame) {
                // Valkey disconnects a subscriber past its output buffer limit too.
                tracing::warn!(
                    "closing a Pub/Sub client: {queued} bytes of messages queued (waiting for the journal), over proxy.max_push_bytes"
                );
                return Err(Bytes::new());
            }
        }
        while let Some(m) = self.released.try_recv() {
            down.extend_from_slice(&m?);
        }
        Ok(())
    }

    /// Valkey closed the connection: every message it sent, each once it may go.
    async fn finish(mut self, up: &mut BytesMut, down: &mut BytesMut) -> Result<(), Bytes> {
        self.take(up, down)?;
        let Messages {
            queue,
            mut released,
            ..
        } = self;
        drop(queue);
        while let Some(m) = released.recv().await {
            down.extend_from_slice(&m?);
        }
        Ok(())
    }
}

/// The next held message of a Pub/Sub relay that may go; never, for MONITOR's.
async fn released(messages: &mut Option<Messages>) -> Result<Bytes, Bytes> {
    match messages.as_mut().map(|m| &mut m.released) {
        // Never `None`: the relay holds the sending end.
        Some(r) => match r.recv().await {
            Some(m) => m,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// Writes `bytes` to Valkey within `bound` (`upstream.reply_timeout_ms`); `false` if they
/// could not be written.
async fn to_valkey(up_wr: &mut WriteHalf, bytes: &[u8], bound: std::time::Duration) -> bool {
    let sent = tokio::time::timeout(bound, up_wr.send_all(bytes)).await;
    matches!(sent, Ok(Ok(())))
}

/// Relayed commands are counted as sent: their replies are not paired with them.
fn count_relayed(shared: &Shared, req: &Request) {
    match shared.table.lookup(&req.args) {
        Some(info) => info.counters.relayed(),
        None => crate::metrics::OTHER_COMMANDS.relayed(),
    }
}
