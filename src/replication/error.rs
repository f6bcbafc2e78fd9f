//! Why the replica link's attachment ended: the replication layer's one error type, shared
//! by the link and the stream framer (which refuses what the journal would refuse).

use crate::journal::JournalError;
use crate::restore::RestoreError;
use crate::upstream::client::UpstreamError;

/// Why an attachment ended.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{0}")]
    Upstream(#[from] UpstreamError),
    #[error("{0}")]
    Stream(#[from] crate::resp::ScanError),
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Store(#[from] crate::checkpoint::store::StoreError),
    #[error("{0}")]
    Restore(#[from] RestoreError),
    /// Decision (c): Valkey and walrus hold different data.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Raced(String),
}
