//! The writer half: takes what is queued, writes it in one batch (a `SELECT` first when a
//! request's database differs, a `ROLE` last when the batch writes, or before a one-shot
//! command: [`PipelinedRequest::one_shot`]), and tells the reader whom each reply belongs to
//! before the command goes out.

use super::{Blocking, Inflight, PipelinedRequest, Release, TxCmd};
use crate::net::WriteHalf;
use crate::resp::write;
use crate::upstream::client::UpstreamError;
use bytes::BytesMut;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Most bytes gathered into one write; a larger command is written on its own.
const BATCH_BYTES_MAX: usize = 256 << 10;
/// Tells the reader whom the next reply belongs to, before the command is written. When
/// the reader is that far behind, what is batched so far goes out first: its replies are
/// what frees room.
async fn owe(
    inflight: &mpsc::Sender<Inflight>,
    owed: Inflight,
    wr: &mut WriteHalf,
    out: &mut BytesMut,
) -> Result<(), UpstreamError> {
    match inflight.try_send(owed) {
        Err(mpsc::error::TrySendError::Full(owed)) => {
            crate::metrics::UPSTREAM_IN_FLIGHT_FULL.inc();
            wr.send_all(out).await?;
            out.clear();
            // Closed: the reader is gone and the connection with it.
            let _ = inflight.send(owed).await;
        }
        Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
    }
    Ok(())
}

pub(super) async fn writer(
    mut wr: WriteHalf,
    mut first: Option<PipelinedRequest>,
    mut requests: mpsc::Receiver<PipelinedRequest>,
    inflight: mpsc::Sender<Inflight>,
    gated: bool,
    blocking: Arc<Blocking>,
) -> Result<(), UpstreamError> {
    // `None`: unknown (after a transaction that selected a database).
    let mut db = Some(0u32);
    let mut in_multi = false;
    let mut select_in_tx = false;
    let mut role_due = false;
    let role = write::command(["ROLE"]);
    let mut out = BytesMut::with_capacity(BATCH_BYTES_MAX);
    loop {
        let Some(first) = (match first.take() {
            Some(r) => Some(r),
            None => requests.recv().await,
        }) else {
            break;
        };
        // Let every other runnable session queue its requests first, so that one write
        // carries them all: without this, the writer (woken first) sends one command per
        // syscall under load.
        tokio::task::yield_now().await;
        let mut next = Some(first);
        while let Some(req) = next.take() {
            // A one-shot command's effect must reach the command after it: the offset of
            // the writes before it is asked first. (A database the client selects may still
            // come between them: Valkey clears the effect on the client's SELECT too.)
            if req.one_shot && role_due && !in_multi {
                owe(&inflight, Inflight::Role, &mut wr, &mut out).await?;
                out.extend_from_slice(&role);
                role_due = false;
            }
            if let Some(want) = req.db {
                if db != Some(want) {
                    owe(&inflight, Inflight::Select, &mut wr, &mut out).await?;
                    out.extend_from_slice(&write::command([
                        b"SELECT".as_slice(),
                        want.to_string().as_bytes(),
                    ]));
                    db = Some(want);
                }
            }
            match req.tx {
                TxCmd::SelectInMulti => select_in_tx = true,
                TxCmd::End if std::mem::take(&mut select_in_tx) => db = None,
                _ => {}
            }
            in_multi = req.in_multi;
            role_due |= gated && matches!(req.release, Release::Offset(_));
            // The reader must know whom a reply is for before the command can be answered.
            if !req.answered_by_push {
                if req.may_block {
                    blocking.sent();
                }
                let owed = Inflight::Client(req.reply, req.release, req.may_block);
                owe(&inflight, owed, &mut wr, &mut out).await?;
            }
            if req.cmd.len() >= BATCH_BYTES_MAX {
                wr.send_all(&out).await?;
                out.clear();
                wr.send_all(&req.cmd).await?;
            } else {
                out.extend_from_slice(&req.cmd);
            }
            if out.len() < BATCH_BYTES_MAX {
                next = requests.try_recv().ok();
            }
        }
        if role_due && !in_multi {
            owe(&inflight, Inflight::Role, &mut wr, &mut out).await?;
            out.extend_from_slice(&role);
            role_due = false;
        }
        wr.send_all(&out).await?;
        out.clear();
    }
    Ok(())
}
