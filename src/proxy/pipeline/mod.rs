//! One pipelined upstream connection: a connection of the shared pool, or a pinned
//! session's dedicated one.
//!
//! Requests arrive on a channel; the writer half takes whatever is queued, writes it in one
//! batch, and records for each request whom its reply belongs to; the reader half delimits
//! replies and hands each to its requester, in order (Valkey answers a connection's commands
//! in the order it received them). A request carries its client's database: when it differs
//! from the connection's, a `SELECT` goes first and its reply is swallowed.
//!
//! Durability (see [`crate::durability`]): a batch that contains a write ends with `ROLE`,
//! whose reply (Valkey's replication offset right after the batch) is swallowed too; the
//! batch's write replies are handed to the durability gate with that offset. `ROLE` never
//! goes between MULTI and EXEC, where it would be queued: a transaction's replies wait for
//! the `ROLE` after its EXEC. Nor after a command whose effect Valkey keeps for the next
//! command only (ASKING, CLIENT CACHING): it would be that next command, so the `ROLE` due
//! then goes before it. Read replies are checked against the dirty-key map as they arrive.
//!
//! A ROLE reply proves an offset only from a Valkey with a replication backlog (see
//! [`parse_role_offset`](crate::valkey::role::parse_role_offset)); every batch is also tagged with the connection's history epoch, so
//! one that ran on a Valkey walrus has since restored (or replaced) is never acknowledged.
//! With durability on, a new connection waits for the replica link to be attached before it
//! serves anything (requests meanwhile get `-LOADING`).
//!
//! If the connection breaks, every request in flight on it without a reply, and every one
//! still queued for it, is dropped; the requester sees its reply channel close and answers
//! its client with an error. Nothing is retried: such a write's outcome is unknown once its
//! connection is gone. Replies that had arrived are real outcomes: once Valkey runs nothing
//! more of the connection, they are released when the journal covers Valkey's offset asked
//! then, of the same Valkey process; while Valkey cannot tell (busy with a script,
//! unreachable), they get the error at once rather than wait for it.

mod reader;
mod writer;

use reader::Reader;
use writer::writer;

use super::pushes::PushSender;
use crate::durability::{dirty::Scope, Durability, Held, Refusal, ReplyTx, WriteMark};
use crate::resp::write;
use crate::task::backoff::Backoff;
use crate::upstream::client::{Conn, ConnParts, UpstreamError};
use crate::upstream::Upstream;
use crate::valkey::role::{client_name, ClientName, Closing, OffsetOracle};
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// How a reply is released.
#[derive(Debug)]
pub enum Release {
    /// At once.
    Free,
    /// At once unless what it read is dirty when it arrives.
    Read(Scope),
    /// When the offset after its batch is durable; carries the dirty-key marks of the
    /// write (or, for EXEC, of the transaction's writes).
    Offset(Vec<WriteMark>),
}

/// Transaction structure the writer must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxCmd {
    Other,
    Multi,
    /// EXEC or DISCARD.
    End,
    /// A client's own SELECT queued inside MULTI: after the transaction the connection's
    /// database is unknown.
    SelectInMulti,
}

/// A client command on its way upstream.
#[derive(Debug)]
pub struct PipelinedRequest {
    /// The client's selected database; `None` inside a transaction, where walrus must not
    /// insert a SELECT of its own.
    pub db: Option<u32>,
    /// The encoded command.
    pub cmd: Bytes,
    /// Where its reply goes.
    pub reply: ReplyTx,
    pub release: Release,
    pub tx: TxCmd,
    /// The connection is inside MULTI once this command has run: no ROLE may follow it.
    /// The session knows (it waits for MULTI's reply before queueing anything after it).
    pub in_multi: bool,
    /// The command's only answers are RESP3 pushes ((P|S)(UN)SUBSCRIBE on a RESP3
    /// connection): no reply is expected in band.
    pub answered_by_push: bool,
    /// It may wait in Valkey as long as it asks (BLPOP 0, WAIT, XREAD BLOCK): while it is
    /// owed, the connection's silence is no sign of a Valkey that stopped answering.
    pub may_block: bool,
    /// What it sets lasts for the next command only (ASKING, CLIENT CACHING:
    /// [`route::is_one_shot`](crate::proxy::route::is_one_shot)): nothing walrus adds may
    /// come between it and that command.
    pub one_shot: bool,
}

/// What every pipeline shares.
pub struct PipelineCtx {
    pub upstream: Upstream,
    /// `None` when durability is off: no ROLE, no holding.
    pub durability: Option<Arc<Durability>>,
    pub oracle: OffsetOracle,
    /// Requests written (or batched) whose replies have not arrived, per connection
    /// (`upstream.max_in_flight_requests`): bounds memory while Valkey is slow to answer
    /// (the reply timeout closes a connection that stops answering altogether). Past it
    /// the writer waits for replies.
    pub max_in_flight: usize,
}

/// Requests that may block ([`PipelinedRequest::may_block`]), sent and not yet answered:
/// while one is owed, the connection's silence is no sign of a Valkey that stopped
/// answering. The writer counts one up before the reader can see its reply; the reader
/// counts it down as the reply arrives.
#[derive(Debug, Default)]
pub(super) struct Blocking(AtomicUsize);

impl Blocking {
    pub(super) fn sent(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// Paired with [`sent`](Self::sent), which comes first: a count below zero would wrap,
    /// and the reply timeout would never again cut a silent connection.
    pub(super) fn answered(&self) {
        let before = self.0.fetch_sub(1, Ordering::SeqCst);
        assert!(
            before > 0,
            "a blocking request answered that was never counted sent (count {before})"
        );
    }

    pub(super) fn none(&self) -> bool {
        self.0.load(Ordering::SeqCst) == 0
    }
}

/// What the reader does with the next reply.
enum Inflight {
    /// A client's request; `true`: it may block ([`PipelinedRequest::may_block`]).
    Client(ReplyTx, Release, bool),
    /// walrus's own `SELECT`: check and drop.
    Select,
    /// walrus's own `ROLE`: the offset covering the write replies gathered so far.
    Role,
}

/// Runs the connection until it breaks or `requests` closes. RESP3 pushes go to `pushes`
/// (a pinned session's out-of-band channel), or are dropped on pooled connections.
///
/// With durability on, a connection serves nothing until the replica link is attached: one
/// opened while Valkey is being restored (or restarted unnoticed) may reach a Valkey whose
/// data the journal does not describe yet. Meanwhile requests get Valkey's `-LOADING`. The
/// connection then belongs to the gate's history epoch of that moment.
pub async fn run(
    conn: Conn,
    mut requests: mpsc::Receiver<PipelinedRequest>,
    ctx: Arc<PipelineCtx>,
    pushes: Option<PushSender>,
) -> Result<(), UpstreamError> {
    // The Valkey process this connection reaches (its `run_id`), when gated.
    let (epoch, run_id, first) = match &ctx.durability {
        Some(d) => match wait_attached(d, &ctx, &mut requests, pushes.as_ref()).await? {
            Some(started) => started,
            None => return Ok(()),
        },
        None => (0, String::new(), None),
    };
    let ConnParts {
        stream,
        buf,
        scanner,
        client_id,
    } = conn.into_parts();
    // How Valkey names this connection should walrus drop it itself (`CLIENT KILL`): by
    // the `CLIENT ID` asked as it opened, else by this address (none on a Unix socket).
    let local = stream.local_addr();
    let (rd, wr) = stream.into_split();
    let (inflight_tx, mut inflight_rx) = mpsc::channel(ctx.max_in_flight);
    let gated = ctx.durability.is_some();
    let mut reader = Reader {
        ctx: ctx.clone(),
        pushes: pushes.map(|p| p.in_epoch(epoch)),
        awaiting: Vec::new(),
        marks: Vec::new(),
        epoch,
        blocking: Arc::default(),
    };
    let result = tokio::select! {
        r = writer(wr, first, requests, inflight_tx, gated, reader.blocking.clone()) => r,
        r = reader.run(rd, buf, scanner, &mut inflight_rx) => r,
    };
    // Settle what the broken connection leaves behind: replies that arrived (real outcomes)
    // still waiting for an offset, and marks of writes that got no reply at all.
    if let Some(d) = &ctx.durability {
        inflight_rx.close();
        let mut marks = std::mem::take(&mut reader.marks);
        while let Ok(i) = inflight_rx.try_recv() {
            if let Inflight::Client(_, Release::Offset(m), _) = i {
                marks.extend(m);
            }
        }
        let awaiting = std::mem::take(&mut reader.awaiting);
        if !awaiting.is_empty() || !marks.is_empty() {
            let lost = Lost {
                ctx: ctx.clone(),
                name: client_name(client_id.as_deref(), local),
                run_id,
                epoch,
            };
            // In a task of its own: the slot reconnects meanwhile.
            tokio::spawn(lost.settle(d.clone(), awaiting, marks));
        }
    }
    result
}

/// A broken connection whose writes' outcome is unknown.
struct Lost {
    ctx: Arc<PipelineCtx>,
    /// How Valkey names it, if it can be named.
    name: Option<ClientName>,
    /// The Valkey process it reached.
    run_id: String,
    epoch: u64,
}

impl Lost {
    /// Settles its writes' replies and marks at Valkey's offset once Valkey runs nothing
    /// more of the connection: the replies that arrived are real outcomes, released once the
    /// journal covers that offset, asked of the Valkey process the connection reached. walrus
    /// may have closed the socket itself (no reply within `upstream.reply_timeout_ms`, a push
    /// over its limit) while Valkey still holds commands of it to run: Valkey closes it
    /// first, so that the offset learned afterwards covers everything it will ever run. While
    /// Valkey cannot close it (busy with a script, which it runs to its end first, and the
    /// commands behind it after; unreachable), the replies get their error at once, the keys
    /// stay dirty, and walrus asks again, with backoff.
    async fn settle(self, d: Arc<Durability>, mut awaiting: Vec<Held>, marks: Vec<WriteMark>) {
        let why = lost_reply();
        if !self.close().await {
            d.abandon_batch(std::mem::take(&mut awaiting), Vec::new(), why.clone(), None);
            let mut backoff = Backoff::default();
            while !self.close().await {
                tokio::time::sleep(backoff.advance()).await;
            }
        }
        let hint = self
            .ctx
            .oracle
            .offset_of(&self.ctx.upstream, &self.run_id)
            .await;
        d.abandon_batch(awaiting, marks, why, hint.map(|o| (o, self.epoch)));
    }

    /// Whether Valkey runs nothing more of the connection: it closed it, or another process
    /// answers (the connection went with the one it reached), or it cannot be named.
    async fn close(&self) -> bool {
        let Some(name) = self.name else { return true };
        let up = &self.ctx.upstream;
        self.ctx.oracle.close(up, name, &self.run_id).await != Closing::Unknown
    }
}

/// Waits until the gate is attached and this connection is known to reach the Valkey
/// process the link follows, answering requests with `-LOADING` meanwhile. Returns the
/// epoch, that process's `run_id`, and a request that arrived as the wait ended, or `None`
/// if `requests` closed.
///
/// The process is checked on the control connection after this one opened: only one
/// process listens at Valkey's address at a time, so if the control connection finds the
/// link's, this connection reached it too (or one that is dead by now, whose connection
/// fails). A connection to another process (Valkey restarted and the link has not noticed
/// yet) waits for the next epoch: the link's, once it has restored that process.
async fn wait_attached(
    d: &Durability,
    ctx: &PipelineCtx,
    requests: &mut mpsc::Receiver<PipelinedRequest>,
    pushes: Option<&PushSender>,
) -> Result<Option<(u64, String, Option<PipelinedRequest>)>, UpstreamError> {
    // The epoch whose process this connection does not reach.
    let mut wrong_epoch = None;
    let mut first = None;
    loop {
        let (epoch, run_id) = loop {
            tokio::select! {
                biased;
                p = d.wait_attached(wrong_epoch) => break p,
                req = requests.recv() => {
                    let Some(req) = req else { return Ok(None) };
                    if let Some(p) = d.attached(wrong_epoch) {
                        first = Some(req);
                        break p;
                    }
                    refuse(d, req, pushes, Refusal::Loading.reply());
                }
            }
        };
        match ctx.oracle.run_id(&ctx.upstream).await {
            Some(now) if now == run_id => return Ok(Some((epoch, run_id, first))),
            Some(_) => {
                d.doubt_valkey();
                wrong_epoch = Some(epoch);
                if let Some(req) = first.take() {
                    refuse(d, req, pushes, Refusal::Loading.reply());
                }
            }
            None => {
                // The connection does not serve: what waits for it is answered, saying why.
                let why = unavailable(&UpstreamError::Unverified.to_string());
                for req in first
                    .take()
                    .into_iter()
                    .chain(std::iter::from_fn(|| requests.try_recv().ok()))
                {
                    refuse(d, req, pushes, why.clone());
                }
                return Err(UpstreamError::Unverified);
            }
        }
    }
}

/// Answers a request the connection cannot serve (yet) with `why`; it was never sent.
fn refuse(d: &Durability, req: PipelinedRequest, pushes: Option<&PushSender>, why: Bytes) {
    if let Release::Offset(marks) = req.release {
        d.cancel_write(marks);
    }
    match pushes {
        // Its session waits for no reply (a RESP3 subscription is confirmed by pushes): the
        // error goes the pushes' way, in order.
        Some(p) if req.answered_by_push => {
            let _ = p.send(why);
        }
        _ => {
            req.reply.send(why);
        }
    }
}

/// The reply for a request that cannot reach Valkey, saying why.
pub fn unavailable(reason: &str) -> Bytes {
    crate::metrics::UPSTREAM_ERRORS.inc();
    write::error(&format!(
        "ERR walrus: Valkey is unavailable: {}",
        reason.replace(['\r', '\n'], " ")
    ))
}

/// The reply for a request whose connection broke before its outcome was known.
pub fn lost_reply() -> Bytes {
    crate::metrics::UPSTREAM_ERRORS.inc();
    write::error("ERR walrus: connection to Valkey lost before the reply; the command may or may not have run")
}

#[cfg(test)]
mod tests {
    use super::Blocking;

    #[test]
    fn a_blocking_request_is_answered_after_it_is_sent() {
        let b = Blocking::default();
        b.sent();
        assert!(!b.none());
        b.answered();
        assert!(b.none());
    }

    #[test]
    #[should_panic(expected = "a blocking request answered that was never counted sent (count 0)")]
    fn an_answer_without_a_send_is_caught() {
        Blocking::default().answered();
    }
}
