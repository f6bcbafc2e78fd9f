//! One pipelined upstream connection of the shared pool.
//!
//! Requests from many client sessions arrive on a channel; the writer half takes whatever is
//! queued, writes it in one batch, and records for each request whom its reply belongs to;
//! the reader half delimits replies and hands each to its requester, in order (Valkey answers
//! a connection's commands in the order it received them). A request carries its client's
//! database: when it differs from the connection's, a `SELECT` goes first and its reply is
//! swallowed.
//!
//! If the connection breaks, every request in flight on it, and every one still queued for
//! it, is dropped; the requester sees its reply channel close and answers its client with an
//! error. Nothing is retried: a write's outcome is unknown once its connection is gone.

use crate::resp::{write, ReplyScanner};
use crate::upstream::client::{Conn, UpstreamError};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};

/// A client command on its way upstream.
#[derive(Debug)]
pub struct PipelinedRequest {
    /// The client's selected database.
    pub db: u32,
    /// The encoded command.
    pub cmd: Bytes,
    /// Where its reply goes.
    pub reply: oneshot::Sender<Bytes>,
}

/// Most bytes gathered into one write; a larger command is written on its own.
const BATCH_BYTES_MAX: usize = 256 << 10;
/// Read buffer growth step.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// What the reader does with the next reply.
enum Inflight {
    Client(oneshot::Sender<Bytes>),
    /// walrus's own `SELECT`: check and drop.
    Select,
}

/// Runs the connection until it breaks or `requests` closes.
pub async fn run(
    conn: Conn,
    requests: mpsc::Receiver<PipelinedRequest>,
) -> Result<(), UpstreamError> {
    let crate::upstream::client::ConnParts {
        stream,
        buf,
        scanner,
    } = conn.into_parts();
    let (rd, wr) = stream.into_split();
    let (inflight_tx, inflight_rx) = mpsc::unbounded_channel();
    tokio::select! {
        r = writer(wr, requests, inflight_tx) => r,
        r = reader(rd, buf, scanner, inflight_rx) => r,
    }
}

async fn writer(
    mut wr: OwnedWriteHalf,
    mut requests: mpsc::Receiver<PipelinedRequest>,
    inflight: mpsc::UnboundedSender<Inflight>,
) -> Result<(), UpstreamError> {
    let mut db = 0u32;
    let mut out = BytesMut::with_capacity(BATCH_BYTES_MAX);
    while let Some(first) = requests.recv().await {
        // Let every other runnable session queue its requests first, so that one write
        // carries them all: without this, the writer (woken first) sends one command per
        // syscall under load.
        tokio::task::yield_now().await;
        let mut next = Some(first);
        while let Some(req) = next.take() {
            if req.db != db {
                out.extend_from_slice(&write::command([
                    b"SELECT".as_slice(),
                    req.db.to_string().as_bytes(),
                ]));
                let _ = inflight.send(Inflight::Select);
                db = req.db;
            }
            // The reader must know whom a reply is for before the command can be answered.
            let _ = inflight.send(Inflight::Client(req.reply));
            if req.cmd.len() >= BATCH_BYTES_MAX {
                wr.write_all(&out).await?;
                out.clear();
                wr.write_all(&req.cmd).await?;
            } else {
                out.extend_from_slice(&req.cmd);
            }
            if out.len() < BATCH_BYTES_MAX {
                next = requests.try_recv().ok();
            }
        }
        wr.write_all(&out).await?;
        out.clear();
    }
    Ok(())
}

async fn reader(
    mut rd: OwnedReadHalf,
    mut buf: BytesMut,
    mut scanner: ReplyScanner,
    mut inflight: mpsc::UnboundedReceiver<Inflight>,
) -> Result<(), UpstreamError> {
    loop {
        while let Some(n) = scanner.scan(&buf)? {
            let frame = buf.split_to(n).freeze();
            if frame[0] == b'>' {
                // A RESP3 push is not a reply; pooled connections subscribe to nothing.
                tracing::debug!("ignoring push on a pooled connection");
                continue;
            }
            match inflight.try_recv() {
                Ok(Inflight::Client(tx)) => {
                    let _ = tx.send(frame);
                }
                Ok(Inflight::Select) if frame[0] == b'-' => {
                    return Err(UpstreamError::Refused(frame))
                }
                Ok(Inflight::Select) => {}
                Err(_) => return Err(UpstreamError::Decode("reply without a request".into())),
            }
        }
        if buf.capacity() - buf.len() < READ_CHUNK_BYTES / 4 {
            buf.reserve(READ_CHUNK_BYTES);
        }
        if rd.read_buf(&mut buf).await? == 0 {
            return Err(UpstreamError::Closed);
        }
    }
}
