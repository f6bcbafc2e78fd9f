//! Notices held like data: a keyspace notification (`__keyspace@0__:k`, `__keyevent@0__:set`
//! with `k`) or a CLIENT TRACKING invalidation tells its client that a key changed, so it
//! reaches the client only once the journal covers the write that changed it, as a read of
//! that key would ([the rule](super)).
//!
//! A notice is weighed as it arrives from Valkey ([`Durability::notice`]): when nothing it
//! names is dirty it may go at once; otherwise it waits until every write up to the newest
//! pending one on its keys is settled ([`super::dirty`]). Its client's [`Notices`] watches the
//! gate's progress and says when: the proxy keeps each client's messages in order behind it
//! (`proxy::pushes`), so a message that names nothing (a PUBLISH) waits behind a held one.
//!
//! A notice that can never be released (Valkey's history changed under the write, which may
//! be lost; the journal failed; `durability.max_hold_ms` passed) is never delivered, and its
//! client's connection is closed with the reason ([`Refusal::NoticeWithheld`]): a subscriber
//! or a client-side cache that silently missed one would go on with stale data.

use super::gate::Progress;
use super::{Durability, Refusal};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// What a notice names, as its text tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Names {
    /// Keys of a database, or (`None`) of whichever: a tracking invalidation names keys only.
    Keys { db: Option<u32>, keys: Vec<Bytes> },
    /// Anything: a flush's invalidation, or a notice walrus cannot read.
    Everything,
}

/// A notice that waits: until every write up to `through` is settled, in `epoch`.
#[derive(Debug)]
pub struct Notice {
    epoch: u64,
    through: u64,
    arrived: Instant,
}

impl Durability {
    /// A notice naming `names` arrived on a connection of history `epoch`: what it waits for,
    /// or `None` when it may go at once.
    pub fn notice(&self, names: &Names, epoch: u64) -> Option<Notice> {
        let arrived = Instant::now();
        if self.epoch_now.load(Ordering::SeqCst) != epoch {
            // From a Valkey the journal no longer follows: what it reports may be lost.
            return Some(Notice {
                epoch,
                through: u64::MAX,
                arrived,
            });
        }
        // As for a read: a write marked after this was sent after the notice arrived.
        if self.pending_writes.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let s = self.lock();
        let through = match names {
            Names::Keys { db, keys } => s.dirty.pending_for_notice(*db, keys),
            Names::Everything => s.dirty.pending_for(&super::dirty::Scope::All),
        }?;
        Some(Notice {
            epoch: s.epoch,
            through,
            arrived,
        })
    }

    /// A client's view of the gate's progress, to release its notices by.
    pub fn notices(self: &Arc<Self>) -> Notices {
        Notices {
            progress: self.progress.subscribe(),
            gate: self.clone(),
        }
    }
}

/// Says when a client's notices may go.
pub struct Notices {
    progress: watch::Receiver<Progress>,
    gate: Arc<Durability>,
}

impl Notices {
    /// Whether `n` may go now; `Err` when it never will.
    pub fn ready(&mut self, n: &Notice) -> Result<bool, Refusal> {
        let p = *self.progress.borrow_and_update();
        if p.epoch != n.epoch {
            return Err(withheld(
                "reports a write Valkey may have lost: it restarted, or was restored, before the write was journaled",
            ));
        }
        if p.settled_through >= n.through {
            return Ok(true);
        }
        if p.failed {
            let why = Refusal::of(&self.gate.status());
            return Err(withheld(&format!(
                "reports a write the journal will never hold ({why})"
            )));
        }
        if n.arrived.elapsed() >= self.gate.max_hold {
            return Err(withheld(&format!(
                "reports a write not journaled within {} ms (durability.max_hold_ms)",
                self.gate.max_hold.as_millis()
            )));
        }
        Ok(false)
    }

    /// Waits until `n` may go; `Err` when it never will. Cancel-safe.
    pub async fn released(&mut self, n: &Notice) -> Result<(), Refusal> {
        let deadline = tokio::time::Instant::from_std(n.arrived + self.gate.max_hold);
        while !self.ready(n)? {
            tokio::select! {
                // The gate outlives every client (this holds it): `changed` cannot fail.
                _ = self.progress.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
        Ok(())
    }
}

fn withheld(why: &str) -> Refusal {
    Refusal::NoticeWithheld(why.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::dirty::Scope;
    use std::time::Duration;

    fn gate() -> Arc<Durability> {
        let d = Durability::new(u64::MAX, u64::MAX).with_max_hold(Duration::from_millis(200));
        d.attach("run", 100, true, false, 100);
        Arc::new(d)
    }

    fn k(key: &'static [u8]) -> Names {
        Names::Keys {
            db: Some(0),
            keys: vec![Bytes::from_static(key)],
        }
    }

    #[tokio::test]
    async fn a_notice_of_a_dirty_key_goes_once_its_write_is_durable() {
        let d = gate();
        let epoch = d.epoch();
        let mut notices = d.notices();
        assert!(d.notice(&k(b"k"), epoch).is_none(), "nothing pending");
        let mark = d.begin_write(Scope::Keys {
            db: 0,
            keys: vec![Bytes::from_static(b"k")],
        });
        let n = d.notice(&k(b"k"), epoch).expect("k is dirty");
        assert!(d.notice(&k(b"other"), epoch).is_none(), "other is clean");
        assert!(!notices.ready(&n).unwrap());
        d.settle_batch(150, epoch, Vec::new(), vec![mark.unwrap()]);
        assert!(!notices.ready(&n).unwrap(), "ran, not yet durable");
        d.set_durable(150);
        notices.released(&n).await.unwrap();
    }

    #[tokio::test]
    async fn a_notice_that_cannot_go_closes_its_client_with_the_reason() {
        let d = gate();
        let epoch = d.epoch();
        let mut notices = d.notices();
        let _mark = d.begin_write(Scope::All).unwrap();
        let n = d.notice(&Names::Everything, epoch).unwrap();
        let err = notices.released(&n).await.unwrap_err().to_string();
        assert!(
            err.contains("within 200 ms (durability.max_hold_ms)"),
            "{err}"
        );
        let stale = d.notice(&Names::Everything, epoch + 1).unwrap();
        let err = notices.ready(&stale).unwrap_err().to_string();
        assert!(err.contains("Valkey may have lost"), "{err}");
        d.fail("disk on fire");
        let err = notices.ready(&n).unwrap_err().to_string();
        assert!(err.contains("disk on fire"), "{err}");
    }
}
