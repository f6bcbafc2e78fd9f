//! Errors of the journal engine.

use std::path::PathBuf;
use std::sync::Arc;

/// Where recovery found mid-log corruption, and the proof that it is not a torn tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// Logical position just past the last valid record: the damage starts at or after it
    /// (at this position, or at the next block boundary where the next write began).
    pub pos: u64,
    /// Segment file index and offset of that position.
    pub segment_index: u32,
    pub segment_offset: u64,
    /// LSN that was expected there.
    pub expected_lsn: u64,
    /// Why the record there was rejected.
    pub reason: String,
    /// A later valid record whose durable hint covers `expected_lsn`.
    pub evidence_pos: u64,
    pub evidence_lsn: u64,
    pub evidence_durable_hint: u64,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "mid-log corruption after log position {} (segment file {}, offset {}): expected LSN {} but {}; \
             a valid record at position {} (LSN {}) says entries up to LSN {} were durable",
            self.pos,
            self.segment_index,
            self.segment_offset,
            self.expected_lsn,
            self.reason,
            self.evidence_pos,
            self.evidence_lsn,
            self.evidence_durable_hint
        )
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: Arc<std::io::Error>,
    },
    #[error("invalid journal configuration: {0}")]
    Config(String),
    #[error("journal manifest: {0}")]
    Manifest(String),
    #[error("journal layout: {0}")]
    Layout(String),
    #[error(
        "{0}. Refusing to start: run `walrus journal verify --dir DIR` for details, or \
         `walrus journal repair --dir DIR --accept-data-loss` to cut the log there"
    )]
    Corrupt(Corruption),
    #[error("journal ring full: the write needs segment sequence {needed_seg_seq} but segment sequence {head_seg_seq} and later are retained until a checkpoint releases them")]
    RingFull {
        needed_seg_seq: u64,
        head_seg_seq: u64,
    },
    #[error("entry of {len_bytes} bytes exceeds journal.max_entry_bytes = {max_entry_bytes}")]
    EntryTooLarge {
        len_bytes: u64,
        max_entry_bytes: u64,
    },
    #[error("all journal write buffers are queued; retry after in-flight writes complete")]
    Busy,
    #[error("journal failed permanently after an I/O error: {0}")]
    Failed(Arc<str>),
    #[error("journal is closed")]
    Closed,
    /// A directory's lock is held by another owner ([`super::lock`]): trying again succeeds
    /// once it lets go.
    #[error("{} is in use by {holder}", dir.display())]
    InUse { dir: PathBuf, holder: String },
    #[error("{0}")]
    InvalidArgument(String),
    /// A sealed text's CRC line is missing or does not match ([`super::manifest::unseal`]:
    /// the journal's, a checkpoint's or the archive's manifest); the caller names the file.
    #[error("{0}")]
    Seal(String),
}

impl JournalError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> JournalError {
        JournalError::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }
}
