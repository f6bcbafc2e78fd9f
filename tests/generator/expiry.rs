//! Expiry: keys that expire while the run goes on. Each worker owns `X_KEYS` keys and is
//! their only writer: `SET k x<n> PX <ttl>`, or `SET k x<n>` then `PEXPIREAT k <time>` or
//! `EXPIRE k 1` in one pipeline. So each value has a deadline once acknowledged (the time
//! PEXPIREAT named; the acknowledgement's time plus the TTL for the others, since the
//! command ran before it was acknowledged), after which no read sent may show it: a
//! restore that replays a SET without its expiry, or with a relative one, brings it back.
//! Any worker reads them with GET: a value shown is one written there, not older than one
//! acknowledged before the read was sent (unless that one may have expired), and not shown
//! before the journal can hold it (`release.rs`).

use crate::common::Rng;
use crate::conn::{cmd, describe, Cmd, Reply};
use crate::history::{parse_id, Fate, History};
use crate::keys::{tag, TAGS};
use crate::release::Stamp;
use crate::route::{Batch, Router};
use crate::shared::Ctx;
use crate::workers::WORKERS;
use redis_protocol::resp2::types::OwnedFrame;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Keys per worker.
pub const X_KEYS: usize = 2;

/// Valkey's clock has milliseconds; a deadline counts once this much past.
const MARGIN: Duration = Duration::from_millis(5);

pub fn x_key(k: usize) -> String {
    let w = k / X_KEYS;
    format!("{{{}}}:x{w}:{}", TAGS[tag(w)], k % X_KEYS)
}

pub fn keys() -> Vec<String> {
    (0..WORKERS * X_KEYS).map(x_key).collect()
}

struct Value {
    key: usize,
    /// Its index among the key's values.
    index: usize,
    ack_ts: u64,
    fate: Fate,
    sent: Stamp,
    /// After this, it is gone.
    deadline: Option<SystemTime>,
}

/// Every value written to the expiring keys, and per key the highest index a read showed.
#[derive(Default)]
pub struct Expiry {
    values: Vec<Value>,
    per_key: Vec<Vec<u32>>,
    max_seen: Vec<usize>,
}

impl Expiry {
    pub fn new() -> Expiry {
        Expiry {
            values: Vec::new(),
            per_key: vec![Vec::new(); WORKERS * X_KEYS],
            max_seen: vec![0; WORKERS * X_KEYS],
        }
    }
}

impl History {
    /// Whether the value may still be there at `at`.
    fn x_alive(&self, v: u32, at: SystemTime) -> bool {
        self.expiry.values[v as usize]
            .deadline
            .is_none_or(|d| at <= d + MARGIN)
    }

    /// A GET of key `k` sent at `send_ts` (wall time `sent_at`) showed `value`.
    fn observe_x(&mut self, k: usize, send_ts: u64, sent_at: SystemTime, value: Option<&[u8]>) {
        self.count("check: expiring key read");
        let key = x_key(k);
        let Some(value) = value else {
            // Any value may have expired, or not be there yet.
            return;
        };
        let id = parse_id(value, b'x').filter(|&v| v < self.expiry.values.len());
        let Some(v) = id
            .map(|v| v as u32)
            .filter(|&v| self.expiry.values[v as usize].key == k)
        else {
            return self.violation(format!(
                "phantom: GET {key} shows {:?}, which nobody wrote there",
                String::from_utf8_lossy(value)
            ));
        };
        let x = &self.expiry.values[v as usize];
        let (index, sent, fate) = (x.index, x.sent, x.fate);
        if fate == Fate::NotRun {
            return self.violation(format!("aborted write visible: GET {key} shows x{v}"));
        }
        if !self.x_alive(v, sent_at) {
            let late = sent_at
                .duration_since(x.deadline.expect("a deadline"))
                .unwrap_or_default();
            return self.violation(format!(
                "expired value visible: GET {key} sent {} ms after x{v} expired showed it",
                late.as_millis()
            ));
        }
        // A later value acknowledged before the read was sent, and alive when it was sent,
        // must be what it sees (or a later one).
        let newer = self.expiry.per_key[k][index + 1..]
            .iter()
            .find(|&&n| self.expiry.values[n as usize].ack_ts < send_ts);
        if let Some(&n) = newer {
            return self.violation(format!(
                "stale read: GET {key} sent at t={send_ts} showed x{v}, but x{n} was \
                 acknowledged before"
            ));
        }
        self.reveals(&sent, |_| format!("GET {key} showed x{v}"));
        let seen = &mut self.expiry.max_seen[k];
        *seen = (*seen).max(index + 1);
    }

    /// The final values: none expired, none older than one acknowledged (unless that one
    /// expired) or than one a read showed.
    pub fn final_expiry(&mut self, values: &[Option<Vec<u8>>], read_at: SystemTime) {
        let mut found = Vec::new();
        for (k, value) in values.iter().enumerate() {
            let key = x_key(k);
            let ids = &self.expiry.per_key[k];
            // The newest acknowledged value that may still be there.
            let acked = ids
                .iter()
                .rposition(|&v| self.expiry.values[v as usize].fate == Fate::Acked);
            let index = match value {
                // Every value expires: no key is always possible.
                None => continue,
                Some(v) => match parse_id(v, b'x')
                    .filter(|&v| v < self.expiry.values.len())
                    .filter(|&v| self.expiry.values[v].key == k)
                {
                    Some(v) => v as u32,
                    None => {
                        found.push(format!(
                            "phantom: the final {key} is {:?}",
                            String::from_utf8_lossy(v)
                        ));
                        continue;
                    }
                },
            };
            let x = &self.expiry.values[index as usize];
            if !self.x_alive(index, read_at) {
                found.push(format!(
                    "expired value visible: the final {key} is x{index}, which expired"
                ));
            }
            if acked.is_some_and(|a| a > x.index) {
                found.push(format!(
                    "lost acknowledged write: the final {key} is x{index}, older than x{} \
                     (acknowledged)",
                    ids[acked.unwrap()]
                ));
            }
            if x.index + 1 < self.expiry.max_seen[k] {
                found.push(format!(
                    "dirty read: a read of {key} showed a newer value than the final x{index}"
                ));
            }
        }
        self.count_n("check: expiring key", values.len() as u64);
        self.report(found);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// One write of worker `w` to one of its expiring keys.
pub fn write(router: &mut Router, ctx: &Ctx, rng: &mut Rng, w: usize) -> bool {
    let k = w * X_KEYS + rng.below(X_KEYS as u64) as usize;
    let key = x_key(k);
    let (v, cmds, ttl) = {
        let mut h = ctx.h();
        h.tick();
        let sent = h.stamp();
        let v = h.expiry.values.len() as u32;
        let index = h.expiry.per_key[k].len();
        h.expiry.values.push(Value {
            key: k,
            index,
            ack_ts: crate::history::NEVER,
            fate: Fate::Pending,
            sent,
            deadline: None,
        });
        h.expiry.per_key[k].push(v);
        let value = format!("x{v}");
        let (cmds, ttl) = match rng.below(3) {
            0 => {
                h.count("op: SET PX");
                let ttl = 20 + rng.below(380);
                let c = cmd(&["SET", &key, &value, "PX", &ttl.to_string()]);
                (vec![c], Expire::After(ttl))
            }
            1 => {
                h.count("op: SET, PEXPIREAT");
                let at = now_ms() + 50 + rng.below(550);
                let set = cmd(&["SET", &key, &value]);
                (
                    vec![set, cmd(&["PEXPIREAT", &key, &at.to_string()])],
                    Expire::At(at),
                )
            }
            _ => {
                h.count("op: SET, EXPIRE");
                let set = cmd(&["SET", &key, &value]);
                (vec![set, cmd(&["EXPIRE", &key, "1"])], Expire::After(1000))
            }
        };
        (v, cmds, ttl)
    };
    let replies = router
        .exchange(&cmds, Batch::Pipeline)
        .unwrap_or_else(|| cmds.iter().map(|_| Reply::Lost).collect());
    let mut h = ctx.h();
    let ts = h.tick();
    let mut clean = true;
    let mut outcome = |h: &mut History, reply: &Reply, c: &Cmd| -> Option<i64> {
        match reply {
            Reply::Frame(OwnedFrame::SimpleString(s)) if s == b"OK" => Some(1),
            Reply::Frame(OwnedFrame::Integer(n)) => Some(*n),
            Reply::Error(e) => {
                h.error(&describe(c), e);
                clean = false;
                None
            }
            Reply::Lost => {
                clean = false;
                None
            }
            Reply::Frame(f) => {
                h.unexpected(&describe(c), f);
                clean = false;
                None
            }
        }
    };
    let set = outcome(&mut h, &replies[0], &cmds[0]);
    let expire = match cmds.len() {
        1 => set,
        _ => outcome(&mut h, &replies[1], &cmds[1]),
    };
    let x = &mut h.expiry.values[v as usize];
    if set.is_none() {
        x.fate = Fate::Unknown;
        // It may have run, and last for ever: no deadline known.
        h.count("unknown: expiring key write");
        return clean;
    }
    x.fate = Fate::Acked;
    x.ack_ts = ts;
    let sent = x.sent;
    if expire == Some(1) {
        x.deadline = Some(match ttl {
            Expire::After(ms) => SystemTime::now() + Duration::from_millis(ms),
            Expire::At(ms) => UNIX_EPOCH + Duration::from_millis(ms),
        });
    } else if expire == Some(0) {
        h.violation(format!(
            "lost acknowledged write: `{}` found no key just after `{}` was acknowledged",
            describe(&cmds[1]),
            describe(&cmds[0])
        ));
    }
    h.count("ack: expiring key write");
    h.reveals(&sent, |_| {
        format!("the acknowledgement of `{}`", describe(&cmds[0]))
    });
    clean
}

enum Expire {
    After(u64),
    At(u64),
}

/// A GET of one expiring key (any worker's).
pub fn read(router: &mut Router, ctx: &Ctx, rng: &mut Rng) -> bool {
    let k = rng.below((WORKERS * X_KEYS) as u64) as usize;
    let c = cmd(&["GET", &x_key(k)]);
    let (send_ts, sent_at) = {
        let mut h = ctx.h();
        h.count("op: expiring key read");
        (h.tick(), SystemTime::now())
    };
    let reply = router
        .exchange(std::slice::from_ref(&c), Batch::Pipeline)
        .map_or(Reply::Lost, |mut r| r.remove(0));
    let mut h = ctx.h();
    match reply {
        Reply::Frame(OwnedFrame::BulkString(v)) => h.observe_x(k, send_ts, sent_at, Some(&v)),
        Reply::Frame(OwnedFrame::Null) => h.observe_x(k, send_ts, sent_at, None),
        Reply::Error(e) => {
            h.error(&describe(&c), &e);
            return false;
        }
        Reply::Lost => return false,
        Reply::Frame(f) => h.unexpected(&describe(&c), &f),
    }
    true
}
