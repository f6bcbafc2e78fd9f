//! Waiting between retries of what Valkey could not answer: exponential backoff.

use std::time::Duration;

/// Waits that double from `min` up to `max`, and start again at `min` after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// `max` below `min` counts as `min`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
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
