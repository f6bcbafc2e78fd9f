//! Registers: keys written by commands of several keys at once. Each worker owns
//! `REG_KEYS` string keys and is their only writer, one request at a time: MSET of two or
//! three of them (each value unique), or DEL or UNLINK of two or three that exist. So each
//! key's states form one sequence, the writer's operations in the order it sent them. Any
//! worker reads them with MGET and EXISTS of several keys (those of one tag), and every
//! sight is checked against that sequence: a read sent after an operation's acknowledgement
//! shows it or a later one; no read shows an operation that did not run; a state once seen
//! never goes back, at the end neither; and nothing shows an operation before the journal
//! can hold it (`release.rs`): a DEL of `a b` whose last key walrus forgot to mark dirty is
//! seen at once.

use crate::common::Rng;
use crate::conn::{cmd, describe, Cmd, Conn, Reply, Wait, HANG_BOUND};
use crate::history::{parse_id, Fate, History, NEVER};
use crate::keys::{tag, TAGS};
use crate::release::{Seen, Stamp};
use crate::route::{Batch, Router};
use crate::shared::Ctx;
use crate::workers::WORKERS;
use redis_protocol::resp2::types::OwnedFrame;
use std::time::Instant;

/// Keys per worker.
pub const REG_KEYS: usize = 3;

/// Every register key, as the final read and the keyspace checks know them.
pub fn keys() -> Vec<String> {
    (0..WORKERS * REG_KEYS).map(reg_key).collect()
}

/// Register `r` (worker `r / REG_KEYS`'s key `r % REG_KEYS`), of its worker's tag.
pub fn reg_key(r: usize) -> String {
    let w = r / REG_KEYS;
    format!("{{{}}}:r{w}:{}", TAGS[tag(w)], r % REG_KEYS)
}

/// What one operation did to one key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Write {
    /// Set it to value `v<n>`.
    Set(u32),
    /// Deleted it (DEL or UNLINK).
    Del,
}

struct Op {
    write: Write,
    ack_ts: u64,
    fate: Fate,
    sent: Stamp,
}

/// One register key: its operations in order (state i is the one after operation i; state 0
/// is no key), and the highest state a read showed.
#[derive(Default)]
pub struct Reg {
    ops: Vec<Op>,
    max_seen: usize,
}

pub fn all() -> Vec<Reg> {
    (0..WORKERS * REG_KEYS).map(|_| Reg::default()).collect()
}

impl Reg {
    /// Whether the key exists in state `i`.
    fn exists(&self, i: usize) -> bool {
        i > 0 && matches!(self.ops[i - 1].write, Write::Set(_))
    }

    /// The states a request sent at `send_ts` may see: from the last acknowledged before it
    /// to the last sent, but those of operations that did not run.
    fn allowed(&self, send_ts: u64) -> impl Iterator<Item = usize> + '_ {
        let need = self
            .ops
            .iter()
            .rposition(|o| o.ack_ts < send_ts)
            .map_or(0, |i| i + 1);
        (need..=self.ops.len()).filter(|&i| i == 0 || self.ops[i - 1].fate != Fate::NotRun)
    }

    /// Whether state `i` may be durable when `seen` (state 0 always is).
    fn durable(&self, i: usize, seen: &Seen) -> bool {
        i == 0 || !crate::release::Release::too_soon(&self.ops[i - 1].sent, seen)
    }

    /// Whether its last operation is an acknowledged SET: it exists.
    fn known_to_exist(&self) -> bool {
        self.ops
            .last()
            .is_some_and(|o| o.fate == Fate::Acked && matches!(o.write, Write::Set(_)))
    }
}

impl History {
    /// Registers operation `write` on register `r`, about to be sent.
    fn reg_op(&mut self, r: usize, write: Write) {
        let sent = self.stamp();
        self.regs[r].ops.push(Op {
            write,
            ack_ts: NEVER,
            fate: Fate::Pending,
            sent,
        });
    }

    /// The last operations of `regs` (one request's) ended with `fate`, stamped together.
    fn reg_settled(&mut self, regs: &[usize], fate: Fate) {
        let ts = self.tick();
        for &r in regs {
            let op = self.regs[r].ops.last_mut().expect("registered");
            op.fate = fate;
            if fate == Fate::Acked {
                op.ack_ts = ts;
            }
        }
        let what = match fate {
            Fate::Acked => "ack: register write",
            _ => "unknown: register write",
        };
        self.count_n(what, regs.len() as u64);
        if fate == Fate::Acked {
            for &r in regs {
                let sent = self.regs[r].ops.last().expect("registered").sent;
                self.reveals(&sent, |_| {
                    format!("the acknowledgement of a write of {}", reg_key(r))
                });
            }
        }
    }

    /// A read of register `r` sent at `send_ts` showed `value` (`None`: no key) at `seen`.
    fn observe_reg(
        &mut self,
        r: usize,
        send_ts: u64,
        value: Option<&[u8]>,
        seen: &Seen,
        what: &str,
    ) {
        self.count("check: register read");
        let key = reg_key(r);
        let reg = &self.regs[r];
        let allowed: Vec<usize> = reg.allowed(send_ts).collect();
        let state = match value {
            Some(v) => {
                let id = parse_id(v, b'v').filter(|&id| id < self.reg_values.len());
                let Some((_, i)) = id.map(|id| self.reg_values[id]).filter(|&(k, _)| k == r) else {
                    return self.violation(format!(
                        "phantom: {what} of {key} shows {:?}, which nobody wrote there",
                        String::from_utf8_lossy(v)
                    ));
                };
                let i = i + 1;
                if reg.ops[i - 1].fate == Fate::NotRun {
                    return self.violation(format!(
                        "aborted write visible: {what} of {key} shows a write that did not run"
                    ));
                }
                if !allowed.contains(&i) {
                    return self.violation(format!(
                        "stale read: {what} of {key} sent at t={send_ts} shows its write {i}, but \
                         write {} was acknowledged before",
                        allowed[0]
                    ));
                }
                if !reg.durable(i, seen) {
                    let sent = reg.ops[i - 1].sent;
                    self.revealed_at(&sent, seen, |_| {
                        format!("{what} of {key} showed its write {i}")
                    });
                }
                i
            }
            None => {
                let absent: Vec<usize> = allowed
                    .iter()
                    .copied()
                    .filter(|&i| !reg.exists(i))
                    .collect();
                let Some(&first) = absent.first() else {
                    return self.violation(format!(
                        "stale read: {what} of {key} sent at t={send_ts} finds no key, but its write \
                         {} (a SET) was acknowledged before, and only SETs were sent since",
                        allowed[0]
                    ));
                };
                if !absent.iter().any(|&i| reg.durable(i, seen)) {
                    let sent = reg.ops[first - 1].sent;
                    self.revealed_at(&sent, seen, |_| {
                        format!("{what} of {key} found no key, deleted by its write {first}")
                    });
                }
                first
            }
        };
        let reg = &mut self.regs[r];
        reg.max_seen = reg.max_seen.max(state);
    }

    /// An EXISTS of `regs` sent at `send_ts` counted `n` at `seen`.
    fn observe_exists(&mut self, regs: &[usize], send_ts: u64, n: i64, seen: &Seen) {
        self.count("check: register count");
        // The fewest and most keys that may exist, of any allowed state, and of those that
        // may be durable.
        let (mut lo, mut hi, mut dlo, mut dhi) = (0, 0, 0, 0);
        for &r in regs {
            let reg = &self.regs[r];
            let states: Vec<(bool, bool)> = reg
                .allowed(send_ts)
                .map(|i| (reg.exists(i), reg.durable(i, seen)))
                .collect();
            lo += states.iter().all(|s| s.0) as i64;
            hi += states.iter().any(|s| s.0) as i64;
            let durable: Vec<bool> = states.iter().filter(|s| s.1).map(|s| s.0).collect();
            dlo += (!durable.is_empty() && durable.iter().all(|&e| e)) as i64;
            dhi += durable.iter().any(|&e| e) as i64;
        }
        let keys: Vec<String> = regs.iter().map(|&r| reg_key(r)).collect();
        if n < lo || n > hi {
            return self.violation(format!(
                "stale read: EXISTS {} sent at t={send_ts} counted {n}, but between {lo} and {hi} \
                 of them exist in any state it may see",
                keys.join(" ")
            ));
        }
        if n < dlo || n > dhi {
            // The newest write among them was not durable, at least.
            let newest = regs
                .iter()
                .filter_map(|&r| self.regs[r].ops.last().map(|o| o.sent))
                .max_by_key(|s| s.at);
            if let Some(s) = newest {
                self.revealed_at(&s, seen, |_| {
                    format!(
                        "EXISTS {} counted {n}, where the writes that may be durable leave between \
                         {dlo} and {dhi}",
                        keys.join(" ")
                    )
                });
            }
        }
    }

    /// The final value of every register (`None`: no key): its last acknowledged write or a
    /// later one, and no older than any read saw.
    pub fn final_regs(&mut self, values: &[Option<Vec<u8>>]) {
        for o in self.regs.iter_mut().flat_map(|r| r.ops.iter_mut()) {
            if o.fate == Fate::Pending {
                o.fate = Fate::Unknown;
            }
        }
        let mut found = Vec::new();
        for (r, value) in values.iter().enumerate() {
            let key = reg_key(r);
            let reg = &self.regs[r];
            let allowed: Vec<usize> = reg.allowed(NEVER).collect();
            let state = match value {
                Some(v) => parse_id(v, b'v')
                    .filter(|&id| id < self.reg_values.len() && self.reg_values[id].0 == r)
                    .map(|id| self.reg_values[id].1 + 1),
                None => allowed.iter().copied().rfind(|&i| !reg.exists(i)),
            };
            let Some(state) = state.filter(|i| allowed.contains(i)) else {
                found.push(format!(
                    "lost acknowledged write: the final {key} is {:?}, not write {} (acknowledged) \
                     or a later one",
                    value.as_deref().map(String::from_utf8_lossy),
                    allowed[0]
                ));
                continue;
            };
            if state < reg.max_seen {
                found.push(format!(
                    "dirty read: a read of {key} showed its write {}, the final state is write \
                     {state}",
                    reg.max_seen
                ));
            }
        }
        self.count_n("check: register", values.len() as u64);
        self.report(found);
    }
}

/// The registers of one tag: every worker's of that tag.
fn of_tag(t: usize) -> Vec<usize> {
    (0..WORKERS * REG_KEYS)
        .filter(|r| tag(r / REG_KEYS) == t)
        .collect()
}

/// Two or three distinct items of `from`, at random.
fn some(rng: &mut Rng, from: &[usize]) -> Vec<usize> {
    let n = (2 + rng.below(2) as usize).min(from.len());
    let mut pool = from.to_vec();
    (0..n)
        .map(|_| pool.remove(rng.below(pool.len() as u64) as usize))
        .collect()
}

/// One write of worker `w` to its registers: DEL or UNLINK of two or three that are known
/// to exist, else MSET of two or three.
pub fn write(router: &mut Router, ctx: &Ctx, rng: &mut Rng, w: usize) -> bool {
    let (regs, c, del) = next_write(ctx, rng, w);
    let reply = router
        .exchange(std::slice::from_ref(&c), Batch::Pipeline)
        .map_or(Reply::Lost, |mut r| r.remove(0));
    settle_write(ctx, &regs, &c, del, reply)
}

/// The same write, and right behind it, on a session of its own ([`pinned`]), an MGET of
/// another worker's register and the write's last key, both sent before either reply is
/// read: the read runs while the write is not durable yet, and must wait for it, though
/// only its last key (and the write's last) says so. Not in cluster mode (both connections
/// go to the one walrus).
pub fn write_chased(pair: &mut Option<(Conn, Conn)>, ctx: &Ctx, rng: &mut Rng, w: usize) -> bool {
    if pair.is_none() {
        *pair = Conn::open(ctx).zip(pinned(ctx));
    }
    let Some((a, b)) = pair.as_mut() else {
        return true;
    };
    let (regs, c, del) = next_write(ctx, rng, w);
    let last = *regs.last().expect("two or three");
    let others: Vec<usize> = of_tag(tag(w))
        .into_iter()
        .filter(|r| r / REG_KEYS != w)
        .collect();
    let read_regs = [others[rng.below(others.len() as u64) as usize], last];
    let mut read = cmd(&["MGET"]);
    read.extend(read_regs.iter().map(|&r| reg_key(r).into_bytes()));
    let send_ts = {
        let mut h = ctx.h();
        h.count("op: register write chased by a read");
        h.tick()
    };
    let deadline = Instant::now() + HANG_BOUND;
    let sent =
        a.send(std::slice::from_ref(&c)).is_ok() && b.send(std::slice::from_ref(&read)).is_ok();
    let reply = |conn: &mut Conn, what: &Cmd| match conn.reply(deadline) {
        Ok(r) => r,
        Err(Wait::TimedOut) => {
            ctx.h().violation(format!(
                "hang: no reply to `{}` within {HANG_BOUND:?}",
                describe(what)
            ));
            Reply::Lost
        }
        Err(Wait::Closed) => Reply::Lost,
    };
    let (written, seen) = match sent {
        true => (reply(a, &c), reply(b, &read)),
        false => (Reply::Lost, Reply::Lost),
    };
    let lost = matches!(written, Reply::Lost) || matches!(seen, Reply::Lost);
    let clean = settle_write(ctx, &regs, &c, del, written);
    let read_clean = observe_read(&mut ctx.h(), &read_regs, true, &read, send_ts, seen);
    if lost {
        *pair = None;
    }
    clean && read_clean
}

/// A session of its own: RESP3 with CLIENT TRACKING on (whose invalidations its replies
/// pass over), which walrus serves on a dedicated connection to Valkey. Its reads are never
/// in a batch with another client's write, which walrus holds whole.
fn pinned(ctx: &Ctx) -> Option<Conn> {
    let mut c = Conn::connect_as(&ctx.target.get(), true)?;
    let on = cmd(&["CLIENT", "TRACKING", "on"]);
    matches!(c.call(ctx, &[on]).remove(0), Reply::Frame(_)).then_some(c)
}

/// Registers worker `w`'s next write (see [`write`]): its registers, its command, and
/// whether it deletes.
fn next_write(ctx: &Ctx, rng: &mut Rng, w: usize) -> (Vec<usize>, Cmd, bool) {
    let mine: Vec<usize> = (w * REG_KEYS..(w + 1) * REG_KEYS).collect();
    {
        let mut h = ctx.h();
        let existing: Vec<usize> = mine
            .iter()
            .copied()
            .filter(|&r| h.regs[r].known_to_exist())
            .collect();
        h.tick();
        if existing.len() >= 2 && rng.below(2) == 0 {
            let regs = some(rng, &existing);
            let name = if rng.below(2) == 0 { "DEL" } else { "UNLINK" };
            h.count(&format!("op: register {name}"));
            let mut c = cmd(&[name]);
            for &r in &regs {
                h.reg_op(r, Write::Del);
                c.push(reg_key(r).into_bytes());
            }
            (regs, c, true)
        } else {
            let regs = some(rng, &mine);
            h.count("op: register MSET");
            let mut c = cmd(&["MSET"]);
            for &r in &regs {
                let id = h.reg_values.len() as u32;
                let i = h.regs[r].ops.len();
                h.reg_values.push((r, i));
                h.reg_op(r, Write::Set(id));
                c.push(reg_key(r).into_bytes());
                c.push(format!("v{id}").into_bytes());
            }
            (regs, c, false)
        }
    }
}

/// What a register write's reply says.
fn settle_write(ctx: &Ctx, regs: &[usize], c: &Cmd, del: bool, reply: Reply) -> bool {
    let mut h = ctx.h();
    match reply {
        Reply::Frame(OwnedFrame::Integer(n)) if del => {
            h.reg_settled(regs, Fate::Acked);
            if n != regs.len() as i64 {
                h.violation(format!(
                    "lost acknowledged write: `{}` deleted {n} keys, but every one of them was \
                     set by an acknowledged write",
                    describe(c)
                ));
            }
            return true;
        }
        Reply::Frame(OwnedFrame::SimpleString(s)) if !del && s == b"OK" => {
            h.reg_settled(regs, Fate::Acked);
            return true;
        }
        Reply::Error(e) => h.error(&describe(c), &e),
        Reply::Lost => {}
        Reply::Frame(f) => h.unexpected(&describe(c), &f),
    }
    h.reg_settled(regs, Fate::Unknown);
    false
}

/// MGET or EXISTS of two or three registers of one tag (any worker's).
pub fn read(router: &mut Router, ctx: &Ctx, rng: &mut Rng) -> bool {
    read_with(ctx, rng, |c| {
        router
            .exchange(std::slice::from_ref(c), Batch::Pipeline)
            .map_or(Reply::Lost, |mut r| r.remove(0))
    })
}

/// The same, sent with `exchange` (on a session of its own, say).
pub fn read_with(ctx: &Ctx, rng: &mut Rng, exchange: impl FnOnce(&Cmd) -> Reply) -> bool {
    let tagged = of_tag(rng.below(TAGS.len() as u64) as usize);
    let regs = some(rng, &tagged);
    let mget = rng.below(2) == 0;
    let mut c: Cmd = cmd(&[if mget { "MGET" } else { "EXISTS" }]);
    c.extend(regs.iter().map(|&r| reg_key(r).into_bytes()));
    let send_ts = {
        let mut h = ctx.h();
        h.count(if mget {
            "op: register MGET"
        } else {
            "op: register EXISTS"
        });
        h.tick()
    };
    let reply = exchange(&c);
    observe_read(&mut ctx.h(), &regs, mget, &c, send_ts, reply)
}

/// What an MGET (`mget`) or EXISTS of `regs`, sent at `send_ts`, showed.
fn observe_read(
    h: &mut History,
    regs: &[usize],
    mget: bool,
    c: &Cmd,
    send_ts: u64,
    reply: Reply,
) -> bool {
    let seen = h.seen();
    match reply {
        Reply::Frame(OwnedFrame::Array(items)) if mget && items.len() == regs.len() => {
            for (&r, item) in regs.iter().zip(items) {
                match item {
                    OwnedFrame::BulkString(v) => h.observe_reg(r, send_ts, Some(&v), &seen, "MGET"),
                    OwnedFrame::Null => h.observe_reg(r, send_ts, None, &seen, "MGET"),
                    f => h.unexpected(&describe(c), &f),
                }
            }
            true
        }
        Reply::Frame(OwnedFrame::Integer(n)) if !mget => {
            h.observe_exists(regs, send_ts, n, &seen);
            true
        }
        Reply::Error(e) => {
            h.error(&describe(c), &e);
            false
        }
        Reply::Lost => false,
        Reply::Frame(f) => {
            h.unexpected(&describe(c), &f);
            false
        }
    }
}
