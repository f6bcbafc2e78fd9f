//! Waiting between retries of what could not be done (Valkey did not answer, the archive's
//! store failed): exponential backoff, one for every retrier in walrus, from one first wait
//! ([`Backoff::MIN`]) up to one longest ([`Backoff::MAX`]) or a configured one.

use std::time::Duration;

/// Waits that double from [`Backoff::MIN`] up to a longest wait, and start again at
/// [`Backoff::MIN`] after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// The first wait after a failure: short enough that a blip (a restart, a failover, a
    /// dropped connection) costs a waiting client little; long enough that a Valkey that
    /// refuses at once (loading, not yet listening) is asked at most 20 times a second by
    /// each retrier.
    pub const MIN: Duration = Duration::from_millis(50);

    /// The longest wait where none is configured (the replica link, marks awaiting Valkey's
    /// offset, the close of a lost connection, the managed valkey-server's restarts): a
    /// Valkey that is back is found within it, and one that is down is asked once per wait
    /// by each retrier, not flooded. Client connections (`upstream.reconnect_backoff_max_ms`)
    /// and the archive (`archive.max_backoff_ms`) configure theirs: [`Backoff::up_to`].
    pub const MAX: Duration = Duration::from_secs(2);

    /// From [`Backoff::MIN`] up to `max` (`max` below it counts as it).
    pub fn up_to(max: Duration) -> Backoff {
        Backoff::new(Backoff::MIN, max)
    }

    /// `max` below `min` counts as `min`.
    fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            next: min,
        }
    }

    /// The wait the next retry gets (for log lines that say when it comes).
    pub fn delay(&self) -> Duration {
        self.next
    }

    /// Takes the next wait; the one after is twice as long, up to `max`.
    pub fn advance(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    /// After a success: the next wait is `min` again.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

impl Default for Backoff {
    /// From [`Backoff::MIN`] up to [`Backoff::MAX`].
    fn default() -> Backoff {
        Backoff::up_to(Backoff::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_max_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(10), ms(35));
        let waits: Vec<_> = (0..4).map(|_| b.advance()).collect();
        assert_eq!(waits, [ms(10), ms(20), ms(35), ms(35)]);
        b.reset();
        assert_eq!(b.delay(), ms(10));
        assert_eq!(Backoff::new(ms(50), ms(1)).advance(), ms(50));
    }
}
