//! The checkpointer's side of [`super::trigger`]: gathers the figures the decision needs
//! from the journal, the checkpoint store and what it measured, publishes the restore
//! estimate, and warns once when the budget cannot be met or the ring is smaller than the
//! sizing rule asks ([`trigger::undersized`]).

use super::manifest::Extent;
use super::rates::LearnedRates;
use super::store::Store;
use super::trigger::{self, Figures, Policy, Reason};
use crate::journal::{Durable, Journal};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of Valkey's used memory a checkpoint gets through per second, for the duration of
/// one before any was taken here: a fork, the dataset serialized by the child and written
/// and fsynced by walrus. Conservative, as the rates of a restore are: the RDB is usually
/// smaller than the memory, and a fast box does several times this.
const CHECKPOINT_BYTES_PER_SECOND: f64 = 50e6;
/// How often Valkey's used memory is read again while no checkpoint here gave a duration.
const USED_MEMORY_REFRESH: Duration = Duration::from_secs(10);

pub(super) struct Planner {
    policy: Policy,
    rates: Arc<LearnedRates>,
    write_rate: WriteRate,
    /// How long the last checkpoint here took.
    last_duration: Option<f64>,
    /// Valkey's used memory, as last read.
    used_memory: Option<u64>,
    /// When it was last asked for.
    asked_memory: Option<Instant>,
    /// The budget cannot be met and the log said so: once, until it can again.
    warned: bool,
    /// Nor at this write rate, and the log said so.
    warned_rate: bool,
    /// The ring is smaller than the sizing rule asks for, and the log said so: once, until
    /// it holds twice what the rule asks (a rate hovering at the limit warns once).
    warned_ring: bool,
}

impl Planner {
    pub(super) fn new(policy: Policy, rates: Arc<LearnedRates>) -> Planner {
        Planner {
            policy,
            rates,
            write_rate: WriteRate::default(),
            last_duration: None,
            used_memory: None,
            asked_memory: None,
            warned: false,
            warned_rate: false,
            warned_ring: false,
        }
    }

    /// Whether Valkey's used memory should be read now: only while no checkpoint here
    /// measured a duration, and not more often than [`USED_MEMORY_REFRESH`].
    pub(super) fn wants_used_memory(&self, now: Instant) -> bool {
        self.last_duration.is_none()
            && self
                .asked_memory
                .is_none_or(|t| now.duration_since(t) >= USED_MEMORY_REFRESH)
    }

    /// Valkey's used memory as read at `now` (`None`: it could not be read).
    pub(super) fn used_memory(&mut self, now: Instant, bytes: Option<u64>) {
        self.asked_memory = Some(now);
        self.used_memory = bytes.or(self.used_memory);
    }

    /// A checkpoint here took `seconds`: the next one is expected to take as long.
    pub(super) fn took(&mut self, seconds: f64) {
        self.last_duration = Some(seconds);
    }

    /// How long the next checkpoint is expected to take: as long as the last one here, or
    /// before any, the larger of Valkey's used memory and the recorded RDB (`rdb_bytes`) at
    /// [`CHECKPOINT_BYTES_PER_SECOND`].
    pub(super) fn checkpoint_seconds(&self, rdb_bytes: u64) -> f64 {
        self.last_duration.unwrap_or_else(|| {
            self.used_memory.unwrap_or(rdb_bytes).max(rdb_bytes) as f64
                / CHECKPOINT_BYTES_PER_SECOND
        })
    }

    /// Whether a checkpoint must start now, and why.
    pub(super) fn due(&mut self, journal: &Journal, store: &Store, now: Instant) -> Option<Reason> {
        let f = self.figures(journal, store, now);
        let estimate = trigger::estimate(&f, &self.policy);
        crate::metrics::RESTORE_ESTIMATE.set(estimate.seconds());
        if estimate.floored && !self.warned {
            tracing::warn!(
                "checkpoint.max_restore_seconds = {} cannot be met with this dataset: the \
                 checkpoint's RDB of {} bytes alone takes about {:.3} s to load at {:.1} MB/s, \
                 and a checkpoint cannot make it smaller; checkpoints keep the journal to a \
                 quarter of the budget ({:.3} s) instead",
                self.policy.max_restore_seconds,
                f.rdb_bytes,
                estimate.rdb_seconds,
                f.rates.rdb_load / 1e6,
                estimate.allowance
            );
        }
        let out_of_reach = estimate.over_budget() && !estimate.checkpoint_helps();
        if out_of_reach && !self.warned_rate {
            tracing::warn!(
                "checkpoint.max_restore_seconds = {} cannot be met at this write rate: the \
                 {:.3} MB/s written while one checkpoint runs ({:.3} s) alone replays in \
                 {:.3} s, over the journal's {:.3} s; checkpoints follow the ring's room instead",
                self.policy.max_restore_seconds,
                f.write_rate / 1e6,
                f.checkpoint_seconds,
                estimate.during_checkpoint_seconds,
                estimate.allowance
            );
        }
        self.warned = estimate.floored;
        self.warned_rate = out_of_reach;
        match trigger::undersized(&f) {
            Some(u) if !self.warned_ring => {
                tracing::warn!("{u}");
                self.warned_ring = true;
            }
            Some(_) => {}
            None => {
                let holds_twice = trigger::RING_SIZING * f.write_rate * f.checkpoint_seconds * 2.0
                    <= f.ring_bytes as f64;
                self.warned_ring &= !holds_twice;
            }
        }
        trigger::decide(&f, &self.policy)
    }

    fn figures(&mut self, journal: &Journal, store: &Store, now: Instant) -> Figures {
        let status = journal.status();
        let recorded = store.recorded_extent();
        let journal_bytes = replayed(recorded, status.durable);
        let rdb_bytes = recorded.map_or(0, |c| c.size);
        let checkpoint_seconds = self.checkpoint_seconds(rdb_bytes);
        Figures {
            ring_bytes: u64::from(status.segments) * status.segment_bytes,
            segment_bytes: status.segment_bytes,
            used_bytes: status.used_segments * status.segment_bytes,
            free_bytes: status.free_bytes,
            write_rate: self.write_rate.sample(now, status.write_pos),
            checkpoint_seconds,
            rdb_bytes,
            journal_bytes,
            rates: self.rates.current(),
            room_wanted: status.room_wanted,
        }
    }
}

/// The journal a restore from `recorded` replays after its RDB: from the checkpoint's offset
/// to the durable end, in replication offsets, which run on through the chain's histories
/// (`crate::datadir::chain`), so no file is read. A durable end before the checkpoint's
/// first entry is another history's offset: nothing of the journal to replay yet.
fn replayed(recorded: Option<Extent>, durable: Durable) -> u64 {
    recorded
        .filter(|c| durable.lsn >= c.from_lsn)
        .map_or(0, |c| durable.repl_offset.saturating_sub(c.offset))
}

/// The journal's write rate: exponentially weighted averages of the ring position's advance,
/// weighted by time, so that samples taken at irregular moments (each durable advance)
/// count for the time they cover, and a long idle span brings them down. The rate used is
/// the larger of a long and a short average: the long one sees through the pauses between
/// bursts, the short one sees a burst within a second. With the long one alone, a burst of
/// large writes (300 MB/s after an idle minute) filled the ring before the average had
/// risen enough to ask for room, and writes waited out the checkpoint.
#[derive(Debug, Default)]
pub struct WriteRate {
    last: Option<(std::time::Instant, u64)>,
    long: f64,
    short: f64,
}

/// How long the long average remembers: long enough to see through the pauses between
/// bursts, short enough to follow a load that changed within the time of a checkpoint.
const WRITE_RATE_WINDOW_SECONDS: f64 = 10.0;
/// How long the short one does: a burst shows within about this.
const WRITE_RATE_BURST_SECONDS: f64 = 1.0;
/// Samples closer together than this are folded into the next one: a rate over a few
/// microseconds is noise.
const WRITE_RATE_MIN_SAMPLE_SECONDS: f64 = 0.1;

impl WriteRate {
    /// Takes the ring position `pos` (it only grows) at `now`; returns the rate.
    pub fn sample(&mut self, now: std::time::Instant, pos: u64) -> f64 {
        let Some((then, before)) = self.last else {
            self.last = Some((now, pos));
            return self.rate();
        };
        let dt = now.saturating_duration_since(then).as_secs_f64();
        if dt < WRITE_RATE_MIN_SAMPLE_SECONDS {
            return self.rate();
        }
        let instant = pos.saturating_sub(before) as f64 / dt;
        let follow = |avg: &mut f64, window: f64| {
            *avg += (1.0 - (-dt / window).exp()) * (instant - *avg);
        };
        follow(&mut self.long, WRITE_RATE_WINDOW_SECONDS);
        follow(&mut self.short, WRITE_RATE_BURST_SECONDS);
        self.last = Some((now, pos));
        self.rate()
    }

    fn rate(&self) -> f64 {
        self.long.max(self.short)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    #[test]
    fn a_restore_replays_the_stream_after_the_checkpoint_of_its_history() {
        let cp = Extent {
            size: 10,
            offset: 1000,
            from_lsn: 5,
        };
        let durable = |lsn, repl_offset| Durable {
            lsn,
            repl_offset,
            failed: false,
        };
        assert_eq!(replayed(None, durable(9, 5000)), 0, "no checkpoint");
        assert_eq!(replayed(Some(cp), durable(9, 5000)), 4000);
        // Entries before from_lsn are another history's (or covered): their offsets,
        // larger or smaller, say nothing about this one.
        assert_eq!(replayed(Some(cp), durable(4, 900_000)), 0);
        // The RDB was cut after the last durable entry.
        assert_eq!(replayed(Some(cp), durable(5, 990)), 0);
    }

    #[test]
    fn the_write_rate_follows_the_ring_and_decays_when_idle() {
        let mut w = WriteRate::default();
        let t0 = Instant::now();
        assert_eq!(w.sample(t0, 0), 0.0);
        // 10 MB/s for a minute, six windows: the average gets within 0.5% of it.
        let mut rate = 0.0;
        for s in 1..=60 {
            rate = w.sample(t0 + Duration::from_secs(s), s * 10 * MB);
        }
        assert!((rate - 10e6).abs() < 0.05e6, "{rate}");
        // Samples closer than the minimum change nothing.
        let close = w.sample(t0 + Duration::from_millis(60_050), 600 * MB + 5);
        assert_eq!(close, rate);
        // A minute without writes, seen at the next write: nearly nothing.
        let idle = w.sample(t0 + Duration::from_secs(120), 600 * MB + 10);
        assert!(idle < 0.03e6, "{idle}");
    }

    /// Found by the benchmark: 180 KiB SETs at 300 MB/s after an idle minute filled the
    /// ring before a 10 s average rose enough to ask for room. Within a second of a burst
    /// the rate shows most of it.
    #[test]
    fn the_write_rate_sees_a_burst_within_a_second() {
        let mut w = WriteRate::default();
        let t0 = Instant::now();
        w.sample(t0, 0);
        w.sample(t0 + Duration::from_secs(60), 0);
        let mut rate = 0.0;
        for tenth in 1..=10u64 {
            rate = w.sample(
                t0 + Duration::from_secs(60) + Duration::from_millis(100 * tenth),
                tenth * 30 * MB,
            );
        }
        assert!(rate > 0.6 * 300e6, "{rate}");
    }
}
