//! The reader half: delimits replies, hands each to its requester in order, swallows
//! walrus's own `SELECT` and `ROLE` replies, and hands write replies to the durability gate
//! with the offset the `ROLE` after them reports. A reply past walrus's limits costs its own
//! requester alone: it gets an error naming the limit, the reply is skipped as it arrives,
//! and the connection serves on.

use super::{Blocking, Inflight, PipelineCtx, Release};
use crate::durability::{Held, ReplyTx, WriteMark};
use crate::net::{read_chunk, room_to_read, ReadHalf};
use crate::proxy::pushes::PushSender;
use crate::resp::{write, ReplyScanner};
use crate::upstream::client::UpstreamError;
use crate::valkey::role::parse_role_offset;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

/// Replies shorter than this are copied out of the read buffer rather than sharing it: a
/// small reply waiting for its client (or held by the gate) must not keep alive a buffer
/// that a large reply grew, out of proportion to the bytes it is counted for.
const SHARE_FROM_BYTES: usize = 16 << 10;
pub(super) struct Reader {
    pub(super) ctx: Arc<PipelineCtx>,
    pub(super) pushes: Option<PushSender>,
    /// Write replies (and transaction replies) waiting for the next ROLE.
    pub(super) awaiting: Vec<Held>,
    pub(super) marks: Vec<WriteMark>,
    pub(super) epoch: u64,
    /// Requests that may block, sent and not yet answered (the writer counts them up).
    pub(super) blocking: Arc<Blocking>,
}

impl Reader {
    pub(super) async fn run(
        &mut self,
        mut rd: ReadHalf,
        mut buf: BytesMut,
        mut scanner: ReplyScanner,
        inflight: &mut mpsc::Receiver<Inflight>,
    ) -> Result<(), UpstreamError> {
        // How long the connection may owe replies without a byte from Valkey before it is
        // given up (`upstream.reply_timeout_ms`): a Valkey that stopped answering (stopped,
        // partitioned) must not hang the clients whose requests it carries. Not while a
        // request that may block (BLPOP, WAIT) is owed. One timer for the connection's life,
        // reset once a period rather than armed for every read: whether Valkey was heard
        // from since the last tick, and whether replies were owed, unheard, at that tick.
        let period = self.ctx.upstream.reply_timeout;
        let tick = tokio::time::sleep(period);
        tokio::pin!(tick);
        let (mut heard, mut owed_at_tick) = (false, false);
        loop {
            loop {
                if scanner.discarding() {
                    let (n, done) = scanner.discard(&buf)?;
                    bytes::Buf::advance(&mut buf, n);
                    if !done {
                        break;
                    }
                }
                let n = match scanner.scan(&buf) {
                    Ok(Some(n)) => n,
                    Ok(None) => break,
                    // A push is no one's reply: the pushes' client is disconnected instead.
                    Err(e) if e.is_limit() && buf.first() != Some(&b'>') => {
                        self.refuse_reply(e, inflight)?;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                };
                let frame = if n < SHARE_FROM_BYTES {
                    let small = Bytes::copy_from_slice(&buf[..n]);
                    bytes::Buf::advance(&mut buf, n);
                    small
                } else {
                    buf.split_to(n).freeze()
                };
                if frame[0] == b'>' {
                    // A RESP3 push is not a reply: tracking invalidations and Pub/Sub messages
                    // of a pinned session go to its client as they come.
                    if let Some(Err(queued)) = self.pushes.as_ref().map(|p| p.send(frame)) {
                        return Err(UpstreamError::Decode(format!(
                            "the client does not read its pushes: {queued} bytes queued, over proxy.max_push_bytes"
                        )));
                    }
                    continue;
                }
                match inflight.try_recv() {
                    Ok(Inflight::Client(tx, release, may_block)) => {
                        if may_block {
                            self.blocking.answered();
                        }
                        self.reply(tx, release, frame)
                    }
                    Ok(Inflight::Select) if frame[0] == b'-' => {
                        return Err(UpstreamError::Refused(frame))
                    }
                    Ok(Inflight::Select) => {}
                    Ok(Inflight::Role) => self.settle(&frame),
                    // A RESP3 subscription Valkey refuses (-NOPERM for a channel, say) is
                    // answered in band, though its session waits for pushes: pass it on so.
                    Err(_) if frame[0] == b'-' && self.pushes.is_some() => {
                        if let Some(Err(_)) = self.pushes.as_ref().map(|p| p.send(frame)) {
                            return Err(UpstreamError::Decode(
                                "the client does not read its pushes".into(),
                            ));
                        }
                    }
                    Err(_) => return Err(UpstreamError::Decode("reply without a request".into())),
                }
            }
            room_to_read(&mut buf, read_chunk::SHARED, 0);
            let n = tokio::select! {
                n = rd.read_buf(&mut buf) => {
                    heard = true;
                    n?
                }
                _ = &mut tick => {
                    // Replies owed at two ticks in a row with no byte from Valkey between
                    // them: no reply that comes within the timeout is cut, and one owed from
                    // a tick on is given up at the next but one, so within twice the timeout
                    // of its request. A byte heard before a tick says nothing of the replies
                    // owed at it. Not while a request that may block is owed: Valkey is
                    // silent then by design.
                    tick.as_mut().reset(tokio::time::Instant::now() + period);
                    let owed = !inflight.is_empty() && self.blocking.none();
                    let silent = !std::mem::take(&mut heard);
                    if owed && silent && owed_at_tick {
                        return Err(UpstreamError::NoReply(period));
                    }
                    owed_at_tick = owed;
                    continue;
                }
            };
            if n == 0 {
                return Err(UpstreamError::Closed);
            }
        }
    }

    /// The next reply breaks walrus's limits (`proxy.max_reply_bytes`, `max_reply_depth`, a
    /// line longer than walrus reads as one): its request gets, in its place, an error that
    /// names the limit, released as the reply would have been (a write's once the journal
    /// covers it: it ran). The scanner skips the reply as it arrives.
    fn refuse_reply(
        &mut self,
        e: crate::resp::ScanError,
        inflight: &mut mpsc::Receiver<Inflight>,
    ) -> Result<(), UpstreamError> {
        match inflight.try_recv() {
            Ok(Inflight::Client(tx, release, may_block)) => {
                if may_block {
                    self.blocking.answered();
                }
                tracing::debug!("refused a reply: {e}");
                self.reply(tx, release, write::error(&format!("ERR walrus: {e}")));
                Ok(())
            }
            // walrus's own SELECT and ROLE are never answered that long: not Valkey.
            _ => Err(e.into()),
        }
    }

    fn reply(&mut self, tx: ReplyTx, release: Release, frame: Bytes) {
        let Some(d) = &self.ctx.durability else {
            tx.send(frame);
            return;
        };
        match release {
            Release::Free => {
                tx.send(frame);
            }
            Release::Read(scope) => {
                if let Some(held) = d.read_reply(&scope, self.epoch, Held::new(tx, frame)) {
                    // It may show a blocking write's effect: Valkey's offset now is past the
                    // read, so once the journal covers it, it covers what the read saw.
                    self.settle_by_oracle(vec![held], Vec::new());
                }
            }
            Release::Offset(mark) => {
                self.awaiting.push(Held::new(tx, frame));
                self.marks.extend(mark);
            }
        }
    }

    fn settle(&mut self, role_reply: &Bytes) {
        let Some(d) = &self.ctx.durability else {
            return;
        };
        let awaiting = std::mem::take(&mut self.awaiting);
        let marks = std::mem::take(&mut self.marks);
        if let Some(offset) = parse_role_offset(role_reply) {
            return d.settle_batch(offset, self.epoch, awaiting, marks);
        }
        // ROLE refused on this connection: ask on walrus's own.
        tracing::debug!(
            "inline ROLE refused ({}); asking on the control connection",
            String::from_utf8_lossy(role_reply).trim_end()
        );
        self.settle_by_oracle(awaiting, marks);
    }

    /// Settles replies and marks at Valkey's offset asked now on walrus's own connection
    /// (every command they stand for ran before it).
    fn settle_by_oracle(&self, awaiting: Vec<Held>, marks: Vec<WriteMark>) {
        let Some(d) = &self.ctx.durability else {
            return;
        };
        let (d, ctx, epoch) = (d.clone(), self.ctx.clone(), self.epoch);
        tokio::spawn(async move {
            match ctx.oracle.offset(&ctx.upstream).await {
                Some(offset) => d.settle_batch(offset, epoch, awaiting, marks),
                None => {
                    let why = write::error("ERR walrus: cannot confirm durability: Valkey's replication offset is unavailable");
                    d.abandon_batch(awaiting, marks, why, None);
                }
            }
        });
    }
}
