//! A bound on every wait the gate imposes: walrus never hangs.
//!
//! A reply waits for the journal to cover it, and a write for room (pending bytes, held
//! memory). Each wait normally ends within a group commit, or with an error the moment its
//! cause is known (the journal failed; Valkey restarted, a new epoch). What could make one
//! last forever is a cause walrus cannot see the end of: a Valkey that became unreachable
//! after it answered but before its stream reached the link, a journal device that stopped
//! answering. Past `durability.max_hold_ms` such a reply gets an error saying its outcome is
//! unknown, and a write waiting for room gets `-MISCONF`. The writes' keys stay dirty: a
//! read shows what they wrote only once it is durable (or gets the same error when it has
//! waited as long).

use super::{Durability, Refusal};
use std::time::{Duration, Instant};

impl Durability {
    /// Fails replies held longer than the bound, checking four times per bound.
    pub async fn bound_holds(&self) {
        let mut tick = tokio::time::interval((self.max_hold / 4).max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.expire_held(Instant::now());
        }
    }

    /// Fails every reply that arrived more than the bound before `now`.
    pub(super) fn expire_held(&self, now: Instant) {
        let Some(cutoff) = now.checked_sub(self.max_hold) else {
            return;
        };
        let mut s = self.lock();
        if s.held.is_empty() {
            return;
        }
        let (writes, reads) = s.held.take_arrived_by(cutoff);
        drop(s);
        if writes.is_empty() && reads.is_empty() {
            return;
        }
        let write = Refusal::WriteExpired(self.max_hold).reply();
        let read = Refusal::ReadExpired(self.max_hold).reply();
        tracing::warn!(
            writes = writes.len(),
            reads = reads.len(),
            "replies held longer than durability.max_hold_ms get an error"
        );
        writes.into_iter().for_each(|h| h.fail(&write));
        reads.into_iter().for_each(|h| h.fail(&read));
        self.room.notify_waiters();
    }
}
