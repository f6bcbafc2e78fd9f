//! Dedicated upstream connections for pinned sessions, opened with the client's identity
//! (user, protocol, database, name); and the byte relay for the modes in which Valkey stops
//! answering one reply per request (RESP2 Pub/Sub, MONITOR, replica handshakes).
//!
//! In the relay, requests are still parsed, so the same limits and protocol errors apply,
//! and only the commands those modes allow pass ([`route::allowed_in_relay`]): none of them
//! reads or writes data, so nothing there needs the durability gate. Anything else closes
//! the connection with an error, rather than letting data through ungated. Valkey's silence
//! is normal there (a subscriber waits for messages), but a Valkey that stops reading is
//! not: each write to it has `upstream.reply_timeout_ms`, as on any other connection.

use super::identity::Identity;
use super::route;
use super::Shared;
use crate::net::{ReadHalf, WriteHalf};
use crate::resp::{write, Request, RequestParser};
use crate::upstream::client::Conn;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

const READ_CHUNK_BYTES: usize = 16 << 10;

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
    let parts = conn.into_parts();
    let (mut up_rd, mut up_wr) = parts.stream.into_split();
    let bound = shared.pools.upstream().reply_timeout;
    let mut up_buf = parts.buf;
    let mut out = BytesMut::with_capacity(READ_CHUNK_BYTES);
    out.extend_from_slice(&first.raw);
    let mut reading = true;
    loop {
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
                    let _ = wr.send_all(&up_buf).await;
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
                    let _ = wr.send_all(&up_buf).await;
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
        if !up_buf.is_empty() {
            if wr.send_all(&up_buf).await.is_err() {
                return;
            }
            up_buf.clear();
        }
        if rbuf.capacity() - rbuf.len() < READ_CHUNK_BYTES / 4 {
            rbuf.reserve(
                parser
                    .bytes_wanted()
                    .saturating_sub(rbuf.len())
                    .max(READ_CHUNK_BYTES),
            );
        }
        if up_buf.capacity() < READ_CHUNK_BYTES / 4 {
            up_buf.reserve(READ_CHUNK_BYTES);
        }
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
            _ = shutdown.changed(), if reading => reading = false,
        }
    }
    // Valkey closed the dedicated connection (QUIT, or it went away): write what it sent.
    let _ = wr.send_all(&up_buf).await;
    let _ = wr.shutdown().await;
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
