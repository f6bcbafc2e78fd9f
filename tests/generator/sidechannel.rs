//! Side channels, checked against durability (not in cluster mode, where keys move and
//! notifications stay on their node): a subscriber to keyspace notifications of the lists
//! (`CONFIG SET notify-keyspace-events Kl`, then `PSUBSCRIBE __keyspace@0__:{gen*`, in
//! RESP2 or RESP3), a RESP3 client with `CLIENT TRACKING on` that reads the lists and
//! waits for their invalidations, and one in OPTIN mode that asks for each read to be
//! tracked (`CLIENT CACHING yes`) right behind a write. A notification or an invalidation of a list tells that a
//! write to it ran after the subscription (or the tracked read): it must come no sooner than
//! one such write may be durable (`release.rs`), since it reveals that write as a read
//! would.

use crate::common::Rng;
use crate::conn::{cmd, parse, parse3, Conn, Reply, Wait, HANG_BOUND};
use crate::history::{Fate, History, LISTS};
use crate::keys::list_key;
use crate::registers;
use crate::shared::Ctx;
use crate::workers::bulks;
use redis_protocol::resp2::types::OwnedFrame;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const PATTERN: &str = "__keyspace@0__:{gen*";
const PREFIX: &str = "__keyspace@0__:";

impl History {
    /// `what` named list `key` at once: some write to it ran after `since` (a
    /// subscription's or a tracked read's send time), so one whose client had not learned
    /// its fate by then. One of them must be old enough to be durable.
    pub fn notified(&mut self, key: usize, since: u64, what: &str) {
        self.count("check: side channel message");
        let seen = self.seen();
        let mut oldest = None;
        for &e in self.lists[key].sent.iter().rev() {
            let el = &self.elems[e as usize];
            if el.fate == Fate::NotRun || el.settled_ts < since {
                continue;
            }
            if !crate::release::Release::too_soon(&el.sent, &seen) {
                return;
            }
            oldest = Some(el.sent);
        }
        if let Some(sent) = oldest {
            self.revealed_at(&sent, &seen, |_| {
                format!(
                    "{what} of {} (the oldest write it may be for)",
                    list_key(key)
                )
            });
        }
    }
}

/// The list a key names, if it is one of database 0's.
fn list_of(key: &[u8]) -> Option<usize> {
    (0..LISTS).find(|&k| list_key(k).as_bytes() == key)
}

/// Subscribes to the lists' keyspace notifications for 0.5 to 3 s at a time, in RESP2 or
/// RESP3, on a new connection each time.
pub fn notifications(ctx: std::sync::Arc<Ctx>, seed: u64) {
    let mut rng = Rng(seed);
    while !ctx.stopping() {
        let resp3 = rng.below(2) == 0;
        let Some(mut conn) = Conn::open(&ctx).and_then(|c| protocol(c, &ctx, resp3)) else {
            continue;
        };
        let session = Duration::from_millis(500 + rng.below(2500));
        // Valkey forgets the setting when it restarts: set it every time.
        let config = cmd(&["CONFIG", "SET", "notify-keyspace-events", "Kl"]);
        if !matches!(conn.call(&ctx, &[config]).remove(0), Reply::Frame(_)) {
            // Paced retry while walrus restores (workload, not synchronization).
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let since = {
            let mut h = ctx.h();
            h.count(if resp3 {
                "op: keyspace subscription, RESP3"
            } else {
                "op: keyspace subscription, RESP2"
            });
            h.tick()
        };
        if conn.send(&[cmd(&["PSUBSCRIBE", PATTERN])]).is_err() {
            continue;
        }
        let end = Instant::now() + session;
        let mut confirmed = false;
        loop {
            let deadline = if confirmed {
                end
            } else {
                Instant::now() + HANG_BOUND
            };
            let bytes = match conn.read(deadline) {
                Ok(b) => b,
                Err(Wait::TimedOut) if !confirmed => {
                    ctx.h().violation(format!(
                        "hang: no reply to `PSUBSCRIBE {PATTERN}` within {HANG_BOUND:?}"
                    ));
                    break;
                }
                Err(_) => break,
            };
            let frame = match if resp3 {
                parse3(&bytes)
            } else {
                Ok(parse(&bytes))
            } {
                Ok(Reply::Frame(OwnedFrame::Array(f))) | Err(f) => f,
                Ok(Reply::Error(e)) => {
                    ctx.h().error("PSUBSCRIBE", &e);
                    break;
                }
                Ok(other) => {
                    ctx.h().unexpected("a keyspace subscription", &other);
                    break;
                }
            };
            match frame.as_slice() {
                [OwnedFrame::BulkString(kind), ..] if kind == b"psubscribe" => confirmed = true,
                [OwnedFrame::BulkString(kind), _, OwnedFrame::BulkString(channel), OwnedFrame::BulkString(event)]
                    if kind == b"pmessage" =>
                {
                    let key = channel.strip_prefix(PREFIX.as_bytes()).and_then(list_of);
                    if let Some(key) = key {
                        let what = format!(
                            "a keyspace notification ({})",
                            String::from_utf8_lossy(event)
                        );
                        ctx.h().notified(key, since, &what);
                    }
                }
                other => ctx.h().unexpected("a keyspace subscription", &other),
            }
        }
    }
}

/// `conn`, after `HELLO 3` if `resp3`.
fn protocol(conn: Conn, ctx: &Ctx, resp3: bool) -> Option<Conn> {
    if !resp3 {
        return Some(conn);
    }
    drop(conn);
    Conn::connect_as(&ctx.target.get(), true)
}

/// A RESP3 client with CLIENT TRACKING on: reads a list (which tracks it), then waits up to
/// 300 ms for invalidations, and again; or reads registers (`registers.rs`); a new
/// connection after any failure.
pub fn tracking(ctx: std::sync::Arc<Ctx>, seed: u64) {
    let mut rng = Rng(seed);
    'connection: while !ctx.stopping() {
        let Some(mut conn) = Conn::connect_as(&ctx.target.get(), true) else {
            // Paced while walrus restarts (workload, not synchronization).
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let on = cmd(&["CLIENT", "TRACKING", "on"]);
        if !matches!(conn.call(&ctx, &[on]).remove(0), Reply::Frame(_)) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        ctx.h().count("op: tracking client");
        // Each tracked list and when the read that tracks it was sent.
        let mut tracked: HashMap<usize, u64> = HashMap::new();
        while !ctx.stopping() {
            // Its session is its own (tracking pins it): its reads are never in a batch
            // with another client's write, which walrus would hold them with.
            if rng.below(2) == 0 {
                let clean = registers::read_with(&ctx, &mut rng, |c| {
                    conn.call(&ctx, std::slice::from_ref(c)).remove(0)
                });
                if !clean {
                    continue 'connection;
                }
                continue;
            }
            let key = rng.below(LISTS as u64) as usize;
            let read = cmd(&["LRANGE", &list_key(key), "0", "-1"]);
            let send_ts = ctx.h().tick();
            if conn.send(&[read]).is_err() {
                continue 'connection;
            }
            // The reply, and the invalidations before it.
            let deadline = Instant::now() + HANG_BOUND;
            let reply = loop {
                let Ok(bytes) = conn.read(deadline) else {
                    continue 'connection;
                };
                match parse3(&bytes) {
                    Ok(reply) => break reply,
                    Err(push) => invalidated(&ctx, &mut tracked, push),
                }
            };
            let mut h = ctx.h();
            match reply {
                Reply::Frame(OwnedFrame::Array(items)) => match bulks(items) {
                    Some(items) => {
                        h.observe_list(key, Some(send_ts), &items, "LRANGE (tracking)");
                        tracked.entry(key).or_insert(send_ts);
                    }
                    None => h.unexpected("LRANGE", &"not strings"),
                },
                Reply::Error(e) => {
                    h.error("LRANGE", &e);
                    drop(h);
                    continue 'connection;
                }
                other => h.unexpected("LRANGE", &other),
            }
            drop(h);
            let until = Instant::now() + Duration::from_millis(rng.below(300));
            while let Ok(bytes) = conn.read(until) {
                match parse3(&bytes) {
                    Err(push) => invalidated(&ctx, &mut tracked, push),
                    // walrus closes a connection whose invalidation the journal will never
                    // hold (its journal failed), saying so first.
                    Ok(Reply::Error(e)) => {
                        ctx.h().error("a tracking client's push", &e);
                        continue 'connection;
                    }
                    Ok(other) => ctx.h().unexpected("a tracking client's push", &other),
                }
            }
        }
    }
}

/// An invalidation push: each list it names was written after its tracked read.
fn invalidated(ctx: &Ctx, tracked: &mut HashMap<usize, u64>, push: Vec<OwnedFrame>) {
    let keys = match push.as_slice() {
        [OwnedFrame::BulkString(kind), OwnedFrame::Array(keys)] if kind == b"invalidate" => keys,
        // A flush, or a push of another kind.
        _ => return,
    };
    for k in keys {
        let OwnedFrame::BulkString(k) = k else {
            continue;
        };
        if let Some((key, since)) = list_of(k).and_then(|l| tracked.remove(&l).map(|s| (l, s))) {
            ctx.h().notified(key, since, "an invalidation");
        }
    }
}

/// How long after a write's acknowledgement its invalidation may take to arrive.
const INVALIDATION_BOUND: Duration = Duration::from_secs(5);

/// A client in OPTIN mode, probing again and again (`probe`) on one connection, while
/// another client writes what it reads; both connect afresh after any failure.
pub fn optin(ctx: std::sync::Arc<Ctx>, seed: u64) {
    let mut rng = Rng(seed);
    while !ctx.stopping() {
        let on = [cmd(&["CLIENT", "TRACKING", "on", "OPTIN"])];
        let connected = Conn::connect_as(&ctx.target.get(), true)
            .and_then(|mut c| matches!(c.call(&ctx, &on).remove(0), Reply::Frame(_)).then_some(c))
            .zip(Conn::connect(&ctx.target.get()));
        let Some((mut c, mut w)) = connected else {
            // Paced while walrus restarts (workload, not synchronization).
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        ctx.h().count("op: OPTIN client");
        while !ctx.stopping() && probe(&ctx, &mut c, &mut w, rng.next()) {}
    }
}

/// One probe: the OPTIN client `c` sends a write and `CLIENT CACHING yes` in one pipeline,
/// then a read of another key: that read is tracked (Valkey keeps the flag for the next
/// command only, and nothing walrus adds, its ROLE after a write, may come between). `w`
/// then writes the key read: its invalidation must arrive, soon after that write is
/// acknowledged. `false`: a connection failed, or a fault came between.
fn probe(ctx: &Ctx, c: &mut Conn, w: &mut Conn, n: u64) -> bool {
    let (key, other) = ("{gen}:optin", "{gen}:optin-w");
    let n = n.to_string();
    let before = ctx.h().seen();
    // The write and the flag in one pipeline, then the read: a batch of walrus's that ends
    // with a write gets its ROLE after the flag.
    let batch = [cmd(&["SET", other, &n]), cmd(&["CLIENT", "CACHING", "yes"])];
    let read = [cmd(&["GET", key])];
    let ok = |replies: Vec<Reply>| replies.iter().all(|r| matches!(r, Reply::Frame(_)));
    if !ok(c.call(ctx, &batch)) || !ok(c.call(ctx, &read)) {
        return false;
    }
    if !matches!(
        w.call(ctx, &[cmd(&["SET", key, &n])]).remove(0),
        Reply::Frame(_)
    ) {
        return false;
    }
    let acked = {
        let mut h = ctx.h();
        h.count("check: OPTIN invalidation after CLIENT CACHING yes");
        h.seen()
    };
    let deadline = Instant::now() + INVALIDATION_BOUND;
    loop {
        match c.read(deadline).map(|b| parse3(&b)) {
            Ok(Err(push)) if invalidates(&push, key) => return true,
            Ok(_) => {}
            Err(Wait::Closed) => return false,
            Err(Wait::TimedOut) => break,
        }
    }
    // A fault before the write was acknowledged (a Valkey restarted) may have taken the
    // tracking with it. One after it cannot: Valkey sent the invalidation when it ran the
    // write, and walrus holds it until the journal covers that write, as it held the
    // write's reply; a connection it then loses is closed.
    if !crate::release::Release::quiet_between(&before, &acked) {
        return false;
    }
    ctx.h().violation(format!(
        "lost invalidation: a client in OPTIN mode sent `SET {other}; CLIENT CACHING yes` in \
         one pipeline, then `GET {key}`; {key} was then written (acknowledged), and no \
         invalidation came within {INVALIDATION_BOUND:?}"
    ));
    false
}

/// Whether a push invalidates `key`.
fn invalidates(push: &[OwnedFrame], key: &str) -> bool {
    match push {
        [OwnedFrame::BulkString(kind), OwnedFrame::Array(keys)] if kind == b"invalidate" => keys
            .iter()
            .any(|k| matches!(k, OwnedFrame::BulkString(k) if k == key.as_bytes())),
        _ => false,
    }
}
