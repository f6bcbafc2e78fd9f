//! The journal's pace while a checkpoint runs.
//!
//! A checkpoint releases only what was durable when it started, so everything the journal
//! writes meanwhile must fit the ring's free room. At a write rate the room cannot hold for
//! the checkpoint's whole duration, an unpaced ring fills part-way through, and every write
//! then waits at once for the rest of the checkpoint: a stall of seconds (180 KiB SETs on a
//! local disk, p99.9 above 1 s). Paced, the replica link appends no faster than would use
//! the free room left in half the checkpoint's expected duration ([`Pacer::wait`]): the rate
//! follows the room down smoothly, all writes slow a little instead of a few stopping, and
//! the ring keeps room to the end of a checkpoint that takes twice as long as the last one.
//!
//! Why the free room *now*, not a schedule fixed at the start: the rate it allows decays
//! exponentially, so a checkpoint that overruns its estimate meets slower writes, never a
//! full ring (unless one entry is larger than the room left, which then waits for the
//! release as before: the link's `ring_full` wait). At a rate the ring can hold, the pace
//! never binds. Writes wait for it where they wait for a full ring: Valkey keeps the stream
//! in its replica buffer, replies stay held, and the gate's `durability.max_pending_bytes`
//! stops new writes.

use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The link's rate while a checkpoint runs, as a multiple of "the free room over the
/// checkpoint's expected duration". At 2, a checkpoint that takes as long as expected ends
/// with e^-2 (14%) of the room it started with still free, and one that takes twice as long
/// with 2%. The price, with checkpoints back to back (a ring under the sizing rule), is that
/// room: each checkpoint's writes use 1 - e^-2 (86%) of what the one before released, where
/// unpaced they used all of it and then stopped. With a ring the rule sizes, the pace never
/// binds (the *ring_room* rule starts a checkpoint with twice its writes free).
pub const PACE_ROOM_PER_CHECKPOINT: f64 = 2.0;

/// How far behind its schedule the link may be and still catch up (append without waiting):
/// timers fire late, but a link that had nothing to append for longer than this starts
/// afresh rather than in a burst.
const CATCH_UP: Duration = Duration::from_millis(20);

/// Shared by the checkpointer, which says when a checkpoint runs and how long it is expected
/// to take, and the replica link, which waits on it ([`Pacer`]) before each append.
#[derive(Debug, Clone)]
pub struct Pace {
    expected: std::sync::Arc<watch::Sender<Option<f64>>>,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            expected: std::sync::Arc::new(watch::Sender::new(None)),
        }
    }
}

impl Pace {
    /// A checkpoint expected to take `seconds` starts; the pace holds until the returned
    /// guard is dropped (the checkpoint ended, however).
    pub fn begin(&self, seconds: f64) -> Running<'_> {
        self.expected
            .send_replace(Some(seconds).filter(|s| s.is_finite() && *s > 0.0));
        Running(self)
    }

    /// The link's side.
    pub fn pacer(&self) -> Pacer {
        Pacer {
            expected: self.expected.subscribe(),
            next: None,
        }
    }
}

/// A checkpoint running: dropped, the pace ends and a waiting link goes on at once.
pub struct Running<'a>(&'a Pace);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.expected.send_replace(None);
    }
}

/// The replica link's pace: one per link attachment.
#[derive(Debug)]
pub struct Pacer {
    expected: watch::Receiver<Option<f64>>,
    /// The earliest moment of the next append while a checkpoint runs.
    next: Option<Instant>,
}

impl Pacer {
    /// Waits until an entry of `len` bytes may be appended: at once unless a checkpoint
    /// runs; then no sooner than the previous append's share of the free room allows, the
    /// room being `free()` (the ring's free bytes, read only while a checkpoint runs).
    /// Returns how long it waited.
    pub async fn wait(&mut self, len: u64, free: impl Fn() -> u64) -> Duration {
        let began = Instant::now();
        loop {
            let Some(expected) = *self.expected.borrow_and_update() else {
                self.next = None;
                return began.elapsed();
            };
            let now = Instant::now();
            match self.next {
                Some(at) if at > now => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        // The checkpoint ended (or the checkpointer is gone): look again.
                        r = self.expected.changed() => if r.is_err() {
                            self.next = None;
                            return began.elapsed();
                        },
                    }
                }
                _ => {
                    let rate = PACE_ROOM_PER_CHECKPOINT * free().max(1) as f64 / expected;
                    // From the previous entry's slot, not from now: a timer fires up to its
                    // resolution (a millisecond) late, and entries of about a millisecond
                    // each would otherwise go at half the pace.
                    let from = self
                        .next
                        .filter(|at| now.duration_since(*at) < CATCH_UP)
                        .unwrap_or(now);
                    self.next = Some(from + Duration::from_secs_f64(len as f64 / rate));
                    return began.elapsed();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Appends `len` bytes at a time to a ring with `room` bytes free, for `for_seconds`
    /// of the paused clock; returns the bytes appended.
    async fn append_for(pacer: &mut Pacer, room: &Cell<u64>, len: u64, for_seconds: f64) -> u64 {
        let end = Instant::now() + Duration::from_secs_f64(for_seconds);
        let mut appended = 0;
        while Instant::now() < end {
            pacer.wait(len, || room.get()).await;
            room.set(room.get().saturating_sub(len));
            appended += len;
        }
        appended
    }

    #[tokio::test(start_paused = true)]
    async fn no_checkpoint_no_pace() {
        let pace = Pace::default();
        let mut pacer = pace.pacer();
        let room = Cell::new(1000);
        let t = Instant::now();
        for _ in 0..100 {
            assert_eq!(pacer.wait(1000, || room.get()).await, Duration::ZERO);
        }
        assert_eq!(t.elapsed(), Duration::ZERO);
    }

    /// 100 MB free and a checkpoint expected to take 2 s: writes that would fill the ring
    /// within a second use 1 - e^-2 of the room by the expected end, and still leave some
    /// at twice that; the rate follows the room down.
    #[tokio::test(start_paused = true)]
    async fn the_room_is_used_at_a_rate_that_follows_it_down() {
        const MB: u64 = 1_000_000;
        let pace = Pace::default();
        let mut pacer = pace.pacer();
        let room = Cell::new(100 * MB);
        let _running = pace.begin(2.0);
        // At first 100 MB over 1 s.
        let first = append_for(&mut pacer, &room, MB / 10, 0.1).await;
        assert!((9 * MB..=11 * MB).contains(&first), "{first}");
        append_for(&mut pacer, &room, MB / 10, 1.9).await;
        let left = room.get() as f64 / (100 * MB) as f64;
        assert!((left - (-2f64).exp()).abs() < 0.01, "{left}");
        append_for(&mut pacer, &room, MB / 10, 2.0).await;
        let left = room.get() as f64 / (100 * MB) as f64;
        assert!(left > 0.01 && (left - (-4f64).exp()).abs() < 0.01, "{left}");
    }

    /// A link waiting on the pace goes on as soon as the checkpoint ends.
    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_checkpoint_ends_the_wait() {
        let pace = Pace::default();
        let mut pacer = pace.pacer();
        let running = pace.begin(10.0);
        // 1 KB of room at 10 s: the second entry of 1 KB would wait 5 s.
        pacer.wait(1000, || 1000).await;
        let t = Instant::now();
        let wait = tokio::spawn(async move { pacer.wait(1000, || 1000).await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(running);
        let waited = wait.await.unwrap();
        assert_eq!(waited, Duration::from_secs(1));
        assert_eq!(t.elapsed(), Duration::from_secs(1));
    }
}
