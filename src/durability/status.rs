//! Whether the gate admits writes, and [`Refusal`]: the durability layer's one error type,
//! what every refused request and every failed held reply gets.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

/// The replica link's state, as the gate sees it: whether writes are accepted now, and if
/// not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// The replica link is not (yet, or no longer) following Valkey's stream.
    Detached,
    Attached,
    /// walrus is loading Valkey from its checkpoint and journal.
    Restoring,
    /// The journal failed: permanent.
    Failed(String),
}

/// Why the gate refused a request or failed a reply it held. The client sees it as an error
/// reply ([`Refusal::reply`]): Valkey's own text where Valkey has one (`-LOADING`,
/// `-MISCONF` for a write it cannot make safe), `-ERR walrus: ...` otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("MISCONF walrus: the journal is not attached to Valkey's replication stream; writes are refused until it is")]
    Detached,
    /// Valkey is being loaded, or a reply came from a Valkey the journal does not describe.
    #[error("LOADING Valkey is loading the dataset in memory")]
    Loading,
    #[error("MISCONF walrus: journal failed, writes are refused: {0}")]
    JournalFailed(Arc<str>),
    /// A disk watermark; the text names the disk and the mark.
    #[error("MISCONF walrus: {0}")]
    DiskWatermark(Arc<str>),
    /// The archive lags past `archive.max_lag_ms`; the text says how far and why.
    #[error("MISCONF walrus: {0}")]
    ArchiveLag(Arc<str>),
    #[error("MISCONF walrus: no room for writes within {} ms (durability.max_hold_ms): the journal is too far behind Valkey", .0.as_millis())]
    NoRoom(Duration),
    #[error("ERR walrus: this write is {len_bytes} bytes, more than the journal takes in one entry ({max_bytes} bytes, journal.max_entry_bytes): it is refused before it reaches Valkey")]
    TooLarge { len_bytes: usize, max_bytes: usize },
    #[error("ERR walrus: this write was not journaled within {} ms (durability.max_hold_ms); it may or may not have taken effect", .0.as_millis())]
    WriteExpired(Duration),
    #[error("ERR walrus: a write this read depends on was not journaled within {} ms (durability.max_hold_ms); retry", .0.as_millis())]
    ReadExpired(Duration),
    #[error(
        "ERR walrus: a write this read depends on was lost with its connection to Valkey; retry"
    )]
    LostWrite,
    #[error("ERR walrus: Valkey's replication history changed before this write was journaled; it may be lost")]
    HistoryChanged,
    /// A notice ([`super::notices`]) that will never be released; the text says why. Its
    /// client is closed after it.
    #[error("ERR walrus: a keyspace notification or tracking invalidation for this connection {0}; the connection is closed, so that no subscriber or client-side cache goes on without it")]
    NoticeWithheld(Arc<str>),
}

impl Refusal {
    /// The refusal of a write while the gate is in `status` (not `Attached`).
    pub(super) fn of(status: &LinkState) -> Refusal {
        match status {
            LinkState::Detached => Refusal::Detached,
            LinkState::Restoring => Refusal::Loading,
            LinkState::Failed(why) => Refusal::JournalFailed(one_line(why)),
            LinkState::Attached => unreachable!("attached writes are not refused"),
        }
    }

    /// A disk watermark's refusal.
    pub(super) fn disk(why: &str) -> Refusal {
        Refusal::DiskWatermark(one_line(why))
    }

    /// The archive's refusal.
    pub(super) fn archive(why: &str) -> Refusal {
        Refusal::ArchiveLag(one_line(why))
    }

    /// The error reply the client gets.
    pub fn reply(&self) -> Bytes {
        crate::resp::write::error(&self.to_string())
    }

    /// Counts a refused write in `walrus_writes_refused_total` (replies failed after they
    /// were admitted are not refusals).
    pub fn count(self) -> Self {
        use crate::metrics::RefusalReason as M;
        let reason = match &self {
            Refusal::Detached => M::Detached,
            Refusal::Loading => M::Restoring,
            Refusal::JournalFailed(_) => M::JournalFailed,
            Refusal::DiskWatermark(_) => M::DiskWatermark,
            Refusal::ArchiveLag(_) => M::ArchiveLag,
            Refusal::NoRoom(_) => M::NoRoom,
            Refusal::TooLarge { .. } => M::TooLarge,
            _ => return self,
        };
        reason.count();
        self
    }
}

/// An error reply is one line: the texts name paths and I/O errors, which may hold anything.
fn one_line(why: &str) -> Arc<str> {
    why.replace(['\r', '\n'], " ").into()
}
