//! How fast a restore loads, for the restore-time estimate that decides checkpoints
//! ([`super::trigger`]): conservative defaults, replaced by what this process's own
//! restores measured ([`crate::restore`] times the RDB and the journal phases apart).
//!
//! Kept in memory only: a restart starts from the defaults again, and its own restore is
//! usually the first measurement.

use std::collections::VecDeque;
use std::sync::Mutex;

/// Bytes of RDB Valkey loads per second before any restore here measured it. The benchmark
/// machine (a local virtual disk) loads about 240 MB/s (docs/benchmarks.md, "Restore"); network disks
/// and small CPUs load several times slower, and a rate that is too high breaks the budget.
pub const DEFAULT_RDB_LOAD_BYTES_PER_SECOND: f64 = 50e6;
/// Bytes of journal stream Valkey applies per second before any restore here measured it.
/// Slower than an RDB: every command is parsed and executed again (about 150 MB/s there).
pub const DEFAULT_JOURNAL_REPLAY_BYTES_PER_SECOND: f64 = 20e6;
/// A phase shorter than this says little about a rate: fixed costs (the handshake, the
/// acknowledgement's round trip, a second of Valkey's replication cron) dominate it.
pub const MIN_MEASURED_BYTES: u64 = 1 << 20;
/// Measurements kept per phase; the slowest of them is used, so that one fast restore (a
/// warm page cache) does not make the next estimate optimistic.
const RECENT: usize = 4;

/// Restore rates, bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub rdb_load: f64,
    pub journal_replay: f64,
}

impl Default for Rates {
    fn default() -> Self {
        Rates {
            rdb_load: DEFAULT_RDB_LOAD_BYTES_PER_SECOND,
            journal_replay: DEFAULT_JOURNAL_REPLAY_BYTES_PER_SECOND,
        }
    }
}

impl Rates {
    /// How long a restore of `rdb_bytes` of RDB and `journal_bytes` of journal stream takes
    /// at these rates, per phase (seconds): the checkpointer's estimate and `walrus verify`'s.
    pub fn restore_seconds(&self, rdb_bytes: u64, journal_bytes: u64) -> (f64, f64) {
        (
            rdb_bytes as f64 / self.rdb_load,
            journal_bytes as f64 / self.journal_replay,
        )
    }
}

/// The rates learned from this process's restores, shared by the restorer (which records)
/// and the checkpointer (which reads).
#[derive(Debug)]
pub struct LearnedRates {
    recent: Mutex<Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    rdb: VecDeque<f64>,
    journal: VecDeque<f64>,
}

impl Default for LearnedRates {
    fn default() -> Self {
        LearnedRates::new()
    }
}

impl LearnedRates {
    pub fn new() -> LearnedRates {
        let learned = LearnedRates {
            recent: Mutex::new(Recent::default()),
        };
        learned.publish();
        learned
    }

    /// The rates to plan with: the slowest recent measurement of each phase, or its
    /// default before any.
    pub fn current(&self) -> Rates {
        let r = self.recent.lock().expect("restore rates lock");
        let slowest =
            |v: &VecDeque<f64>, default: f64| v.iter().copied().reduce(f64::min).unwrap_or(default);
        Rates {
            rdb_load: slowest(&r.rdb, DEFAULT_RDB_LOAD_BYTES_PER_SECOND),
            journal_replay: slowest(&r.journal, DEFAULT_JOURNAL_REPLAY_BYTES_PER_SECOND),
        }
    }

    /// Records a restore's RDB phase: `bytes` loaded in `seconds`. Returns whether it was
    /// large enough to count.
    pub fn learn_rdb(&self, bytes: u64, seconds: f64) -> bool {
        self.learn(bytes, seconds, |r| &mut r.rdb)
    }

    /// Records a restore's journal phase: `bytes` of stream applied in `seconds`.
    pub fn learn_journal(&self, bytes: u64, seconds: f64) -> bool {
        self.learn(bytes, seconds, |r| &mut r.journal)
    }

    fn learn(
        &self,
        bytes: u64,
        seconds: f64,
        phase: fn(&mut Recent) -> &mut VecDeque<f64>,
    ) -> bool {
        if bytes < MIN_MEASURED_BYTES || !seconds.is_finite() || seconds <= 0.0 {
            return false;
        }
        {
            let mut r = self.recent.lock().expect("restore rates lock");
            let v = phase(&mut r);
            if v.len() == RECENT {
                v.pop_front();
            }
            v.push_back(bytes as f64 / seconds);
        }
        self.publish();
        true
    }

    fn publish(&self) {
        let r = self.current();
        crate::metrics::RESTORE_RDB_RATE.set(r.rdb_load);
        crate::metrics::RESTORE_JOURNAL_RATE.set(r.journal_replay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_until_a_restore_large_enough_is_measured() {
        let l = LearnedRates::new();
        assert_eq!(l.current(), Rates::default());
        // Too small, or no time: not a measurement.
        assert!(!l.learn_rdb(MIN_MEASURED_BYTES - 1, 0.001));
        assert!(!l.learn_journal(100 << 20, 0.0));
        assert_eq!(l.current(), Rates::default());
        assert!(l.learn_rdb(200_000_000, 1.0));
        assert_eq!(l.current().rdb_load, 200e6);
        assert_eq!(
            l.current().journal_replay,
            DEFAULT_JOURNAL_REPLAY_BYTES_PER_SECOND
        );
        assert!(l.learn_journal(100_000_000, 2.0));
        assert_eq!(l.current().journal_replay, 50e6);
    }

    #[test]
    fn the_slowest_recent_restore_counts_until_it_ages_out() {
        let l = LearnedRates::new();
        l.learn_rdb(10_000_000, 1.0);
        for _ in 0..RECENT - 1 {
            l.learn_rdb(100_000_000, 1.0);
        }
        assert_eq!(l.current().rdb_load, 10e6, "the slow one is still recent");
        l.learn_rdb(100_000_000, 1.0);
        assert_eq!(l.current().rdb_load, 100e6, "the slow one aged out");
    }
}
