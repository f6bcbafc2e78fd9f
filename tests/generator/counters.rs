//! Counters: INCRs of a few shared counters, and GETs of them. A counter only grows, so
//! every value walrus shows (an INCR's reply, a GET's) is a floor for what any request
//! sent after it sees, and for the final value: a counter that goes back below a value a
//! client saw lost either an acknowledged INCR or an increment a read showed before it was
//! durable. And it never exceeds the INCRs sent (each runs once, or not at all).

use crate::conn::{describe, Cmd, Reply};
use crate::history::History;
use crate::keys::counter_key;
use redis_protocol::resp2::types::OwnedFrame;

/// Counters the workers share.
pub const COUNTERS: usize = 3;

/// What clients did to one counter, and saw of it.
#[derive(Default)]
pub struct Counter {
    /// INCRs sent: the most the counter can be.
    pub sent: u64,
    /// (time, highest value shown until then) for each value walrus showed (an INCR's
    /// reply, a read), in time order.
    shown: Vec<(u64, u64)>,
    /// The highest value an acknowledged INCR returned.
    pub max_acked: u64,
    /// The highest value a read showed.
    pub max_read: u64,
    /// The stamp of every INCR sent, in order (`release.rs`).
    incrs: Vec<crate::release::Stamp>,
}

impl Counter {
    /// The highest value walrus showed before `ts`.
    fn floor(&self, ts: u64) -> u64 {
        let n = self.shown.partition_point(|&(t, _)| t < ts);
        n.checked_sub(1).map_or(0, |i| self.shown[i].1)
    }
}

impl History {
    /// Registers an INCR of counter `c` about to be sent; returns its send time.
    pub fn incr_sent(&mut self, c: usize) -> u64 {
        self.counters[c].sent += 1;
        let sent = self.stamp();
        self.counters[c].incrs.push(sent);
        self.tick()
    }

    /// An INCR's reply: acknowledged with the counter's new value, or of unknown outcome.
    pub fn settle_incr(&mut self, c: usize, send_ts: u64, reply: Reply, cmd: &Cmd) -> bool {
        match reply {
            Reply::Frame(OwnedFrame::Integer(v)) => {
                self.count("ack: counter increment");
                let seen = self.seen();
                let incrs = std::mem::take(&mut self.counters[c].incrs);
                // An INCR's reply shows its own increment, and every one before it.
                self.count_revealed(&incrs, v.max(0) as u64, &seen, |_| {
                    format!("the acknowledgement of an INCR of {} ({v})", counter_key(c))
                });
                self.counters[c].incrs = incrs;
                self.counters[c].max_acked = self.counters[c].max_acked.max(v.max(0) as u64);
                // It ran after everything shown before it was sent: it is above all of it.
                self.shown_counter(c, send_ts, v, 1, "INCR");
                return true;
            }
            Reply::Error(e) => self.error(&describe(cmd), &e),
            Reply::Lost => {}
            Reply::Frame(f) => self.unexpected(&describe(cmd), &f),
        }
        self.count("unknown: counter increment");
        false
    }

    /// A read of counter `c` sent at `send_ts` showed `value` (0: no key).
    pub fn observe_counter(&mut self, c: usize, send_ts: u64, value: i64) {
        self.count("check: counter read");
        let seen = self.seen();
        let incrs = std::mem::take(&mut self.counters[c].incrs);
        self.count_revealed(&incrs, value.max(0) as u64, &seen, |_| {
            format!("a read of {} showed {value}", counter_key(c))
        });
        self.counters[c].incrs = incrs;
        self.counters[c].max_read = self.counters[c].max_read.max(value.max(0) as u64);
        self.shown_counter(c, send_ts, value, 0, "a read");
    }

    /// Checks a value shown to a request sent at `send_ts` against what was shown before it
    /// (it must exceed that by `above` at least) and the INCRs sent; records it.
    fn shown_counter(&mut self, c: usize, send_ts: u64, value: i64, above: u64, what: &str) {
        let key = counter_key(c);
        let counter = &self.counters[c];
        let floor = counter.floor(send_ts);
        let sent = counter.sent;
        let value = match u64::try_from(value) {
            Ok(v) => v,
            Err(_) => {
                return self.violation(format!(
                    "phantom: {what} of {key} shows {value}, below zero"
                ))
            }
        };
        if value < floor + above {
            self.violation(format!(
                "stale read: {what} of {key} sent at t={send_ts} shows {value}, but {floor} was \
                 shown before it was sent (the counter went back)"
            ));
        }
        if value > sent {
            self.violation(format!(
                "phantom: {what} of {key} shows {value}, but only {sent} INCRs were sent"
            ));
        }
        let ts = self.tick();
        let counter = &mut self.counters[c];
        let high = counter.shown.last().map_or(0, |s| s.1).max(value);
        counter.shown.push((ts, high));
    }

    /// The final values: at least every acknowledged and every read value, at most the
    /// INCRs sent.
    pub fn final_counters(&mut self, values: &[i64]) {
        let mut found = Vec::new();
        for (c, &v) in values.iter().enumerate() {
            let key = counter_key(c);
            let counter = &self.counters[c];
            let v = v.max(0) as u64;
            if v < counter.max_acked {
                found.push(format!(
                    "lost acknowledged write: the final {key} is {v}, but an INCR was \
                     acknowledged with {}",
                    counter.max_acked
                ));
            }
            if v < counter.max_read {
                found.push(format!(
                    "dirty read: a read of {key} showed {}, the final value is {v}",
                    counter.max_read
                ));
            }
            if v > counter.sent {
                found.push(format!(
                    "phantom: the final {key} is {v}, but only {} INCRs were sent",
                    counter.sent
                ));
            }
        }
        self.count_n("check: counter", values.len() as u64);
        self.report(found);
    }
}
