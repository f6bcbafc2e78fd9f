//! Write marks: a write's dirty keys, owned until the write is settled, and never lost.
//!
//! A mark clears its keys only when the journal covers an offset at or past the point where
//! Valkey ran the write (its batch's offset is durable), or when the write provably never ran
//! (its request was refused, or its transaction never executed: [`Durability::cancel_write`]).
//! A mark dropped any other way (its request was dropped in a queue, its connection broke
//! before a reply, Valkey's offset could not be learned) is an *orphan*: its drop hands it to
//! the [`super::resolve_orphans`] task, which keeps its keys dirty and asks Valkey's offset, with
//! backoff, until it knows one to settle it at. Marks of an older history epoch are cleared:
//! the Valkey they ran on was replaced by a restore.

use super::dirty::Scope;
use tokio::sync::mpsc;

/// A write registered with the dirty-key map.
#[derive(Debug)]
pub struct WriteMark {
    /// 0 for a blocking write, which has none (see [`super::dirty`]).
    pub(super) generation: u64,
    pub(super) blocked: bool,
    pub(super) scope: Scope,
    /// The history epoch it was made in.
    pub(super) epoch: u64,
    /// Where the mark goes if dropped unsettled; `None` once settled.
    orphans: Option<mpsc::UnboundedSender<Orphan>>,
}

/// A mark whose write's fate is unknown.
#[derive(Debug)]
pub struct Orphan {
    generation: u64,
    blocked: bool,
    scope: Scope,
    /// The history epoch its write ran in.
    pub(super) epoch: u64,
}

pub(super) type Orphans = mpsc::UnboundedSender<Orphan>;

impl WriteMark {
    pub(super) fn new(generation: u64, scope: Scope, epoch: u64, orphans: Orphans) -> WriteMark {
        WriteMark {
            generation,
            blocked: false,
            scope,
            epoch,
            orphans: Some(orphans),
        }
    }

    /// The mark of a blocking write.
    pub(super) fn new_blocked(scope: Scope, epoch: u64, orphans: Orphans) -> WriteMark {
        let mut m = WriteMark::new(0, scope, epoch, orphans);
        m.blocked = true;
        m
    }

    /// Settled: dropping it is fine from now on.
    pub(super) fn disarm(&mut self) {
        self.orphans = None;
    }
}

impl Drop for WriteMark {
    fn drop(&mut self) {
        // Never takes the gate's lock: a mark may be dropped while it is held.
        if let Some(tx) = self.orphans.take() {
            let _ = tx.send(Orphan {
                generation: self.generation,
                blocked: self.blocked,
                scope: std::mem::replace(&mut self.scope, Scope::All),
                epoch: self.epoch,
            });
        }
    }
}

impl Orphan {
    /// The orphan's mark again, to settle or cancel it.
    pub(super) fn into_mark(self, orphans: &Orphans) -> WriteMark {
        let mut m = WriteMark::new(self.generation, self.scope, self.epoch, orphans.clone());
        m.blocked = self.blocked;
        m
    }
}
