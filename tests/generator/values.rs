//! The history of large values (each written by one worker, version after version) and of
//! what keyless reads and EXISTS saw of the keyspace.

use crate::history::{Fate, History};
use crate::keys::{comes_and_goes, is_client_key};

/// The first bytes of a large value: which key and which version of it.
pub fn big_header(key: &str, version: usize) -> String {
    format!("{key}#{version}|")
}

/// Version `version` of `key`: its header, then filler up to `size` bytes.
pub fn big_value(key: &str, version: usize, size: usize) -> Vec<u8> {
    let mut value = big_header(key, version).into_bytes();
    value.resize(size, b'a' + (version % 26) as u8);
    value
}

/// The version a large value's first bytes name (0: no value).
pub fn big_version(key: &str, head: &[u8]) -> Option<usize> {
    if head.is_empty() {
        return Some(0);
    }
    let rest = head.strip_prefix(format!("{key}#").as_bytes())?;
    let end = rest.iter().position(|&b| b == b'|')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// One large value's versions, written in order by one worker.
#[derive(Default)]
pub struct Big {
    /// (size, fate) of version i + 1.
    pub versions: Vec<(usize, Fate)>,
    /// When version i + 1 was sent (`release.rs`).
    stamps: Vec<crate::release::Stamp>,
    /// (acknowledgement time, highest version acknowledged until then).
    acked: Vec<(u64, usize)>,
    pub max_seen: usize,
}

impl History {
    /// Registers the next version of `key`; returns it (from 1).
    pub fn new_big(&mut self, key: &str, size: usize) -> usize {
        let sent = self.stamp();
        let big = self.bigs.entry(key.to_string()).or_default();
        big.versions.push((size, Fate::Pending));
        big.stamps.push(sent);
        big.versions.len()
    }

    /// What became of versions of large values written by one request (a SET, or a
    /// transaction of several), stamped together.
    pub fn big_settled(&mut self, writes: &[(String, usize)], fate: Fate) {
        let ts = self.tick();
        for (key, version) in writes {
            let big = self.bigs.get_mut(key).expect("registered");
            big.versions[version - 1].1 = fate;
            if fate == Fate::Acked {
                let high = big.acked.last().map_or(0, |a| a.1).max(*version);
                big.acked.push((ts, high));
            }
        }
        if fate == Fate::Acked {
            for (key, version) in writes {
                let sent = self.bigs[key].stamps[version - 1];
                self.reveals(&sent, |_| {
                    format!("the acknowledgement of {key} version {version}")
                });
            }
        }
        let what = match fate {
            Fate::Acked => "ack: large value",
            Fate::NotRun => "not run: large value",
            _ => "unknown: large value",
        };
        self.count_n(what, writes.len() as u64);
    }

    /// The first bytes of `key` read by a request sent at `send_ts`.
    pub fn observe_big(&mut self, key: &str, send_ts: u64, head: &[u8]) {
        self.count("check: large value read");
        let big = self.bigs.entry(key.to_string()).or_default();
        let version = big_version(key, head).filter(|&v| v <= big.versions.len());
        let Some(v) = version else {
            let shown = String::from_utf8_lossy(head).into_owned();
            return self.violation(format!(
                "phantom: a read of {key} shows {shown:?}, which nobody wrote"
            ));
        };
        big.max_seen = big.max_seen.max(v);
        if v > 0 && big.versions[v - 1].1 == Fate::NotRun {
            return self.violation(format!(
                "aborted write visible: a read of {key} shows version {v}, whose transaction \
                 did not run"
            ));
        }
        if v > 0 {
            let sent = big.stamps[v - 1];
            self.reveals(&sent, |_| format!("a read of {key} showed version {v}"));
        }
        let big = &self.bigs[key];
        let n = big.acked.partition_point(|&(t, _)| t < send_ts);
        let need = n.checked_sub(1).map_or(0, |i| big.acked[i].1);
        if v < need {
            self.violation(format!(
                "stale read: a read of {key} sent at t={send_ts} shows version {v}, but version \
                 {need} was acknowledged before it was sent"
            ));
        }
    }

    // ----- the keyspace -----

    /// Keys a keyless read or EXISTS showed: each must outlive every crash.
    pub fn observe_keys(&mut self, keys: &[Vec<u8>]) {
        self.count("check: keyspace read");
        for k in keys {
            let k = String::from_utf8_lossy(k);
            if is_client_key(&k) && !comes_and_goes(&k) {
                self.seen_keys.insert(k.into_owned());
            }
        }
    }

    pub fn observe_dbsize(&mut self, n: i64) {
        self.count("check: keyspace read");
        self.max_dbsize = self.max_dbsize.max(n.max(0) as usize);
    }

    /// What is still pending at the end (its client stopped) may or may not have run.
    pub fn settle(&mut self) {
        for e in &mut self.elems {
            if e.fate == Fate::Pending {
                e.fate = Fate::Unknown;
            }
        }
        for j in &mut self.jobs {
            if j.fate == Fate::Pending {
                j.fate = Fate::Unknown;
            }
        }
        for big in self.bigs.values_mut() {
            for v in &mut big.versions {
                if v.1 == Fate::Pending {
                    v.1 = Fate::Unknown;
                }
            }
        }
    }
}
