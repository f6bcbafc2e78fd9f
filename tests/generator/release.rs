//! The dirty-read check that needs no crash. A walrus started with a slowed journal
//! (the fail point `journal::write=sleep(<ms>)`, or faultfs's latency: `system.rs` picks one per
//! start) spends at least that delay D on every journal write, and a journal write starts
//! only after the entries it carries reached walrus: a write sent at time s cannot be
//! durable before s + D. So nothing that reveals it may reach a client before s + D: not
//! its own acknowledgement, not a read that shows what it wrote, not a notification that
//! names its key. A dirty read is then visible in the history of a run without any crash
//! making its effect last (a reply released a batch early, one key of a multi-key command
//! left unmarked, durability published when a write is submitted rather than completed).
//!
//! Every time here is the wall clock (the times walrus's log lines carry): a write's stamp
//! is taken before it is sent, an observation's time once its reply is in, so both err on
//! the side of no violation. Two things make a write durable without a journal write of
//! the delay, and are left out: a full resynchronization, whose RDB covers everything
//! Valkey ran (walrus logs `full resync: RDB stored`; a suspect whose window holds such a
//! line is dropped at the end, [`History::settle_suspects`]); and a walrus started with
//! another delay. So a write and what reveals it are compared only within one *epoch*: the
//! epoch moves at every walrus start and at the start and end of every fault or of a
//! transaction too large for one journal entry (busy: no stamp taken then counts).

use crate::history::History;
use std::time::{Duration, SystemTime};

/// When a write was sent, under which journal delay, in which epoch.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    pub at: SystemTime,
    epoch: u64,
    delay: Duration,
}

/// When a reply was in, in which epoch.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    pub at: SystemTime,
    epoch: u64,
}

/// The epoch of a stamp or a sight taken while something was busy: it matches none.
const NO_EPOCH: u64 = u64::MAX;

/// A reply that came too soon, kept until the end of the mode, when the full resyncs of
/// its walruses are known.
struct Suspect {
    what: String,
    sent: SystemTime,
    seen: SystemTime,
    delay: Duration,
    /// When it was found, after the mode started.
    found: Duration,
}

/// The journal delay of the walrus serving now, the epoch, and the suspects so far.
#[derive(Default)]
pub struct Release {
    delay: Duration,
    epoch: u64,
    busy: u32,
    suspects: Vec<Suspect>,
}

impl Release {
    fn epoch(&self) -> u64 {
        if self.busy > 0 {
            NO_EPOCH
        } else {
            self.epoch
        }
    }

    /// A walrus started with journal delay `delay_ms` (0 where the check cannot apply).
    pub fn started(&mut self, delay_ms: u64) {
        self.epoch += 1;
        self.delay = Duration::from_millis(delay_ms);
    }

    /// Something that may make writes durable another way (a fault, a full resync) begins.
    pub fn begin(&mut self) {
        self.epoch += 1;
        self.busy += 1;
    }

    pub fn end(&mut self) {
        self.epoch += 1;
        self.busy -= 1;
    }

    pub fn stamp(&self) -> Stamp {
        Stamp {
            at: SystemTime::now(),
            epoch: self.epoch(),
            delay: self.delay,
        }
    }

    pub fn seen(&self) -> Seen {
        Seen {
            at: SystemTime::now(),
            epoch: self.epoch(),
        }
    }

    /// Whether nothing (a fault, a walrus start) came between `a` and `b`.
    pub fn quiet_between(a: &Seen, b: &Seen) -> bool {
        a.epoch == b.epoch && a.epoch != NO_EPOCH
    }

    /// Whether the write stamped `s` cannot have been durable when `seen`.
    pub fn too_soon(s: &Stamp, seen: &Seen) -> bool {
        s.epoch == seen.epoch
            && s.epoch != NO_EPOCH
            && !s.delay.is_zero()
            && seen.at < s.at + s.delay
    }
}

impl History {
    /// A stamp for a write about to be sent.
    pub fn stamp(&self) -> Stamp {
        self.release.stamp()
    }

    /// Now, for a reply just in.
    pub fn seen(&self) -> Seen {
        self.release.seen()
    }

    /// `what` (an acknowledgement, a read, a notification), in now, reveals the write
    /// stamped `s`: a suspect if that write cannot be durable yet.
    pub fn reveals(&mut self, s: &Stamp, what: impl FnOnce(&History) -> String) {
        let seen = self.seen();
        self.revealed_at(s, &seen, what);
    }

    /// The same for what came in at `seen`.
    pub fn revealed_at(&mut self, s: &Stamp, seen: &Seen, what: impl FnOnce(&History) -> String) {
        self.count("check: released after durable");
        if Release::too_soon(s, seen) {
            let what = what(self);
            self.release.suspects.push(Suspect {
                what,
                sent: s.at,
                seen: seen.at,
                delay: s.delay,
                found: self.started.elapsed(),
            });
        }
    }

    /// How many of `stamps` (in the order they were taken) may be durable at `seen`: all but
    /// the newest ones of its epoch.
    pub fn may_be_durable(stamps: &[Stamp], seen: &Seen) -> usize {
        let recent = stamps
            .iter()
            .rev()
            .take_while(|s| Release::too_soon(s, seen))
            .count();
        stamps.len() - recent
    }

    /// `what` showed `shown` of something that `stamps` (one per write that adds one) make
    /// grow, at `seen`: a suspect if more than the writes that may be durable.
    pub fn count_revealed(
        &mut self,
        stamps: &[Stamp],
        shown: u64,
        seen: &Seen,
        what: impl FnOnce(&History) -> String,
    ) {
        let may = Self::may_be_durable(stamps, seen) as u64;
        if shown > may {
            // The newest write it shows, at least, was not durable.
            let s = stamps[may as usize];
            self.revealed_at(&s, seen, what);
        }
    }

    /// The suspects become violations, but those that a full resynchronization (its log
    /// line's time among `resyncs`) may have made durable in time.
    pub fn settle_suspects(&mut self, resyncs: &[SystemTime]) {
        let suspects = std::mem::take(&mut self.release.suspects);
        for s in suspects {
            if resyncs.iter().any(|&t| t >= s.sent && t <= s.seen) {
                self.count("check: released early, but a full resync covered it");
                continue;
            }
            let after = s.seen.duration_since(s.sent).unwrap_or_default();
            let what = format!(
                "released before durable: {}, {} ms after that write was sent; a journal \
                 write takes {} ms, so it was not durable yet",
                s.what,
                after.as_millis(),
                s.delay.as_millis()
            );
            self.violation_found(what, s.found);
        }
    }
}

/// The times of the full resynchronizations in a walrus's log: its lines' timestamps
/// (`2025-12-03T18:20:15.123456Z`, tracing's default format).
pub fn resyncs(log: &str) -> Vec<SystemTime> {
    log.lines()
        .filter(|l| l.contains("full resync: RDB stored"))
        .filter_map(|l| timestamp(l.split_whitespace().next()?))
        .collect()
}

/// An RFC 3339 UTC timestamp, to the microsecond.
fn timestamp(t: &str) -> Option<SystemTime> {
    let t = t.strip_suffix('Z')?;
    let (date, time) = t.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut h = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (h.next()??, h.next()??, h.next()??);
    let micros: u64 = format!("{frac:0<6}")[..6].parse().ok()?;
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    let secs = u64::try_from(secs).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_read_as_tracing_writes_them() {
        let t = timestamp("2025-12-03T18:20:15.123456Z").unwrap();
        let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(since, Duration::from_micros(1_764_786_015_123_456));
        assert!(timestamp("not a time").is_none());
    }
}
