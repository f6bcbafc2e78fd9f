//! When to take a checkpoint: as late as the ring's room and the restore budget allow.
//!
//! A checkpoint costs Valkey a fork and its whole dataset through its main thread, so it is
//! taken only when something requires it (as Redis Enterprise postpones its AOF rewrite "as
//! much as possible without infringing the SLA for recovery time and without reaching the
//! disk space limit"). The rules, in order:
//!
//! 1. **ring_full**: an append was refused because the ring is full. Only a checkpoint makes
//!    room, and a large entry (a value of hundreds of MB) can meet a full ring well below the
//!    fill trigger; without this rule the replica link would wait for a release no other
//!    rule starts.
//! 2. **ring_fill**: the ring's segments in use reached `checkpoint.ring_fill_trigger`, the
//!    latest point, whatever the estimates say.
//! 3. **ring_room**: the ring's free room is below what the journal will need while the next
//!    checkpoint runs, twice over: `2 × write rate × expected checkpoint duration`. A
//!    checkpoint releases only what was durable when it started, so the writes made while it
//!    runs must fit the room left.
//! 4. **restore_budget**: a restore now would take `rdb_bytes / rdb_load_rate +
//!    journal_bytes / journal_replay_rate`; a checkpoint starts when the journal part exceeds
//!    what the budget leaves after the RDB part. A checkpoint cannot shrink the RDB part: when
//!    the RDB alone takes more than three quarters of the budget, the journal still gets a
//!    quarter of it, rather than checkpointing constantly for nothing. Nor can it shrink the
//!    journal below what is written while it runs: when that alone exceeds the allowance,
//!    the rule stands aside (the ring's rules still apply) rather than run checkpoints back
//!    to back.
//!
//! [`decide`] is the whole decision, a pure function of [`Figures`] and [`Policy`].
//!
//! No rule helps a ring smaller than the writes of one checkpoint and the room for the
//! next: `RING_SIZING × write rate × checkpoint duration` (docs/design.md, "Sizing the ring").
//! Checkpoints then run back to back and writes wait for them; [`undersized`] says so, with
//! the segments the rule asks for, and the checkpointer warns.

use super::rates::Rates;

/// Of the restore budget, the least the journal is allowed, however large the RDB.
const JOURNAL_FLOOR_SHARE: f64 = 0.25;
/// The ring room asked for the next checkpoint's writes, as a multiple of what they are
/// expected to be: the write rate and the checkpoint's duration are both estimates, and a
/// ring that fills up makes writes wait.
const ROOM_MARGIN: f64 = 2.0;

/// The ring the sizing rule (docs/design.md, "Sizing the ring") asks for, in checkpoints' worth of writes: what the
/// last checkpoint left in it, and the *ring_room* rule's [`ROOM_MARGIN`] times that for the
/// next one.
pub const RING_SIZING: f64 = 1.0 + ROOM_MARGIN;

/// The configured limits.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// `checkpoint.ring_fill_trigger`, resolved.
    pub ring_fill_trigger: f64,
    /// `checkpoint.max_restore_seconds`.
    pub max_restore_seconds: f64,
}

/// What the checkpointer knows when it decides.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    pub ring_bytes: u64,
    pub segment_bytes: u64,
    /// The ring's segments in use, in bytes (what `ring_fill_trigger` is a fraction of).
    pub used_bytes: u64,
    /// What the journal may still append before the ring is full.
    pub free_bytes: u64,
    /// Recent ring bytes written per second.
    pub write_rate: f64,
    /// How long the next checkpoint is expected to take.
    pub checkpoint_seconds: f64,
    /// The recorded checkpoint's RDB.
    pub rdb_bytes: u64,
    /// The journal a restore from it would replay.
    pub journal_bytes: u64,
    pub rates: Rates,
    /// The last append was refused because the ring is full.
    pub room_wanted: bool,
}

/// What a restore would take now, and what the budget allows the journal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub rdb_seconds: f64,
    pub journal_seconds: f64,
    /// The journal's part of the budget: what the RDB leaves, at least the floor.
    pub allowance: f64,
    /// The RDB leaves less than the floor: the budget cannot be met with this dataset.
    pub floored: bool,
    /// The journal written while one checkpoint runs, in seconds of replay: what even a
    /// checkpoint just taken leaves.
    pub during_checkpoint_seconds: f64,
}

impl Estimate {
    /// Whether the journal takes more than the budget leaves it.
    pub fn over_budget(&self) -> bool {
        self.journal_seconds > self.allowance
    }

    /// Whether a checkpoint now would bring the journal within its allowance.
    pub fn checkpoint_helps(&self) -> bool {
        self.during_checkpoint_seconds < self.allowance
    }

    pub fn seconds(&self) -> f64 {
        self.rdb_seconds + self.journal_seconds
    }
}

/// Why a checkpoint starts, with the figures that decided it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reason {
    /// An append was refused because the ring is full.
    RingFull,
    RingFill {
        fill: f64,
        trigger: f64,
    },
    RingRoom {
        free_bytes: u64,
        need_bytes: u64,
        write_rate: f64,
        checkpoint_seconds: f64,
    },
    RestoreBudget {
        estimate: Estimate,
        rdb_bytes: u64,
        journal_bytes: u64,
        budget: f64,
    },
    /// `walrus checkpoint` asked.
    Request,
}

impl Reason {
    pub fn kind(&self) -> crate::metrics::CheckpointStart {
        use crate::metrics::CheckpointStart as S;
        match self {
            Reason::RingFull => S::RingFull,
            Reason::RingFill { .. } => S::RingFill,
            Reason::RingRoom { .. } => S::RingRoom,
            Reason::RestoreBudget { .. } => S::RestoreBudget,
            Reason::Request => S::Request,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Reason::RingFull => write!(
                f,
                "ring_full: the journal refused an entry for want of room in the ring"
            ),
            Reason::RingFill { fill, trigger } => write!(
                f,
                "ring_fill: {:.0}% of the ring's segments in use, checkpoint.ring_fill_trigger is {:.0}%",
                fill * 100.0,
                trigger * 100.0
            ),
            Reason::RingRoom {
                free_bytes,
                need_bytes,
                write_rate,
                checkpoint_seconds,
            } => write!(
                f,
                "ring_room: {free_bytes} bytes of the ring free, under the {need_bytes} the next \
                 checkpoint needs ({ROOM_MARGIN} x {:.3} MB/s of writes x {checkpoint_seconds:.3} s)",
                write_rate / 1e6
            ),
            Reason::RestoreBudget {
                estimate,
                rdb_bytes,
                journal_bytes,
                budget,
            } => write!(
                f,
                "restore_budget: a restore would take {:.3} s ({:.3} s for {rdb_bytes} bytes of \
                 RDB, {:.3} s for {journal_bytes} bytes of journal); \
                 checkpoint.max_restore_seconds = {budget} leaves the journal {:.3} s",
                estimate.seconds(),
                estimate.rdb_seconds,
                estimate.journal_seconds,
                estimate.allowance
            ),
            Reason::Request => write!(f, "request: walrus checkpoint asked"),
        }
    }
}

/// A ring smaller than the sizing rule asks for at the current write rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Undersized {
    pub ring_bytes: u64,
    /// `RING_SIZING × write_rate × checkpoint_seconds`.
    pub needed_bytes: u64,
    /// The `journal.segments` that hold it, at the ring's segment size.
    pub segments: u64,
    pub write_rate: f64,
    pub checkpoint_seconds: f64,
}

impl std::fmt::Display for Undersized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the journal's ring of {} bytes cannot hold this write rate: the sizing rule \
             (docs/design.md, \"Sizing the ring\") asks for {RING_SIZING} x write rate x checkpoint \
             time = {RING_SIZING} x {:.3} MB/s x {:.3} s = {} bytes; checkpoints run back to back \
             and writes slow down to what they release. Give it journal.segments = {} or more \
             (docs/operations.md, \"Resizing the ring\")",
            self.ring_bytes,
            self.write_rate / 1e6,
            self.checkpoint_seconds,
            self.needed_bytes,
            self.segments
        )
    }
}

/// Whether the ring is smaller than the sizing rule asks for at the current write rate
/// and checkpoint duration.
pub fn undersized(f: &Figures) -> Option<Undersized> {
    let needed = RING_SIZING * f.write_rate * f.checkpoint_seconds;
    ((f.ring_bytes as f64) < needed).then(|| Undersized {
        ring_bytes: f.ring_bytes,
        needed_bytes: needed as u64,
        segments: (needed / f.segment_bytes.max(1) as f64).ceil() as u64,
        write_rate: f.write_rate,
        checkpoint_seconds: f.checkpoint_seconds,
    })
}

/// What a restore from the recorded checkpoint and the journal after it would take now.
pub fn estimate(f: &Figures, p: &Policy) -> Estimate {
    let (rdb_seconds, journal_seconds) = f.rates.restore_seconds(f.rdb_bytes, f.journal_bytes);
    let left = p.max_restore_seconds - rdb_seconds;
    let floor = p.max_restore_seconds * JOURNAL_FLOOR_SHARE;
    Estimate {
        rdb_seconds,
        journal_seconds,
        allowance: left.max(floor),
        floored: left < floor,
        during_checkpoint_seconds: f.write_rate * f.checkpoint_seconds / f.rates.journal_replay,
    }
}

/// Whether a checkpoint must start now, and why.
pub fn decide(f: &Figures, p: &Policy) -> Option<Reason> {
    if f.room_wanted {
        return Some(Reason::RingFull);
    }
    let fill = f.used_bytes as f64 / f.ring_bytes.max(1) as f64;
    if fill >= p.ring_fill_trigger {
        return Some(Reason::RingFill {
            fill,
            trigger: p.ring_fill_trigger,
        });
    }
    let need = ROOM_MARGIN * f.write_rate * f.checkpoint_seconds;
    if (f.free_bytes as f64) < need {
        return Some(Reason::RingRoom {
            free_bytes: f.free_bytes,
            need_bytes: need as u64,
            write_rate: f.write_rate,
            checkpoint_seconds: f.checkpoint_seconds,
        });
    }
    let estimate = estimate(f, p);
    let due = estimate.over_budget() && estimate.checkpoint_helps();
    due.then_some(Reason::RestoreBudget {
        estimate,
        rdb_bytes: f.rdb_bytes,
        journal_bytes: f.journal_bytes,
        budget: p.max_restore_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    /// A quiet walrus: a quarter of a 1000 MB ring in use, 1 MB/s of writes, 2 s
    /// checkpoints, a 100 MB RDB (2 s) and 100 MB of journal (5 s) at the default rates.
    fn quiet() -> (Figures, Policy) {
        (
            Figures {
                ring_bytes: 1000 * MB,
                segment_bytes: 50 * MB,
                used_bytes: 250 * MB,
                free_bytes: 750 * MB,
                write_rate: 1e6,
                checkpoint_seconds: 2.0,
                rdb_bytes: 100 * MB,
                journal_bytes: 100 * MB,
                rates: Rates::default(),
                room_wanted: false,
            },
            Policy {
                ring_fill_trigger: 0.8,
                max_restore_seconds: 60.0,
            },
        )
    }

    #[test]
    fn a_quiet_walrus_takes_no_checkpoint() {
        let (f, p) = quiet();
        assert_eq!(decide(&f, &p), None);
        let e = estimate(&f, &p);
        assert_eq!((e.rdb_seconds, e.journal_seconds), (2.0, 5.0));
        assert_eq!(e.allowance, 58.0);
        assert!(!e.floored);
    }

    #[test]
    fn the_ring_fill_trigger_is_the_latest_point() {
        let (mut f, p) = quiet();
        f.used_bytes = 800 * MB;
        f.free_bytes = 200 * MB;
        assert_eq!(
            decide(&f, &p),
            Some(Reason::RingFill {
                fill: 0.8,
                trigger: 0.8
            })
        );
        f.used_bytes = 799 * MB;
        assert_eq!(decide(&f, &p), None);
    }

    #[test]
    fn the_ring_must_hold_twice_the_writes_of_the_next_checkpoint() {
        let (mut f, p) = quiet();
        // 50 MB/s for 4 s: 200 MB expected, 400 MB asked for.
        f.write_rate = 50e6;
        f.checkpoint_seconds = 4.0;
        f.free_bytes = 401 * MB;
        assert_eq!(decide(&f, &p), None);
        f.free_bytes = 399 * MB;
        assert_eq!(
            decide(&f, &p),
            Some(Reason::RingRoom {
                free_bytes: 399 * MB,
                need_bytes: 400 * MB,
                write_rate: 50e6,
                checkpoint_seconds: 4.0,
            })
        );
        // No writes: no room needed, however long a checkpoint takes.
        f.write_rate = 0.0;
        f.free_bytes = 0;
        assert_eq!(decide(&f, &p), None);
    }

    /// The sizing rule (docs/design.md): the ring holds three checkpoints' worth of writes, or it is too
    /// small, and says how many segments would do.
    #[test]
    fn a_ring_under_three_checkpoints_of_writes_is_undersized() {
        let (mut f, _) = quiet();
        assert_eq!(undersized(&f), None, "1 MB/s for 2 s: 6 MB of 1000");
        // 50 MB/s of writes and 6 s checkpoints: 900 MB, the 1000 MB ring holds it.
        f.write_rate = 50e6;
        f.checkpoint_seconds = 6.0;
        assert_eq!(undersized(&f), None);
        // 180 KiB SETs at 100 MB/s, 4 s checkpoints: 1200 MB, 24 segments of 50 MB.
        f.write_rate = 100e6;
        f.checkpoint_seconds = 4.0;
        let u = undersized(&f).expect("undersized");
        assert_eq!(
            u,
            Undersized {
                ring_bytes: 1000 * MB,
                needed_bytes: 1200 * MB,
                segments: 24,
                write_rate: 100e6,
                checkpoint_seconds: 4.0,
            }
        );
        let text = u.to_string();
        assert!(
            text.contains("ring of 1000000000 bytes cannot hold this write rate")
                && text.contains("\"Sizing the ring\"")
                && text.contains("3 x 100.000 MB/s x 4.000 s = 1200000000 bytes")
                && text.contains("journal.segments = 24 or more"),
            "{text}"
        );
        // One byte over a whole number of segments needs one more.
        f.checkpoint_seconds = 4.0 + 1.0 / 300e6;
        assert_eq!(undersized(&f).map(|u| u.segments), Some(25));
    }

    #[test]
    fn the_journal_gets_what_the_rdb_leaves_of_the_budget() {
        let (mut f, p) = quiet();
        // 2 s of RDB leave the journal 58 s: 1160 MB at 20 MB/s.
        f.journal_bytes = 1160 * MB;
        assert_eq!(decide(&f, &p), None);
        f.journal_bytes = 1161 * MB;
        let Some(Reason::RestoreBudget {
            estimate, budget, ..
        }) = decide(&f, &p)
        else {
            panic!("{:?}", decide(&f, &p));
        };
        assert_eq!(budget, 60.0);
        assert_eq!(estimate.allowance, 58.0);
        assert!((estimate.seconds() - 60.05).abs() < 1e-9, "{estimate:?}");
        // Faster learned rates postpone it.
        f.rates.journal_replay = 100e6;
        assert_eq!(decide(&f, &p), None);
    }

    #[test]
    fn an_rdb_that_takes_most_of_the_budget_leaves_the_journal_a_quarter() {
        let (mut f, p) = quiet();
        // 2500 MB of RDB: 50 s, leaving 10 s, under the floor of 15 s.
        f.rdb_bytes = 2500 * MB;
        f.journal_bytes = 300 * MB; // exactly 15 s
        let e = estimate(&f, &p);
        assert!(e.floored && e.allowance == 15.0, "{e:?}");
        assert_eq!(decide(&f, &p), None);
        f.journal_bytes = 301 * MB;
        assert!(matches!(decide(&f, &p), Some(Reason::RestoreBudget { .. })));
        // An RDB past the whole budget: still a quarter, not a checkpoint per write.
        f.rdb_bytes = 10_000 * MB;
        f.journal_bytes = 299 * MB;
        assert_eq!(decide(&f, &p), None);
    }

    #[test]
    fn reasons_name_their_rule_and_figures() {
        let (mut f, p) = quiet();
        f.journal_bytes = 2000 * MB;
        let text = decide(&f, &p).unwrap().to_string();
        assert!(
            text.starts_with("restore_budget: a restore would take 102.000 s")
                && text.contains("2.000 s for 100000000 bytes of RDB")
                && text.contains("100.000 s for 2000000000 bytes of journal")
                && text.contains("leaves the journal 58.000 s"),
            "{text}"
        );
        assert_eq!(
            decide(&f, &p).unwrap().kind(),
            crate::metrics::CheckpointStart::RestoreBudget
        );
    }

    /// A value larger than the room left below the fill trigger meets a full ring: the
    /// replica link waits for room, so that wait starts a checkpoint.
    #[test]
    fn an_append_refused_for_room_starts_a_checkpoint_below_the_fill_trigger() {
        let (mut f, p) = quiet();
        f.used_bytes = 750 * MB;
        f.free_bytes = 250 * MB;
        assert_eq!(decide(&f, &p), None);
        f.room_wanted = true;
        assert_eq!(decide(&f, &p), Some(Reason::RingFull));
    }

    /// When what one checkpoint's own duration writes exceeds the journal's allowance,
    /// checkpointing cannot meet the budget: the rule must not run them back to back.
    #[test]
    fn a_budget_no_checkpoint_can_meet_does_not_start_them_back_to_back() {
        let (mut f, p) = quiet();
        f.ring_bytes = 4000 * MB;
        f.used_bytes = 500 * MB;
        f.free_bytes = 3500 * MB;
        f.rdb_bytes = 10_000 * MB; // 200 s: floored, the journal gets 15 s, 300 MB
        f.checkpoint_seconds = 100.0;
        f.write_rate = 5e6; // 500 MB written during one checkpoint: 25 s of replay
        f.journal_bytes = 500 * MB;
        let e = estimate(&f, &p);
        assert!(e.floored && !e.checkpoint_helps(), "{e:?}");
        assert_eq!(decide(&f, &p), None);
        // At 1 MB/s one checkpoint leaves 100 MB (5 s): it helps, and the rule fires.
        f.write_rate = 1e6;
        assert!(matches!(decide(&f, &p), Some(Reason::RestoreBudget { .. })));
    }
}
