//! How a client reaches its keys. In cluster mode, as a cluster client does: each command
//! goes to the walrus of its key's slot as far as the client knows (MOVED replies teach it),
//! keyless ones to any walrus; `-MOVED <slot> <addr>` is followed to that walrus and
//! remembered, `-ASK <slot> <addr>` is followed once, with ASKING before the command there.
//! Every address a client is sent to must be a walrus's: any other would take it around the
//! journal (a violation). Outside cluster mode every command goes to the one walrus, and a
//! redirect is a violation too.

use crate::common::Rng;
use crate::conn::{cmd, Cmd, Conn, Reply};
use crate::keys::{routing_key, slot};
use crate::shared::Ctx;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Redirects followed for one command at most: enough for a slot that moved while the
/// nodes' views of it settle. The reply to the last one stands (an error: outcome unknown).
const MAX_HOPS: usize = 5;

/// How the commands of one exchange relate.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    /// Independent commands sent together: each goes where its key lives, and is redirected
    /// on its own.
    Pipeline,
    /// A transaction (WATCH, MULTI ... EXEC): all on one connection, where its keys live;
    /// sent again as a whole where a redirect says, but only once its EXEC failed (then none
    /// of it ran). `stepwise`: each command after the previous one's reply.
    Transaction { stepwise: bool },
    /// One command that may wait as long as it likes (`BLPOP ... 0`): no hang bound.
    Blocking,
}

#[derive(Clone, Copy)]
enum Send {
    Pipelined,
    Stepwise,
    UntilStop,
}

/// A redirect: `-MOVED <slot> <addr>` or `-ASK <slot> <addr>`.
struct Redirect {
    ask: bool,
    slot: u16,
    addr: String,
}

/// One client's connections (one per walrus) and what it learned of the slots.
pub struct Router {
    ctx: Arc<Ctx>,
    rng: Rng,
    /// Where each slot lives, as MOVED replies said.
    slots: HashMap<u16, String>,
    conns: HashMap<String, Conn>,
    /// Its connections speak RESP3.
    resp3: bool,
}

impl Router {
    pub fn new(ctx: Arc<Ctx>, seed: u64) -> Router {
        Router {
            ctx,
            rng: Rng(seed),
            slots: HashMap::new(),
            conns: HashMap::new(),
            resp3: false,
        }
    }

    /// The same, its connections speaking RESP3 (`HELLO 3` first).
    pub fn resp3(mut self) -> Router {
        self.resp3 = true;
        self
    }

    /// Drops every connection: a session that keeps failing starts afresh, as a client
    /// library's would, and one perhaps left inside MULTI, or WATCHing, is not reused.
    pub fn reset(&mut self) {
        self.conns.clear();
    }

    /// Sends `cmds` and returns their replies, redirects followed; `None` once the run stops.
    pub fn exchange(&mut self, cmds: &[Cmd], batch: Batch) -> Option<Vec<Reply>> {
        match batch {
            Batch::Transaction { stepwise } => self.transaction(cmds, stepwise),
            Batch::Pipeline => self.pipeline(cmds, Send::Pipelined),
            Batch::Blocking => self.pipeline(cmds, Send::UntilStop),
        }
    }

    /// Sends `cmds` to the walrus at `addr`, whatever their keys; no redirect followed.
    pub fn exchange_at(&mut self, addr: &str, cmds: &[Cmd]) -> Option<Vec<Reply>> {
        self.send(addr, cmds, &vec![false; cmds.len()], Send::Pipelined)
    }

    /// Sends `cmds`, each where its key lives (no redirect followed), then closes those
    /// connections without reading a reply: a client that vanished.
    pub fn abandon(&mut self, cmds: &[Cmd]) {
        let home = self.home();
        for (addr, group) in groups(cmds.iter().map(|c| (self.addr_of(c, &home), c.clone()))) {
            if let Some(Some(conn)) = self.conn(&addr) {
                let _sent = conn.send(&group);
            }
            self.conns.remove(&addr);
        }
    }

    /// A random walrus: where the keyless commands of one exchange go.
    fn home(&mut self) -> String {
        let nodes = self.ctx.nodes();
        nodes[self.rng.below(nodes.len() as u64) as usize].clone()
    }

    /// Where `c` goes: its slot's walrus as far as known, else the current target (which
    /// redirects it); a keyless command to `home`, but PUBLISH to the target, where the
    /// subscribers listen: a cluster carries messages between its nodes on its bus, where
    /// they may overtake those published on the subscriber's node, or arrive after it
    /// subscribed (the Pub/Sub checks would take either for walrus's doing).
    fn addr_of(&self, c: &Cmd, home: &str) -> String {
        if c[0].eq_ignore_ascii_case(b"PUBLISH") {
            return self.ctx.target.get();
        }
        match routing_key(c) {
            Some(key) => self
                .slots
                .get(&slot(key))
                .cloned()
                .unwrap_or_else(|| self.ctx.target.get()),
            None => home.to_string(),
        }
    }

    fn pipeline(&mut self, cmds: &[Cmd], how: Send) -> Option<Vec<Reply>> {
        let home = self.home();
        let mut out: Vec<Option<Reply>> = cmds.iter().map(|_| None).collect();
        // (command, where it goes now, with ASKING before it)
        let mut todo: Vec<(usize, String, bool)> = (0..cmds.len())
            .map(|i| (i, self.addr_of(&cmds[i], &home), false))
            .collect();
        for hop in 0..=MAX_HOPS {
            let mut next = Vec::new();
            for (addr, group) in groups(todo.into_iter().map(|(i, a, ask)| (a, (i, ask)))) {
                let batch: Vec<Cmd> = group.iter().map(|&(i, _)| cmds[i].clone()).collect();
                let asking: Vec<bool> = group.iter().map(|&(_, ask)| ask).collect();
                let replies = self.send(&addr, &batch, &asking, how)?;
                for ((i, _), reply) in group.into_iter().zip(replies) {
                    match self.redirect(&reply) {
                        Some(to) if self.follow(&to, hop) => next.push((i, to.addr, to.ask)),
                        _ => out[i] = Some(reply),
                    }
                }
            }
            todo = next;
        }
        // The last hop follows nothing: every command has its reply.
        Some(out.into_iter().map(|r| r.expect("a reply")).collect())
    }

    fn transaction(&mut self, cmds: &[Cmd], stepwise: bool) -> Option<Vec<Reply>> {
        let home = self.home();
        let keyed = cmds.iter().find(|c| routing_key(c).is_some());
        let mut addr = keyed.map_or_else(|| home.clone(), |c| self.addr_of(c, &home));
        let mut asking = vec![false; cmds.len()];
        let how = if stepwise {
            Send::Stepwise
        } else {
            Send::Pipelined
        };
        for hop in 0..=MAX_HOPS {
            let replies = self.send(&addr, cmds, &asking, how)?;
            let redirects: Vec<Redirect> =
                replies.iter().filter_map(|r| self.redirect(r)).collect();
            // A redirected command inside MULTI makes EXEC fail (-EXECABORT), a redirected
            // EXEC discards the transaction: then nothing ran, and it may be sent again.
            // Any other outcome (it ran: a slot that moved in under it) stands.
            let not_run = matches!(replies.last(), Some(Reply::Error(e))
                if ["EXECABORT", "MOVED ", "ASK "].iter().any(|p| e.starts_with(p)));
            let to = match redirects.into_iter().next() {
                Some(to) if not_run && self.follow(&to, hop) => to,
                _ => return Some(replies),
            };
            addr = to.addr;
            asking = if to.ask {
                outside_multi(cmds)
            } else {
                vec![false; cmds.len()]
            };
        }
        unreachable!("the last hop follows nothing")
    }

    /// The redirect `reply` is, if it is one to a walrus. One to any other address is a
    /// violation (it would take the client around walrus's journal), and is not followed.
    fn redirect(&self, reply: &Reply) -> Option<Redirect> {
        let Reply::Error(e) = reply else {
            return None;
        };
        let (kind, rest) = e.split_once(' ')?;
        let ask = match kind {
            "MOVED" => false,
            "ASK" => true,
            _ => return None,
        };
        let (slot, addr) = rest.split_once(' ')?;
        if !self.ctx.is_walrus(addr) {
            self.ctx.h().violation(format!(
                "redirected around walrus: -{e} names {addr}, and the walruses are {:?}",
                self.ctx.nodes()
            ));
            return None;
        }
        Some(Redirect {
            ask,
            slot: slot.parse().ok()?,
            addr: addr.to_string(),
        })
    }

    /// Whether to follow `to` after `hop` hops (not after the last); MOVED is remembered
    /// for its slot.
    fn follow(&mut self, to: &Redirect, hop: usize) -> bool {
        let kind = if to.ask { "ASK" } else { "MOVED" };
        if hop == MAX_HOPS {
            let what = format!("redirect: {kind} not followed, {MAX_HOPS} hops made");
            self.ctx.h().count(&what);
            return false;
        }
        self.ctx.h().count(&format!("redirect: {kind} followed"));
        if !to.ask {
            self.slots.insert(to.slot, to.addr.clone());
        }
        true
    }

    /// Sends `cmds` to `addr` on one connection (ASKING before each that `asking` marks, its
    /// reply dropped) and returns their replies; `None` once the run stops. A connection
    /// that lost a reply, or whose session lost its upstream connection, is dropped.
    fn send(&mut self, addr: &str, cmds: &[Cmd], asking: &[bool], how: Send) -> Option<Vec<Reply>> {
        let mut wire = Vec::with_capacity(cmds.len());
        for (c, &ask) in cmds.iter().zip(asking) {
            if ask {
                wire.push(cmd(&["ASKING"]));
            }
            wire.push(c.clone());
        }
        let ctx = self.ctx.clone();
        let Some(conn) = self.conn(addr)? else {
            // An address walrus left (it restarted elsewhere): never sent, as good as lost.
            return Some(cmds.iter().map(|_| Reply::Lost).collect());
        };
        let replies = match how {
            Send::Pipelined => conn.call(&ctx, &wire),
            Send::UntilStop => conn.call_until_stop(&ctx, &wire),
            Send::Stepwise => {
                let mut out = Vec::with_capacity(wire.len());
                for c in &wire {
                    let reply = conn.call(&ctx, std::slice::from_ref(c)).remove(0);
                    let done = broken(&reply);
                    out.push(reply);
                    if done {
                        break;
                    }
                }
                out.resize_with(wire.len(), || Reply::Lost);
                out
            }
        };
        if replies.iter().any(broken) {
            self.conns.remove(addr);
        }
        let mut replies = replies.into_iter();
        let out = asking
            .iter()
            .map(|&ask| {
                if ask {
                    replies.next();
                }
                replies.next().expect("one reply per command")
            })
            .collect();
        Some(out)
    }

    /// The connection to `addr`, opened if need be, waiting while that walrus is away;
    /// `None` once the run stops (and it is away), `Some(None)` when walrus no longer
    /// listens there (outside cluster mode a restarted walrus listens elsewhere).
    fn conn(&mut self, addr: &str) -> Option<Option<&mut Conn>> {
        if !self.conns.contains_key(addr) {
            let c = loop {
                if let Some(c) = Conn::connect_as(addr, self.resp3) {
                    break c;
                }
                if self.ctx.stopping() {
                    return None;
                }
                if self.ctx.is_walrus(addr) {
                    // A cluster's walrus restarts on its own address: nothing to await but
                    // its return (connection retry pacing).
                    std::thread::sleep(Duration::from_millis(100));
                } else if self.ctx.target.get() == addr {
                    self.ctx
                        .target
                        .wait_change(addr, Duration::from_millis(100));
                } else {
                    return Some(None);
                }
            };
            self.conns.insert(addr.to_string(), c);
        }
        Some(self.conns.get_mut(addr))
    }
}

/// Items grouped by address, in the order each address first comes, each group in order.
fn groups<T>(items: impl Iterator<Item = (String, T)>) -> Vec<(String, Vec<T>)> {
    let mut out: Vec<(String, Vec<T>)> = Vec::new();
    for (addr, item) in items {
        match out.iter_mut().find(|(a, _)| *a == addr) {
            Some((_, group)) => group.push(item),
            None => out.push((addr, vec![item])),
        }
    }
    out
}

/// ASKING before each command of a transaction outside MULTI (WATCH, MULTI itself): Valkey
/// keeps the flag for the next command only, but once MULTI started, until EXEC.
fn outside_multi(cmds: &[Cmd]) -> Vec<bool> {
    let mut inside = false;
    cmds.iter()
        .map(|c| {
            let ask = !inside;
            match c[0].to_ascii_uppercase().as_slice() {
                b"MULTI" => inside = true,
                b"EXEC" | b"DISCARD" => inside = false,
                _ => {}
            }
            ask
        })
        .collect()
}

/// A lost reply, or a session whose dedicated upstream connection is gone (it answers errors
/// until RESET): that connection is done.
fn broken(r: &Reply) -> bool {
    match r {
        Reply::Lost => true,
        Reply::Error(e) => e.contains("dedicated connection was lost"),
        Reply::Frame(_) => false,
    }
}
