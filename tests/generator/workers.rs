//! The worker clients: each step, a worker picks one operation at random (an append, a
//! pipeline of appends, a transaction, a script, reads, a queue push or pop, a PUBLISH, a
//! large value, an INCR) and records what it sent and what came back in the history.

use crate::common::Rng;
use crate::conn::{cmd, describe, Cmd, Conn, Reply};
use crate::counters::COUNTERS;
use crate::history::{History, LISTS, QUEUES};
use crate::keys::{counter_key, done_key, list_key, queue_key, same_tag, tag, CHANNEL};
use crate::large::LargeWrite;
use crate::reads::ReadOp;
use crate::release::Stamp;
use crate::route::{Batch, Router};
use crate::shared::{mix, pick, Ctx};
use crate::transactions::{Tx, TxKind};
use crate::{admin, databases, expiry, oversized, registers};
use redis_protocol::resp2::types::OwnedFrame;
use std::sync::Arc;
use std::time::Duration;

pub const WORKERS: usize = 5;

/// A script that appends, counted as an append: its LLEN reply is the element's position.
const SCRIPT: &str = "redis.call('RPUSH', KEYS[1], ARGV[1]) return redis.call('LLEN', KEYS[1])";

#[derive(Clone, Copy, Debug)]
enum Op {
    Append,
    Pipeline,
    Script,
    Transaction,
    Read,
    Push,
    Pop,
    Publish,
    Large,
    Abandon,
    Counter,
    /// MSET, DEL, UNLINK of several keys (`registers.rs`).
    RegWrite,
    /// MGET, EXISTS of several keys.
    RegRead,
    /// A register write with an MGET of its keys right behind it, on another connection
    /// (not in cluster mode).
    RegChase,
    /// SELECT inside MULTI, on a connection of its own (`databases.rs`; not in cluster mode).
    Database,
    /// Writes of keys that expire (`expiry.rs`), and reads of them.
    Expire,
    ExpireRead,
    /// An administrative command walrus must refuse (`admin.rs`).
    Refused,
    /// A reply over walrus's limits, another client's requests behind it (`oversized.rs`;
    /// not in cluster mode).
    Oversized,
}

const OPS: &[(Op, u64)] = &[
    (Op::Append, 18),
    (Op::Pipeline, 10),
    // A script counts as touching every key: while one is not durable, every read waits.
    (Op::Script, 2),
    (Op::Transaction, 10),
    (Op::Read, 24),
    (Op::Push, 9),
    (Op::Pop, 7),
    (Op::Publish, 8),
    // Rare, but each is 64 KiB to 1 MiB: they fill the small ring, so checkpoints run often.
    (Op::Large, 2),
    (Op::Abandon, 2),
    (Op::Counter, 8),
    (Op::RegWrite, 12),
    (Op::RegRead, 12),
    (Op::RegChase, 6),
    (Op::Database, 5),
    (Op::Expire, 4),
    (Op::ExpireRead, 4),
    (Op::Refused, 1),
    (Op::Oversized, 1),
];

/// The operations of a run: every one of `OPS` (but `Database`, `RegChase` and `Oversized`
/// in cluster mode), or those `WALRUS_GEN_OPS` names (`Append,RegWrite,...`), to look at one kind at a
/// time.
fn ops(cluster: bool) -> Vec<(Op, u64)> {
    let only = std::env::var("WALRUS_GEN_OPS")
        .ok()
        .filter(|v| !v.is_empty());
    let ops: Vec<(Op, u64)> = OPS
        .iter()
        .copied()
        .filter(|(op, _)| !(cluster && matches!(op, Op::Database | Op::RegChase | Op::Oversized)))
        .filter(|(op, _)| {
            only.as_ref()
                .is_none_or(|o| o.split(',').any(|n| n.trim() == format!("{op:?}")))
        })
        .collect();
    assert!(!ops.is_empty(), "WALRUS_GEN_OPS: none of {only:?}");
    ops
}

pub struct Worker {
    id: usize,
    ctx: Arc<Ctx>,
    rng: Rng,
    router: Router,
    /// Steps in a row that met an error.
    failing: u32,
    /// Its connection for `databases.rs`, whose database it changes.
    db_conn: Option<Conn>,
    /// Its two connections for `registers::write_chased`.
    chase: Option<(Conn, Conn)>,
}

impl Worker {
    /// Worker `id`; a RESP3 client half the time.
    pub fn new(id: usize, ctx: Arc<Ctx>, seed: u64) -> Worker {
        let router = Router::new(ctx.clone(), mix(seed, 1));
        let router = if mix(seed, 2) % 2 == 0 {
            router.resp3()
        } else {
            router
        };
        Worker {
            id,
            router,
            ctx,
            rng: Rng(seed),
            failing: 0,
            db_conn: None,
            chase: None,
        }
    }

    pub fn run(mut self) {
        let ops = ops(self.ctx.cluster());
        while !self.ctx.stopping() {
            let clean = match pick(&mut self.rng, &ops) {
                Op::Append => self.appends(1, "op: append"),
                Op::Pipeline => {
                    let n = 2 + self.below(4);
                    self.appends(n, "op: append pipeline")
                }
                Op::Script => self.script(),
                Op::Transaction => self.transaction(),
                Op::Read => self.reads(),
                Op::Push => self.push(),
                Op::Pop => self.pop(),
                Op::Publish => self.publish(),
                Op::Large => self.large(),
                Op::Abandon => self.abandon(),
                Op::Counter => self.incr(),
                Op::RegWrite => {
                    registers::write(&mut self.router, &self.ctx, &mut self.rng, self.id)
                }
                Op::RegRead => registers::read(&mut self.router, &self.ctx, &mut self.rng),
                Op::RegChase => {
                    registers::write_chased(&mut self.chase, &self.ctx, &mut self.rng, self.id)
                }
                Op::Database => {
                    databases::transaction(&mut self.db_conn, &self.ctx, &mut self.rng, self.id)
                }
                Op::Expire => expiry::write(&mut self.router, &self.ctx, &mut self.rng, self.id),
                Op::ExpireRead => expiry::read(&mut self.router, &self.ctx, &mut self.rng),
                Op::Refused => admin::refused(&self.ctx, &mut self.rng),
                Op::Oversized => oversized::round(&self.ctx, &mut self.rng),
            };
            if clean {
                self.failing = 0;
                continue;
            }
            self.failing += 1;
            // A session that keeps failing starts afresh, as a client library would.
            if self.failing >= 3 {
                self.router.reset();
            }
            // Paces retries while walrus restores or refuses writes (workload, not sync).
            std::thread::sleep(Duration::from_millis(10 + self.rng.below(40)));
        }
    }

    fn below(&mut self, n: usize) -> usize {
        self.rng.below(n as u64) as usize
    }

    /// Sends `cmds` as one pipeline, each where its key lives (`route.rs`); `None` once the
    /// run stops.
    fn exchange(&mut self, cmds: &[Cmd]) -> Option<Vec<Reply>> {
        self.router.exchange(cmds, Batch::Pipeline)
    }

    /// `n` RPUSHes of 1 to 3 elements each, registered: their elements, and the commands.
    fn pushes(&mut self, n: usize) -> (Vec<Vec<u32>>, Vec<Cmd>) {
        let mut pushes = Vec::with_capacity(n);
        let mut cmds = Vec::with_capacity(n);
        for _ in 0..n {
            let key = self.below(LISTS);
            let k = 1 + self.below(3);
            let elems = self.ctx.h().appends("RPUSH", &vec![key; k]);
            let mut c = cmd(&["RPUSH", &list_key(key)]);
            c.extend(elems.iter().map(|e| format!("e{e}").into_bytes()));
            cmds.push(c);
            pushes.push(elems);
        }
        (pushes, cmds)
    }

    /// `n` RPUSHes sent at once.
    fn appends(&mut self, n: usize, op: &str) -> bool {
        let (pushes, cmds) = self.pushes(n);
        self.ctx.h().count(op);
        let Some(replies) = self.exchange(&cmds) else {
            let mut h = self.ctx.h();
            pushes.iter().for_each(|p| h.unknown(p));
            return true;
        };
        let mut h = self.ctx.h();
        let mut clean = true;
        for ((elems, reply), c) in pushes.iter().zip(replies).zip(&cmds) {
            clean &= settle_push(&mut h, elems, reply, c);
        }
        clean
    }

    /// A pipeline of RPUSHes, then the connection closed without reading a reply: walrus
    /// must not let a write of a vanished client show before it is durable either.
    fn abandon(&mut self) -> bool {
        let n = 1 + self.below(4);
        let (pushes, cmds) = self.pushes(n);
        self.ctx.h().count("op: pipeline abandoned");
        self.router.abandon(&cmds);
        let mut h = self.ctx.h();
        pushes.iter().for_each(|p| h.unknown(p));
        true
    }

    fn script(&mut self) -> bool {
        let key = self.below(LISTS);
        let elems = self.ctx.h().appends("EVAL", &[key]);
        self.ctx.h().count("op: script");
        let c = cmd(&[
            "EVAL",
            SCRIPT,
            "1",
            &list_key(key),
            &format!("e{}", elems[0]),
        ]);
        let Some(mut replies) = self.exchange(std::slice::from_ref(&c)) else {
            self.ctx.h().unknown(&elems);
            return true;
        };
        settle_push(&mut self.ctx.h(), &elems, replies.remove(0), &c)
    }

    /// MULTI, RPUSH to two lists, EXEC (`transactions.rs`): pipelined or one command at a
    /// time.
    fn transaction(&mut self) -> bool {
        let kind = match self.below(5) {
            0 => TxKind::Watch,
            1 => TxKind::Refused,
            2 => TxKind::WithRead,
            _ => TxKind::Plain,
        };
        let stepwise = self.below(2) == 0;
        // Two lists of one tag: a cluster runs a transaction on one slot only.
        let k1 = self.below(LISTS);
        let others = &same_tag(k1, LISTS)[1..];
        let k2 = others[self.below(others.len())];
        let (elems, send_ts) = {
            let mut h = self.ctx.h();
            h.count(kind.name());
            let elems = h.appends("MULTI/EXEC", &[k1, k2]);
            let send_ts = h.elems[elems[0] as usize].send_ts;
            (elems, send_ts)
        };
        let (tx, cmds) = Tx::new(kind, [elems[0], elems[1]], [k1, k2], send_ts);
        let replies = self.router.exchange(&cmds, Batch::Transaction { stepwise });
        let Some(replies) = replies else {
            self.ctx.h().unknown(&elems);
            return true;
        };
        let clean = tx.settle(&mut self.ctx.h(), &cmds, replies);
        if !clean {
            // The connection may still be inside MULTI, or WATCHing.
            self.router.reset();
        }
        clean
    }

    /// One to four reads, pipelined, each checked against the history.
    fn reads(&mut self) -> bool {
        let n = 1 + self.below(4);
        let ops: Vec<ReadOp> = (0..n).map(|_| ReadOp::random(&mut self.rng)).collect();
        let cmds: Vec<Cmd> = ops.iter().map(ReadOp::command).collect();
        let send_ts = {
            let mut h = self.ctx.h();
            h.count(if n > 1 {
                "op: read pipeline"
            } else {
                "op: read"
            });
            h.tick()
        };
        let Some(replies) = self.exchange(&cmds) else {
            return true;
        };
        let mut h = self.ctx.h();
        let mut clean = true;
        for ((op, reply), c) in ops.iter().zip(replies).zip(&cmds) {
            let frame = match reply {
                Reply::Frame(f) => f,
                Reply::Error(e) => {
                    h.error(&describe(c), &e);
                    clean = false;
                    continue;
                }
                Reply::Lost => {
                    clean = false;
                    continue;
                }
            };
            op.observe(&mut h, send_ts, frame, c);
        }
        clean
    }

    fn push(&mut self) -> bool {
        let queue = self.below(QUEUES);
        let job = {
            let mut h = self.ctx.h();
            h.count("op: queue push");
            h.new_job(queue)
        };
        let c = cmd(&["RPUSH", &queue_key(queue), &format!("j{job}")]);
        let Some(mut replies) = self.exchange(std::slice::from_ref(&c)) else {
            self.ctx.h().job_pushed(job, false);
            return true;
        };
        let mut h = self.ctx.h();
        match replies.remove(0) {
            Reply::Frame(OwnedFrame::Integer(_)) => {
                h.job_pushed(job, true);
                return true;
            }
            Reply::Error(e) => h.error(&describe(&c), &e),
            Reply::Lost => {}
            Reply::Frame(f) => h.unexpected(&describe(&c), &f),
        }
        h.job_pushed(job, false);
        false
    }

    /// BLPOP or BLMPOP of one or more queues of one tag (one slot), or BLMOVE of one to the
    /// tag's done list, with a short timeout.
    fn pop(&mut self) -> bool {
        let queues = same_tag(self.below(QUEUES), QUEUES);
        let n = 1 + self.below(queues.len());
        let names: Vec<String> = queues[..n].iter().map(|&q| queue_key(q)).collect();
        let (c, moved_from) = match self.below(4) {
            0 => {
                let done = done_key(tag(queues[0]));
                let c = cmd(&["BLMOVE", &names[0], &done, "LEFT", "RIGHT", "0.5"]);
                (c, Some(names[0].clone()))
            }
            1 => {
                let mut c = cmd(&["BLMPOP", "0.5", &n.to_string()]);
                c.extend(names.iter().map(|q| q.clone().into_bytes()));
                c.extend(cmd(&["LEFT", "COUNT", "1"]));
                (c, None)
            }
            _ => {
                let mut c = cmd(&["BLPOP"]);
                c.extend(names.iter().map(|q| q.clone().into_bytes()));
                c.push(b"0.5".to_vec());
                (c, None)
            }
        };
        let sent = {
            let mut h = self.ctx.h();
            h.count(&format!(
                "op: queue pop, {}",
                String::from_utf8_lossy(&c[0])
            ));
            h.stamp()
        };
        let Some(mut replies) = self.exchange(std::slice::from_ref(&c)) else {
            return true;
        };
        settle_pop(
            &mut self.ctx.h(),
            &c,
            replies.remove(0),
            &sent,
            moved_from.as_deref(),
        )
    }

    /// INCR of one of the shared counters (`counters.rs`).
    fn incr(&mut self) -> bool {
        let c = self.below(COUNTERS);
        let send_ts = {
            let mut h = self.ctx.h();
            h.count("op: counter increment");
            h.incr_sent(c)
        };
        let incr = cmd(&["INCR", &counter_key(c)]);
        let reply = match self.exchange(std::slice::from_ref(&incr)) {
            Some(mut replies) => replies.remove(0),
            // Never sent (the run stopped): its fate is unknown all the same.
            None => Reply::Lost,
        };
        self.ctx.h().settle_incr(c, send_ts, reply, &incr)
    }

    fn publish(&mut self) -> bool {
        let m = {
            let mut h = self.ctx.h();
            h.count("op: publish");
            h.new_msg(self.id)
        };
        let c = cmd(&["PUBLISH", CHANNEL, &format!("m{m}")]);
        let Some(mut replies) = self.exchange(std::slice::from_ref(&c)) else {
            return true;
        };
        let mut h = self.ctx.h();
        match replies.remove(0) {
            Reply::Frame(OwnedFrame::Integer(_)) => {
                h.published(m);
                return true;
            }
            Reply::Error(e) => h.error(&describe(&c), &e),
            Reply::Lost => {}
            Reply::Frame(f) => h.unexpected(&describe(&c), &f),
        }
        false
    }

    /// A new version, 64 KiB to 1 MiB, of one of this worker's large values; rarely, a
    /// transaction of them larger than a journal entry.
    fn large(&mut self) -> bool {
        let write = {
            let mut h = self.ctx.h();
            match self.rng.below(20) {
                0 => LargeWrite::huge_transaction(&mut h, self.id),
                _ => LargeWrite::single(&mut h, self.id, &mut self.rng),
            }
        };
        let batch = match write.cmds.len() {
            1 => Batch::Pipeline,
            _ => Batch::Transaction { stepwise: false },
        };
        // A transaction too large for one journal entry takes a full resync: writes sent
        // meanwhile may be durable without a journal write (`release.rs`).
        let huge = write.cmds.len() > 1;
        if huge {
            self.ctx.h().release.begin();
        }
        // Never sent (the run stopped): as good as lost.
        let replies = self
            .router
            .exchange(&write.cmds, batch)
            .unwrap_or_else(|| write.cmds.iter().map(|_| Reply::Lost).collect());
        if huge {
            self.ctx.h().release.end();
        }
        let clean = write.settle(&mut self.ctx.h(), replies);
        if !clean && write.cmds.len() > 1 {
            // The connection may still be inside MULTI.
            self.router.reset();
        }
        clean
    }
}

/// The string items of an array reply.
pub fn bulks(items: Vec<OwnedFrame>) -> Option<Vec<Vec<u8>>> {
    items
        .into_iter()
        .map(|f| match f {
            OwnedFrame::BulkString(b) => Some(b),
            _ => None,
        })
        .collect()
}

/// An RPUSH's (or the append script's) reply: acknowledged at the list's length, or unknown.
pub fn settle_push(h: &mut History, elems: &[u32], reply: Reply, c: &Cmd) -> bool {
    match reply {
        Reply::Frame(OwnedFrame::Integer(n)) => {
            h.ack_push(elems, n);
            return true;
        }
        Reply::Error(e) => h.error(&describe(c), &e),
        Reply::Lost => {}
        Reply::Frame(f) => h.unexpected(&describe(c), &f),
    }
    h.unknown(elems);
    false
}

/// A pop's reply (BLPOP's `[queue, job]`, BLMPOP's `[queue, [job]]`, BLMOVE's job, from
/// the queue `moved_from`): a job popped, nothing (timed out), or a pop that may have
/// happened. `sent`: the pop's stamp.
pub fn settle_pop(
    h: &mut History,
    c: &Cmd,
    reply: Reply,
    sent: &Stamp,
    moved_from: Option<&str>,
) -> bool {
    match reply {
        Reply::Frame(OwnedFrame::BulkString(job)) if moved_from.is_some() => {
            h.popped(moved_from.unwrap().as_bytes(), &job, sent, true);
            return true;
        }
        Reply::Frame(OwnedFrame::Array(mut kv)) if kv.len() == 2 => {
            let job = match kv.pop().unwrap() {
                OwnedFrame::Array(mut one) if one.len() == 1 => one.pop().unwrap(),
                job => job,
            };
            if let (OwnedFrame::BulkString(job), OwnedFrame::BulkString(key)) =
                (job, kv.pop().unwrap())
            {
                h.popped(&key, &job, sent, false);
                return true;
            }
            h.unexpected(&describe(c), &"a pair of non-strings");
        }
        Reply::Frame(OwnedFrame::Null) => return true,
        Reply::Error(e) => h.error(&describe(c), &e),
        Reply::Lost => {}
        Reply::Frame(f) => h.unexpected(&describe(c), &f),
    }
    h.pop_unknown();
    false
}
