//! What a request passes before it is sent: its place in a transaction (MULTI is a
//! barrier; EXEC after a refusal aborts, as Valkey's queue-time errors do) and the
//! durability gate's admission, which decides how its reply will be released.

use super::*;
use crate::durability::Refusal;

impl Session {
    /// MULTI is a barrier: whether the commands after it are queued depends on its reply
    /// (it fails before AUTH, for one), and the pipeline must know, since no ROLE may be
    /// queued inside a transaction. Earlier replies are settled first, so nothing before it
    /// still waits for a ROLE.
    pub(super) async fn multi(&mut self, req: Request) {
        if self.drain().await.is_err() {
            return;
        }
        let (reply, rx) = self.reply_channel();
        let request = PipelinedRequest {
            db: Some(self.id.db),
            cmd: req.raw,
            reply,
            release: Release::Free,
            tx: TxCmd::Multi,
            in_multi: true,
            answered_by_push: false,
            may_block: false,
            one_shot: false,
        };
        let reply = self.send(request, rx).await;
        let reply = self.wait(reply).await;
        self.transaction.opened(&reply);
        self.owe(Pending::Ready(reply));
    }

    /// EXEC of a transaction in which walrus refused a command while queueing: nothing
    /// runs, as for Valkey's own queue-time errors. Valkey discards the transaction (its +OK
    /// answers no one), the queued writes' marks are released, and EXEC gets Valkey's
    /// `-EXECABORT`.
    pub(super) async fn abort_exec(&mut self) {
        self.transaction.discard();
        let (reply, rx) = self.reply_channel();
        let discard = PipelinedRequest {
            db: None,
            cmd: write::command(["DISCARD"]),
            reply,
            release: Release::Free,
            tx: TxCmd::End,
            in_multi: true,
            answered_by_push: false,
            may_block: false,
            one_shot: false,
        };
        // Sent or not (a lost connection ends the transaction anyway), EXEC's answer is the
        // same. Its +OK is taken, not left counted against the client's output.
        let discarded = self.send(discard, rx).await;
        self.wait(discarded).await;
        self.owe(Pending::Ready(write::error(
            "EXECABORT Transaction discarded because of previous errors.",
        )));
    }

    /// Where `req` stands in a transaction: only a dedicated connection has one.
    pub(super) fn tx_cmd(&self, req: &Request) -> TxCmd {
        if !self.dedicated() {
            return TxCmd::Other;
        }
        self.transaction.classify(req)
    }

    /// How the reply will be released (see [`crate::durability`]); `Err` is the refusal.
    pub(super) async fn admit(&mut self, req: &Request, tx: TxCmd) -> Result<Release, Refusal> {
        let Some(d) = self.shared.pools.ctx().durability.clone() else {
            return Ok(Release::Free);
        };
        if tx == TxCmd::End {
            // EXEC's reply shows what the transaction read and wrote: it waits for the
            // offset after it.
            d.admit_read()?;
            return Ok(Release::Offset(self.transaction.take_marks()));
        }
        let class = crate::commands::Class::of(self.command(), &req.args);
        // Queued on this connection behind a command that may still be blocked.
        let behind = self.dedicated() && self.behind_blocking();
        let in_multi = self.transaction.is_open();
        match durability::access(&class, &req.args, req.raw.len(), self.id.db) {
            Access::Free => Ok(Release::Free),
            // Inside MULTI a read only answers +QUEUED; EXEC is gated.
            Access::Read(_) if in_multi => Ok(Release::Free),
            Access::Read(scope) => {
                d.admit_read()?;
                // It may see what a blocking write in flight wrote: the ROLE after it in its
                // batch is its barrier (one for the whole batch). A blocking write sent after
                // this check is caught when the reply arrives (`Durability::read_reply`).
                if d.blocked_overlaps(&scope) {
                    return Ok(Release::Offset(Vec::new()));
                }
                Ok(Release::Read(scope))
            }
            Access::Write(_) if req.raw.len() > self.shared.max_write_bytes => {
                Err(Refusal::TooLarge {
                    len_bytes: req.raw.len(),
                    max_bytes: self.shared.max_write_bytes,
                }
                .count())
            }
            // A blocking write (BLPOP, BLMOVE, XREADGROUP ... BLOCK) may wait for hours, and
            // so does a write sent after a blocking command on the same connection: no read
            // may wait for them (see `durability::dirty`). Inside MULTI nothing blocks.
            Access::Write(scope) if !in_multi && (self.blocking_request || behind) => {
                d.write_room().await?;
                Ok(Release::Offset(vec![d.begin_blocked(scope)?]))
            }
            Access::Write(scope) => {
                let scope = if self.transaction.selects() {
                    Scope::All
                } else {
                    scope
                };
                d.write_room().await?;
                let mark = if behind {
                    d.begin_blocked(scope)?
                } else {
                    d.begin_write(scope)?
                };
                if in_multi {
                    // +QUEUED reveals nothing and must not wait (the client may wait for
                    // it before sending EXEC): the mark rides with EXEC.
                    self.transaction.queue_write(mark);
                    return Ok(Release::Free);
                }
                Ok(Release::Offset(vec![mark]))
            }
        }
    }
}
