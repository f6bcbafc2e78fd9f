//! The history of one run: every operation a client sent, what came back, and what reads
//! saw, with the checks that can be made as soon as something is recorded (the final state
//! is checked in `check.rs`).
//!
//! Every timestamp comes from one logical clock that only moves while the history's lock is
//! held, and an acknowledgement is stamped in the same critical section that records it. So
//! "acknowledged before that was sent" is exact: when a read's result is recorded, every
//! acknowledgement stamped before the read was sent is already recorded too, and a check made
//! then is as complete as one made at the end.

use crate::counters::{Counter, COUNTERS};
use crate::keys::list_key;
use crate::pubsub::Msg;
use crate::queues::Job;
use crate::registers::Reg;
use crate::release::{Release, Stamp};
use crate::values::Big;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// Append-only lists: appends, transactions and scripts write them, readers read them.
pub const LISTS: usize = 6;
/// Databases other than 0 (`databases.rs`), each with one append-only list of its own.
pub const DBS: usize = 3;
/// Every append-only list: those of database 0, then one in each other database.
pub const ALL_LISTS: usize = LISTS + DBS;

/// The database list `key` lives in.
pub fn list_db(key: usize) -> usize {
    key.saturating_sub(LISTS - 1).min(DBS)
}
/// Queue lists: producers push jobs, consumers pop them (two of each tag).
pub const QUEUES: usize = 4;
/// Large values per worker, each written only by its worker (so versions run in order).
pub const BIG_SLOTS: usize = 2;
/// The timestamp of what never happened (an acknowledgement that never came).
pub const NEVER: u64 = u64::MAX;

/// The element, job or message written as `<prefix><index>`; its index if it is one.
pub fn parse_id(item: &[u8], prefix: u8) -> Option<usize> {
    let (&first, digits) = item.split_first()?;
    if first != prefix || digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The outcome of a write, as far as its client knows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fate {
    /// Sent, no reply yet.
    Pending,
    /// Its success reply came back: it must be there forever after.
    Acked,
    /// An error or a lost connection: it may or may not have run.
    Unknown,
    /// It provably did not run (-EXECABORT, a transaction whose WATCH fired): never seen.
    NotRun,
}

/// One element appended to a list.
pub struct Elem {
    pub key: usize,
    pub group: usize,
    pub send_ts: u64,
    pub ack_ts: u64,
    pub fate: Fate,
    /// Its 1-based position, as the acknowledgement reported it.
    pub pos: Option<usize>,
    /// When it was sent, for the check that needs no crash (`release.rs`).
    pub sent: Stamp,
    /// When its client learned its fate (`NEVER` while pending): it ran before, if at all.
    pub settled_ts: u64,
}

/// Elements written by one request: an RPUSH of several, a transaction, a script.
pub struct Group {
    pub what: &'static str,
    pub members: Vec<u32>,
    /// Whether they run all together or not at all (false once a MULTI was refused, so its
    /// commands ran one by one).
    pub atomic: bool,
}

/// What the reads of one list saw.
#[derive(Default)]
pub struct List {
    /// The longest LRANGE seen: every other one must be a prefix of it (lists only grow).
    pub longest: Vec<u32>,
    /// The element each acknowledged append reported at each position (index: position - 1).
    pub acked_at: Vec<Option<u32>>,
    /// (acknowledgement time, highest position acknowledged until then), in time order.
    acked: Vec<(u64, usize)>,
    /// The largest LLEN seen.
    pub max_len: usize,
    /// The stamp of every element sent to it, in order: LLEN may show no more of them than
    /// may be durable.
    stamps: Vec<Stamp>,
    /// The elements sent to it, in order.
    pub sent: Vec<u32>,
}

impl List {
    /// How long a read sent at `ts` must find the list: every append acknowledged before.
    fn required(&self, ts: u64) -> usize {
        let n = self.acked.partition_point(|&(t, _)| t < ts);
        n.checked_sub(1).map_or(0, |i| self.acked[i].1)
    }
}

pub struct History {
    /// Seed and mode, for every message.
    pub tag: String,
    /// When the mode's run started: each violation printed says how long after.
    pub started: std::time::Instant,
    clock: u64,
    pub elems: Vec<Elem>,
    pub groups: Vec<Group>,
    pub lists: Vec<List>,
    pub jobs: Vec<Job>,
    /// Pops whose outcome is unknown (an error, no reply): each may have removed one job.
    pub unknown_pops: usize,
    /// Jobs some read saw in their queue.
    pub seen_jobs: HashSet<u32>,
    /// What each read of each queue showed.
    pub queue_reads: Vec<Vec<Vec<u32>>>,
    pub msgs: Vec<Msg>,
    pub bigs: BTreeMap<String, Big>,
    pub counters: Vec<Counter>,
    /// Keys (not queues) some keyless read or EXISTS saw.
    pub seen_keys: BTreeSet<String>,
    pub max_dbsize: usize,
    /// The register keys (`registers.rs`), by index.
    pub regs: Vec<Reg>,
    /// Each register value written: its key and operation.
    pub reg_values: Vec<(usize, usize)>,
    /// The keys that expire (`expiry.rs`).
    pub expiry: crate::expiry::Expiry,
    /// The journal delay and epochs of the check that needs no crash (`release.rs`).
    pub release: Release,
    pub counts: BTreeMap<String, u64>,
    pub violations: Vec<String>,
}

/// Whether an error reply is one walrus or Valkey gives while restoring, detached, refusing
/// writes or after losing a connection: expected under faults.
pub fn expected_error(msg: &str) -> bool {
    const EXPECTED: &[&str] = &[
        "LOADING",
        "MISCONF",
        "NOREPLICAS",
        "MASTERDOWN",
        "READONLY",
        "ERR walrus:",
        // Cluster mode: a node restarted in place says so until it has rejoined
        // (Valkey's rejoin delay, up to 5 s).
        "CLUSTERDOWN",
        // A redirect no longer followed (`route.rs`: too many hops, or in a transaction
        // whose EXEC ran), and a command of several keys of a slot being moved, split
        // between its two nodes: refused, or of unknown outcome.
        "MOVED ",
        "ASK ",
        "TRYAGAIN",
    ];
    EXPECTED.iter().any(|p| msg.starts_with(p))
}

/// How many violations of each kind are printed as they are found (all are kept).
const PRINTED: usize = 10;

impl History {
    pub fn new(tag: String) -> History {
        History {
            tag,
            started: std::time::Instant::now(),
            clock: 0,
            elems: Vec::new(),
            groups: Vec::new(),
            lists: (0..ALL_LISTS).map(|_| List::default()).collect(),
            jobs: Vec::new(),
            unknown_pops: 0,
            seen_jobs: HashSet::new(),
            queue_reads: vec![Vec::new(); QUEUES],
            msgs: Vec::new(),
            bigs: BTreeMap::new(),
            counters: (0..COUNTERS).map(|_| Counter::default()).collect(),
            seen_keys: BTreeSet::new(),
            max_dbsize: 0,
            regs: crate::registers::all(),
            reg_values: Vec::new(),
            expiry: crate::expiry::Expiry::new(),
            release: Release::default(),
            counts: BTreeMap::new(),
            violations: Vec::new(),
        }
    }

    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    pub fn count(&mut self, what: &str) {
        self.count_n(what, 1);
    }

    pub fn count_n(&mut self, what: &str, n: u64) {
        match self.counts.get_mut(what) {
            Some(c) => *c += n,
            None => {
                self.counts.insert(what.to_string(), n);
            }
        }
    }

    pub fn violation(&mut self, what: String) {
        self.violation_found(what, self.started.elapsed());
    }

    /// A violation found `after` the mode started (one decided later, at its end).
    pub fn violation_found(&mut self, what: String, after: std::time::Duration) {
        let kind = |v: &str| v.split(':').next().unwrap_or_default().to_string();
        let k = kind(&what);
        if self.violations.iter().filter(|v| kind(v) == k).count() < PRINTED {
            let after = after.as_secs_f64();
            eprintln!("VIOLATION ({}, after {after:.1} s): {what}", self.tag);
        }
        self.violations.push(what);
    }

    /// Violations found together.
    pub fn report(&mut self, found: Vec<String>) {
        for v in found {
            self.violation(v);
        }
    }

    /// An error reply: expected under faults (the operation's outcome is then unknown) if
    /// it is one walrus or Valkey gives while restoring, detached, refusing writes or after
    /// losing a connection; anything else is reported.
    pub fn error(&mut self, to: &str, msg: &str) {
        if expected_error(msg) {
            // Counted by kind: the text up to its first clause (a redirect's first word).
            let redirect = msg.starts_with("MOVED ") || msg.starts_with("ASK ");
            let ends: &[char] = if redirect { &[' '] } else { &[';', '(', ','] };
            let kind: String = msg
                .split(ends)
                .next()
                .unwrap_or(msg)
                .chars()
                .take(70)
                .collect();
            self.count(&format!("error: {}", kind.trim_end()));
        } else {
            self.violation(format!("unexpected reply: to `{to}`: -{msg}"));
        }
    }

    /// A reply of the wrong shape.
    pub fn unexpected(&mut self, to: &str, reply: &dyn std::fmt::Debug) {
        self.violation(format!("unexpected reply: to `{to}`: {reply:?}"));
    }

    pub fn describe(&self, e: u32) -> String {
        let el = &self.elems[e as usize];
        let group = &self.groups[el.group];
        let ack = if el.fate == Fate::Acked {
            format!(
                ", acknowledged at t={} at position {}",
                el.ack_ts,
                el.pos.unwrap_or(0)
            )
        } else {
            format!(", {:?}", el.fate)
        };
        format!(
            "e{e} ({} of {} element(s), sent at t={}{ack})",
            group.what,
            group.members.len(),
            el.send_ts
        )
    }

    // ----- list appends -----

    /// Registers the elements of one request about to be sent, one per entry of `keys`.
    pub fn appends(&mut self, what: &'static str, keys: &[usize]) -> Vec<u32> {
        let send_ts = self.tick();
        let sent = self.stamp();
        let group = self.groups.len();
        let members: Vec<u32> = (0..keys.len())
            .map(|i| (self.elems.len() + i) as u32)
            .collect();
        for &key in keys {
            self.elems.push(Elem {
                key,
                group,
                send_ts,
                ack_ts: NEVER,
                fate: Fate::Pending,
                pos: None,
                sent,
                settled_ts: NEVER,
            });
            self.lists[key].stamps.push(sent);
            let e = (self.elems.len() - 1) as u32;
            self.lists[key].sent.push(e);
        }
        self.groups.push(Group {
            what,
            members: members.clone(),
            atomic: true,
        });
        members
    }

    /// An acknowledged RPUSH (or a script that pushed and returned LLEN): its elements are
    /// the last ones of a list `len` long.
    pub fn ack_push(&mut self, elems: &[u32], len: i64) {
        let n = elems.len();
        if len < n as i64 {
            let e = self.describe(elems[0]);
            self.violation(format!(
                "unexpected reply: {e} acknowledged with list length {len}, shorter than the push"
            ));
            return self.unknown(elems);
        }
        let first = len as usize - n + 1;
        let placed: Vec<(u32, usize)> = elems
            .iter()
            .enumerate()
            .map(|(i, &e)| (e, first + i))
            .collect();
        self.ack(&placed);
    }

    /// Acknowledged elements at their reported positions, stamped together.
    pub fn ack(&mut self, placed: &[(u32, usize)]) {
        let ts = self.tick();
        let mut found = Vec::new();
        for &(e, pos) in placed {
            let el = &mut self.elems[e as usize];
            assert_eq!(
                el.fate,
                Fate::Pending,
                "e{e} settled twice: a generator bug"
            );
            el.fate = Fate::Acked;
            el.ack_ts = ts;
            el.settled_ts = ts;
            el.pos = Some(pos);
            let list = &mut self.lists[el.key];
            if pos == 0 {
                found.push(format!("unexpected reply: e{e} acknowledged at position 0"));
                continue;
            }
            if list.acked_at.len() < pos {
                list.acked_at.resize(pos, None);
            }
            if let Some(other) = list.acked_at[pos - 1].replace(e) {
                found.push(format!(
                    "position conflict: two acknowledged appends at position {pos} of {}: e{other} \
                     and e{e}",
                    list_key(el.key)
                ));
            }
            if let Some(&seen) = list.longest.get(pos - 1).filter(|&&s| s != e) {
                found.push(format!(
                    "position conflict: e{e} was acknowledged at position {pos} of {}, where a read \
                     saw e{seen}",
                    list_key(el.key)
                ));
            }
            let high = list.acked.last().map_or(0, |a| a.1).max(pos);
            list.acked.push((ts, high));
        }
        self.count_n("ack: list append", placed.len() as u64);
        self.report(found);
        for &(e, _) in placed {
            let sent = self.elems[e as usize].sent;
            self.reveals(&sent, |h| {
                format!("the acknowledgement of {}", h.describe(e))
            });
        }
    }

    pub fn unknown(&mut self, elems: &[u32]) {
        self.settle_elems(elems, Fate::Unknown);
    }

    pub fn not_run(&mut self, elems: &[u32]) {
        self.settle_elems(elems, Fate::NotRun);
    }

    fn settle_elems(&mut self, elems: &[u32], fate: Fate) {
        let ts = self.tick();
        for &e in elems {
            let el = &mut self.elems[e as usize];
            el.settled_ts = ts;
            assert_eq!(
                el.fate,
                Fate::Pending,
                "e{e} settled twice: a generator bug"
            );
            el.fate = fate;
        }
        let what = if fate == Fate::NotRun {
            "not run"
        } else {
            "unknown"
        };
        self.count_n(&format!("{what}: list append"), elems.len() as u64);
    }

    /// The elements of `group` did not run together (their MULTI was refused).
    pub fn split(&mut self, group_of: u32) {
        let g = self.elems[group_of as usize].group;
        self.groups[g].atomic = false;
    }

    /// Parses a list's items as elements of `key`: each known, of that key, seen once, and
    /// not one that provably never ran.
    fn parse_elems(&mut self, key: usize, items: &[Vec<u8>], what: &str) -> Option<Vec<u32>> {
        let mut ids = Vec::with_capacity(items.len());
        let mut once = HashSet::with_capacity(items.len());
        let mut found = Vec::new();
        for item in items {
            let id = parse_id(item, b'e').filter(|&i| i < self.elems.len());
            let Some(id) = id.filter(|&i| self.elems[i].key == key) else {
                found.push(format!(
                    "phantom: {what} of {} shows {:?}, which no client appended there",
                    list_key(key),
                    String::from_utf8_lossy(item)
                ));
                continue;
            };
            if !once.insert(id) {
                found.push(format!(
                    "duplicate: {what} of {} shows e{id} twice",
                    list_key(key)
                ));
            }
            if self.elems[id].fate == Fate::NotRun {
                let d = self.describe(id as u32);
                found.push(format!(
                    "aborted write visible: {what} of {} shows {d}, which did not run",
                    list_key(key)
                ));
            }
            ids.push(id as u32);
        }
        let clean = found.is_empty();
        self.report(found);
        clean.then_some(ids)
    }

    /// An LRANGE of a whole list, sent at `send_ts` (`None`: the final read, checked
    /// further in `check.rs`). Returns the elements, if they parse.
    pub fn observe_list(
        &mut self,
        key: usize,
        send_ts: Option<u64>,
        items: &[Vec<u8>],
        what: &str,
    ) -> Option<Vec<u32>> {
        self.count("check: list read");
        let ids = self.parse_elems(key, items, what)?;
        let list = &mut self.lists[key];
        let mut found = Vec::new();
        let common = ids.len().min(list.longest.len());
        if let Some(i) = (0..common).find(|&i| ids[i] != list.longest[i]) {
            found.push(format!(
                "position conflict: {what} of {} shows e{} at position {}, where an earlier read \
                 saw e{} (the reads are not all prefixes of one list)",
                list_key(key),
                ids[i],
                i + 1,
                list.longest[i]
            ));
        } else if ids.len() > list.longest.len() {
            for (i, &id) in ids.iter().enumerate().skip(list.longest.len()) {
                if let Some(&Some(acked)) = list.acked_at.get(i).filter(|a| **a != Some(id)) {
                    found.push(format!(
                        "position conflict: {what} of {} shows e{id} at position {}, where e{acked} was \
                         acknowledged",
                        list_key(key),
                        i + 1
                    ));
                }
            }
            list.longest = ids.clone();
        }
        if send_ts.is_some() {
            let seen = self.seen();
            for &e in &ids {
                let sent = self.elems[e as usize].sent;
                self.revealed_at(&sent, &seen, |h| {
                    format!("{what} of {} showed {}", list_key(key), h.describe(e))
                });
            }
        }
        let list = &mut self.lists[key];
        if let Some(ts) = send_ts {
            let need = list.required(ts);
            if ids.len() < need {
                let missing = list.acked_at[need - 1].map_or(String::new(), |e| format!("e{e}"));
                found.push(format!(
                    "stale read: {what} of {} sent at t={ts} shows {} elements, but {missing} at \
                     position {need} was acknowledged before it was sent",
                    list_key(key),
                    ids.len()
                ));
            }
        }
        self.report(found);
        Some(ids)
    }

    /// An LLEN sent at `send_ts`.
    pub fn observe_len(&mut self, key: usize, send_ts: u64, len: i64) {
        self.count("check: list length");
        let seen = self.seen();
        let stamps = std::mem::take(&mut self.lists[key].stamps);
        self.count_revealed(&stamps, len.max(0) as u64, &seen, |_| {
            format!("LLEN {} showed {len}", list_key(key))
        });
        self.lists[key].stamps = stamps;
        let list = &mut self.lists[key];
        let need = list.required(send_ts);
        list.max_len = list.max_len.max(len.max(0) as usize);
        if (len as usize) < need {
            self.violation(format!(
                "stale read: LLEN {} sent at t={send_ts} is {len}, but position {need} was \
                 acknowledged before it was sent",
                list_key(key)
            ));
        }
    }
}
