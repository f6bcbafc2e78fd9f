//! The reads a worker sends, and what each reply tells the history: every kind of read
//! walrus must hold while what it shows is not durable (keyed reads of dirty keys, a
//! read-only script, keyless reads of the whole keyspace).

use crate::check::parse_int;
use crate::common::Rng;
use crate::conn::{cmd, describe, Cmd};
use crate::counters::COUNTERS;
use crate::history::{History, BIG_SLOTS, LISTS, QUEUES};
use crate::keys::{big_key, counter_key, list_key, queue_key, PATTERN};
use crate::workers::{bulks, WORKERS};
use redis_protocol::resp2::types::OwnedFrame;

/// A read-only script: it may read any key, so walrus holds it for every pending write.
const RANGE_SCRIPT: &str = "return redis.call('LRANGE', KEYS[1], 0, -1)";

pub enum ReadOp {
    Range(usize),
    ScriptRange(usize),
    Len(usize),
    Queue(usize),
    DbSize,
    InfoKeyspace,
    RandomKey,
    Exists(String),
    Scan,
    Large(String),
    Counter(usize),
}

fn below(rng: &mut Rng, n: usize) -> usize {
    rng.below(n as u64) as usize
}

impl ReadOp {
    pub fn random(rng: &mut Rng) -> ReadOp {
        let big = |rng: &mut Rng| big_key(below(rng, WORKERS), below(rng, BIG_SLOTS));
        match below(rng, 16) {
            0..=2 => ReadOp::Range(below(rng, LISTS)),
            3 => ReadOp::ScriptRange(below(rng, LISTS)),
            4 => ReadOp::Len(below(rng, LISTS)),
            5 | 6 => ReadOp::Queue(below(rng, QUEUES)),
            7 => ReadOp::DbSize,
            8 => ReadOp::InfoKeyspace,
            9 => ReadOp::RandomKey,
            10 if below(rng, 2) == 0 => ReadOp::Exists(list_key(below(rng, LISTS))),
            10 => ReadOp::Exists(big(rng)),
            11 => ReadOp::Scan,
            12 | 13 => ReadOp::Counter(below(rng, COUNTERS)),
            _ => ReadOp::Large(big(rng)),
        }
    }

    pub fn command(&self) -> Cmd {
        match self {
            ReadOp::Range(k) => cmd(&["LRANGE", &list_key(*k), "0", "-1"]),
            ReadOp::ScriptRange(k) => cmd(&["EVAL_RO", RANGE_SCRIPT, "1", &list_key(*k)]),
            ReadOp::Len(k) => cmd(&["LLEN", &list_key(*k)]),
            ReadOp::Queue(q) => cmd(&["LRANGE", &queue_key(*q), "0", "-1"]),
            ReadOp::DbSize => cmd(&["DBSIZE"]),
            ReadOp::InfoKeyspace => cmd(&["INFO", "keyspace"]),
            ReadOp::RandomKey => cmd(&["RANDOMKEY"]),
            ReadOp::Exists(key) => cmd(&["EXISTS", key]),
            ReadOp::Scan => cmd(&["SCAN", "0", "MATCH", PATTERN, "COUNT", "1000"]),
            ReadOp::Large(key) => cmd(&["GETRANGE", key, "0", "63"]),
            ReadOp::Counter(c) => cmd(&["GET", &counter_key(*c)]),
        }
    }

    /// Records what the reply to this read, sent at `send_ts`, showed.
    pub fn observe(&self, h: &mut History, send_ts: u64, frame: OwnedFrame, c: &Cmd) {
        let strings = |frame: OwnedFrame| match frame {
            OwnedFrame::Array(items) => bulks(items),
            _ => None,
        };
        match (self, frame) {
            (ReadOp::Range(k) | ReadOp::ScriptRange(k), f) => match strings(f) {
                Some(items) => {
                    let what = String::from_utf8_lossy(&c[0]);
                    h.observe_list(*k, Some(send_ts), &items, &what);
                }
                None => h.unexpected(&describe(c), &"not an array of strings"),
            },
            (ReadOp::Len(k), OwnedFrame::Integer(n)) => h.observe_len(*k, send_ts, n),
            (ReadOp::Queue(q), f) => match strings(f) {
                Some(items) => {
                    h.observe_queue(*q, send_ts, &items, "LRANGE");
                }
                None => h.unexpected(&describe(c), &"not an array of strings"),
            },
            (ReadOp::DbSize, OwnedFrame::Integer(n)) => h.observe_dbsize(n),
            (ReadOp::InfoKeyspace, OwnedFrame::BulkString(text)) => {
                // "db0:keys=12,expires=0,avg_ttl=0,..."; no line at all when db0 is empty.
                let text = String::from_utf8_lossy(&text);
                let keys = text
                    .lines()
                    .find_map(|l| l.strip_prefix("db0:keys="))
                    .and_then(|rest| rest.split(',').next()?.parse().ok());
                h.observe_dbsize(keys.unwrap_or(0));
            }
            (ReadOp::RandomKey, OwnedFrame::BulkString(key)) => h.observe_keys(&[key]),
            (ReadOp::RandomKey, OwnedFrame::Null) => h.observe_dbsize(0),
            (ReadOp::Exists(key), OwnedFrame::Integer(n)) => {
                if n == 1 {
                    h.observe_keys(&[key.clone().into_bytes()]);
                }
            }
            (ReadOp::Scan, OwnedFrame::Array(mut page)) if page.len() == 2 => {
                match page.pop().and_then(strings) {
                    Some(keys) => h.observe_keys(&keys),
                    None => h.unexpected(&describe(c), &"a SCAN page without keys"),
                }
            }
            (ReadOp::Large(key), OwnedFrame::BulkString(head)) => {
                h.observe_big(key, send_ts, &head)
            }
            (ReadOp::Counter(k), OwnedFrame::Null) => h.observe_counter(*k, send_ts, 0),
            (ReadOp::Counter(k), OwnedFrame::BulkString(b)) => match parse_int(&b) {
                Some(v) => h.observe_counter(*k, send_ts, v),
                None => h.unexpected(&describe(c), &String::from_utf8_lossy(&b)),
            },
            (_, f) => h.unexpected(&describe(c), &f),
        }
    }
}
