//! Where the replication history the link follows began in the journal: what a checkpoint
//! needs when nothing of that history is journaled yet.
//!
//! A checkpoint covers the journal through its last durable entry when its RDB comes from
//! that entry's history, at a later offset ([`super`]). Each attachment of the link begins
//! a history at the journal's durable end, with every entry before it in Valkey: a restore
//! loaded them, a partial resync continued after them, a full resync's RDB was recorded as
//! the checkpoint. So an RDB of the attached history covers those entries too, before the
//! link journaled anything of it. That matters when the ring is full to its last byte
//! (checkpoints failed until it filled, then a restore began a new history): no entry of
//! the new history fits, not even a PING, and without this rule no checkpoint could ever
//! free the ring (docs/failure-modes.md, row 19; `tests/it/ring_full_restore.rs`).

use std::sync::Mutex;

/// The history the link attached to, and where it began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryStart {
    /// The durability gate's history epoch of the attachment: a later attachment, or a
    /// restore, has another.
    pub epoch: u64,
    pub replid: String,
    /// The offset the stream continued after: the journal's durable end at the attachment.
    pub offset: u64,
    /// The first LSN the attachment journals: every entry before it is in Valkey.
    pub first_lsn: u64,
}

/// The last attachment's [`HistoryStart`], written by the link, read by the checkpointer.
#[derive(Default)]
pub struct Attached(Mutex<Option<HistoryStart>>);

impl Attached {
    pub fn began(&self, start: HistoryStart) {
        *self.0.lock().expect("attached history mutex poisoned") = Some(start);
    }

    /// The attached history's id, if it began right after the durable entry `lsn` (ending
    /// at `repl_offset`) in `epoch`: an RDB of it, at `repl_offset` or later, covers `lsn`.
    pub fn follows(&self, epoch: u64, lsn: u64, repl_offset: u64) -> Option<String> {
        let start = self.0.lock().expect("attached history mutex poisoned");
        start
            .as_ref()
            .filter(|s| s.epoch == epoch && s.first_lsn == lsn + 1 && s.offset == repl_offset)
            .map(|s| s.replid.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_history_that_began_right_after_the_entry_in_the_same_epoch_follows_it() {
        let a = Attached::default();
        assert_eq!(a.follows(3, 10, 500), None);
        a.began(HistoryStart {
            epoch: 3,
            replid: "r".repeat(40),
            offset: 500,
            first_lsn: 11,
        });
        assert_eq!(a.follows(3, 10, 500), Some("r".repeat(40)));
        // Another epoch, entries of the history journaled since, another offset.
        assert_eq!(a.follows(4, 10, 500), None);
        assert_eq!(a.follows(3, 11, 540), None);
        assert_eq!(a.follows(3, 10, 499), None);
    }
}
