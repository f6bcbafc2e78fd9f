//! Whether the gate admits writes, and the error every refused or failed reply gets.

use bytes::Bytes;

/// Why writes are not accepted right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// The replica link is not (yet, or no longer) following Valkey's stream.
    Detached,
    Attached,
    /// walrus is loading Valkey from its checkpoint and journal.
    Restoring,
    /// The journal failed: permanent.
    Failed(String),
}

/// Valkey's own reply while it loads a dataset.
pub fn loading() -> Bytes {
    crate::resp::write::error("LOADING Valkey is loading the dataset in memory")
}

/// What a read held behind a write whose outcome can never be known gets.
pub(super) fn lost_write() -> Bytes {
    crate::resp::write::error(
        "ERR walrus: a write this read depends on was lost with its connection to Valkey; retry",
    )
}

pub(super) fn history_changed() -> Bytes {
    crate::resp::write::error(
        "ERR walrus: Valkey's replication history changed before this write was journaled; it may be lost",
    )
}

/// The error a refused write gets.
pub(super) fn refusal(status: &Status) -> Bytes {
    crate::resp::write::error(&match status {
        Status::Detached => {
            "MISCONF walrus: the journal is not attached to Valkey's replication stream; writes are refused until it is"
                .to_string()
        }
        Status::Failed(why) => format!("MISCONF walrus: journal failed, writes are refused: {}", why.replace(['\r', '\n'], " ")),
        Status::Restoring => return loading(),
        Status::Attached => unreachable!("attached writes are not refused"),
    })
}
