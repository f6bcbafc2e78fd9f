//! What the gate's lock guards: the link's state and offsets, the dirty keys, the held
//! replies, why writes are refused; and the rules that read them under the lock
//! ([`super::gate`] takes it).

use super::dirty::DirtyKeys;
use super::marks::WriteMark;
use super::queue::{Held, HeldQueue};
use super::status::{LinkState, Refusal};

pub(super) struct State {
    pub(super) status: LinkState,
    /// Highest replication offset the journal holds durably (or that a stored RDB covers).
    pub(super) durable_offset: u64,
    /// Highest batch offset Valkey has reported.
    pub(super) executed_offset: u64,
    /// Offset at which the link attached to the current replication history. Writes are
    /// refused until then, so a batch offset below it comes from another history: a Valkey
    /// that restarted before the link noticed.
    pub(super) history_start: u64,
    /// The history epoch (module doc).
    pub(super) epoch: u64,
    /// The Valkey process (`run_id`) the link is attached to, or was last.
    pub(super) run_id: String,
    pub(super) dirty: DirtyKeys,
    /// Write batches waiting for `durable_offset` to reach their offset, and reads waiting
    /// for every write up to a generation to be durable.
    pub(super) held: HeldQueue,
    /// Why new writes are refused although the journal is attached: a disk watermark
    /// ([`crate::disk`]). The `-MISCONF` reply, ready to send.
    pub(super) blocked: Option<Refusal>,
    /// Likewise, the archive lagging past its bound (`archive.enforce_max_lag`).
    pub(super) archive_blocked: Option<Refusal>,
}

impl State {
    /// Whether a new write may be sent to Valkey now; `Err` is the refusal.
    pub(super) fn admit_write(&self) -> Result<(), Refusal> {
        match self.write_refusal() {
            None => Ok(()),
            Some(why) => Err(why.count()),
        }
    }

    /// What a write arriving now is refused with (`None`: it is admitted).
    pub(super) fn write_refusal(&self) -> Option<Refusal> {
        match (
            &self.status,
            self.blocked.as_ref().or(self.archive_blocked.as_ref()),
        ) {
            (LinkState::Attached, None) => None,
            (LinkState::Attached, Some(why)) => Some(why.clone()),
            (status, _) => Some(Refusal::of(status)),
        }
    }

    pub(super) fn unmark(&mut self, marks: Vec<WriteMark>) {
        let failed = matches!(self.status, LinkState::Failed(_));
        for mut m in marks {
            m.disarm();
            // After a journal failure those writes ran in Valkey but will never be journaled:
            // their keys stay dirty, so reading them fails instead of showing data a crash
            // would lose.
            if failed {
                continue;
            }
            if m.blocked {
                self.dirty.unmark_blocked(&m.scope);
            } else {
                self.dirty.unmark(m.generation, &m.scope);
            }
        }
    }

    /// Every held reply, write and read, with the writes' marks settled.
    pub(super) fn take_held(&mut self) -> Vec<Held> {
        let (batches, reads) = self.held.take_all();
        let mut out = Vec::new();
        for (replies, marks) in batches {
            self.unmark(marks);
            out.extend(replies);
        }
        out.extend(reads);
        out
    }

    /// Held reads waiting for generations from `generation` on.
    pub(super) fn take_reads_from(&mut self, generation: u64) -> Vec<Held> {
        self.held.reads_from(generation)
    }

    /// Reads whose writes are all durable now.
    pub(super) fn ready_reads(&mut self) -> Vec<Held> {
        let upto = self.dirty.settled_through();
        self.held.reads_through(upto)
    }
}
