//! Where a session's requests go upstream: a slot of its identity's shared pool, or its own
//! (dedicated) connection once it has connection state ([`super::route`]), each request
//! registered with the durability gate on its way.

use super::{transaction, Pending, Session};
use crate::metrics;
use crate::proxy::identity::Identity;
use crate::proxy::pinned;
use crate::proxy::pipeline::{self, PipelinedRequest, Release, TxCmd};
use crate::proxy::pool::{Pool, Unavailable};
use crate::proxy::pushes;
use crate::proxy::route;
use crate::resp::{write, Request};
use bytes::Bytes;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Requests queued for a pinned session's dedicated connection before the session waits:
/// one client's connection, so `proxy.max_pipeline_requests` (pending replies) bounds it
/// first with the defaults; this bounds the queue's memory whatever that is set to.
const DEDICATED_QUEUE_REQUESTS: usize = 1024;

/// Where the session's commands run.
pub(super) enum Runs {
    /// A slot of the shared pool of this identity.
    Pooled { pool: Arc<Pool>, slot: usize },
    /// The session's own connection (see [`route`]).
    Dedicated,
}

impl Session {
    /// Moves the session to its own upstream connection, after its pending replies.
    pub(super) async fn dedicate(&mut self) -> Result<(), Bytes> {
        self.drain()
            .await
            .map_err(|_| write::error("ERR walrus: client connection failed"))?;
        // Opened in database 0, where the pipeline's writer assumes a connection starts: each
        // request carries the client's database, and the writer selects it when needed.
        let start = Identity {
            db: 0,
            ..self.id.clone()
        };
        let conn = pinned::open(&self.shared, &start).await?;
        let (tx, rx) = mpsc::channel(DEDICATED_QUEUE_REQUESTS);
        let ctx = self.shared.pools.ctx().clone();
        let (push_tx, push_rx) =
            pushes::channel(self.shared.max_push_bytes, ctx.durability.as_ref());
        tokio::spawn(async move {
            if let Err(e) = pipeline::run(conn, rx, ctx, Some(push_tx)).await {
                tracing::debug!("dedicated upstream connection ended: {e}");
            }
        });
        metrics::PINNED_SESSIONS.inc();
        self.upstream = Runs::Dedicated;
        self.tx = Some(tx);
        self.pushes = Some(push_rx);
        Ok(())
    }

    /// Back to the shared pool of the session's identity (after RESET, AUTH, HELLO).
    pub(super) async fn pool_again(&mut self) {
        let pool = self
            .shared
            .pools
            .get(self.id.pool_key(), self.id.creds.as_ref())
            .await;
        let slot = pool.pick();
        self.tx = pool.sender(slot).await.ok();
        self.upstream = Runs::Pooled { pool, slot };
        self.pushes = None;
        self.transaction.discard();
    }

    /// Sends a client command upstream, registering it with the durability gate.
    pub(super) async fn forward(&mut self, req: Request) {
        let tx = self.tx_cmd(&req);
        if tx == TxCmd::Multi {
            return self.multi(req).await;
        }
        let exec = tx == TxCmd::End && req.name().eq_ignore_ascii_case(b"EXEC");
        if exec && self.transaction.aborts() {
            return self.abort_exec().await;
        }
        let release = match self.admit(&req, tx).await {
            Ok(g) => g,
            Err(refused) => {
                if tx != TxCmd::End {
                    self.transaction.refuse();
                }
                self.owe(Pending::Ready(refused.reply()));
                return;
            }
        };
        // The database a SELECT queued in the transaction moves the client to, if EXEC's
        // reply says it ran.
        let mut select = None;
        match tx {
            TxCmd::End => select = self.transaction.end().filter(|_| exec),
            TxCmd::SelectInMulti => self
                .transaction
                .queue_select(req.args.get(1).map(|a| &a[..]), self.shared.databases),
            TxCmd::Other | TxCmd::Multi => {}
        }
        let in_multi = self.transaction.is_open();
        let db = (!in_multi && tx != TxCmd::End).then_some(self.id.db);
        let answered_by_push =
            self.dedicated() && self.id.resp3 && route::is_subscription(&req) && !in_multi;
        if answered_by_push && self.drain().await.is_err() {
            // The confirmation push must not overtake replies still held for durability.
            return;
        }
        // What Valkey serves while a script keeps it busy must not queue behind the script on
        // a shared connection.
        let aside = !self.dedicated() && self.command().is_some_and(|c| c.flags.allow_busy);
        let (reply, rx) = self.reply_channel();
        let request = PipelinedRequest {
            db,
            cmd: req.raw,
            reply,
            release,
            tx,
            in_multi,
            answered_by_push,
            may_block: self.blocking_request && !in_multi,
            one_shot: self.command().is_some_and(|c| route::is_one_shot(c)),
        };
        let p = if aside {
            self.send_aside(request, rx).await
        } else {
            self.send(request, rx).await
        };
        match (p, select) {
            // Its confirmation arrives as a push; nothing to wait for in band.
            (Pending::Wait(_), _) if answered_by_push => {}
            // Which database the client's next command runs in is EXEC's reply's to say.
            (p, Some(db)) => {
                let reply = self.wait(p).await;
                if transaction::ran(&reply) {
                    self.id.db = db;
                }
                self.owe(Pending::Ready(reply));
            }
            (p, None) => self.owe(p),
        }
    }

    /// Queues `req` upstream; `rx` is the receiving end of `req.reply`.
    pub(super) async fn send(
        &mut self,
        mut req: PipelinedRequest,
        rx: oneshot::Receiver<Bytes>,
    ) -> Pending {
        for _ in 0..2 {
            if let Some(sender) = &self.tx {
                match sender.send(req).await {
                    Ok(()) => return Pending::Wait(rx),
                    Err(mpsc::error::SendError(back)) => req = back,
                }
            }
            // The connection this client used is gone; take the slot's current one.
            let current = match &self.upstream {
                Runs::Pooled { pool, slot } => pool.sender(*slot).await,
                Runs::Dedicated => Err(Unavailable(
                    "the session's dedicated connection was lost".to_string(),
                )),
            };
            match current {
                Ok(s) => self.tx = Some(s),
                Err(Unavailable(reason)) => return self.refuse(req, &reason),
            }
        }
        self.refuse(req, "connection lost")
    }

    /// Queues `req` on the connection its pool keeps aside ([`Pool::aside`]); `rx` is the
    /// receiving end of `req.reply`.
    async fn send_aside(&mut self, req: PipelinedRequest, rx: oneshot::Receiver<Bytes>) -> Pending {
        let Runs::Pooled { pool, .. } = &self.upstream else {
            return self.send(req, rx).await;
        };
        let sent = match pool.clone().aside().await {
            Ok(sender) => sender
                .send(req)
                .await
                .map_err(|back| (back.0, "connection lost".to_string())),
            Err(Unavailable(reason)) => Err((req, reason)),
        };
        match sent {
            Ok(()) => Pending::Wait(rx),
            Err((req, reason)) => self.refuse(req, &reason),
        }
    }

    /// A request that was never sent: its write mark is released at once.
    pub(super) fn refuse(&self, req: PipelinedRequest, reason: &str) -> Pending {
        if let (Release::Offset(marks), Some(d)) =
            (req.release, &self.shared.pools.ctx().durability)
        {
            d.cancel_write(marks);
        }
        Pending::Ready(pipeline::unavailable(reason))
    }
}
