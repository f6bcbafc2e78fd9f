//! The chain: the current checkpoint plus the journal entries after it, as the exact byte
//! stream a replica of that history would have received.
//!
//! The checkpoint's RDB holds history `replid` up to `offset`. From `from_lsn` on, the
//! journal holds that history's stream (and nothing else: a new history always starts with
//! a new checkpoint). Walking it:
//!
//! | entry | meaning | action |
//! |---|---|---|
//! | a known id, ends at or before the position | already in the RDB | skip |
//! | a known id, starts at or before the position, ends after it | continues the stream | take the bytes after the position |
//! | another id, starts exactly at the position | the history went on under a new id (`+CONTINUE <newid>` after Valkey was promoted by a restore) | take it; the id joins the chain |
//! | anything else | a hole or a foreign history | error naming the entry |
//!
//! Entries are CRC-checked by the journal's scanner as they are read; a damaged one stops
//! the walk with an error naming its LSN.

use crate::checkpoint::manifest::Checkpoint;
use crate::journal::reader::ReplayEntry;
use crate::journal::{Journal, JournalError, ReplayFrom};
use bytes::Bytes;

/// Bytes of the stream after the checkpoint, from one journal entry.
#[derive(Debug, Clone)]
pub struct Slice {
    pub lsn: u64,
    /// The history the entry belongs to (a backup journals the slice again under it).
    pub repl_id: [u8; crate::journal::format::REPL_ID_BYTES],
    pub bytes: Bytes,
    /// Replication offset after these bytes.
    pub end: u64,
    /// When the entry was journaled ([`ReplayEntry::time_ms`]): a copy keeps it.
    pub time_ms: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("journal entry {lsn} (history {replid}, offsets {start}..{end}) does not continue the stream at offset {expected}: the journal has a hole or holds another history")]
    Gap {
        lsn: u64,
        replid: String,
        start: u64,
        end: u64,
        expected: u64,
    },
    #[error("reading the journal: {0}")]
    Journal(#[from] JournalError),
}

/// Where the chain ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainEnd {
    /// Every replication id the chain went through, the checkpoint's first.
    pub ids: Vec<String>,
    /// Replication offset after the last byte.
    pub offset: u64,
    pub entries: u64,
    /// Stream bytes after the checkpoint.
    pub bytes: u64,
}

/// Walks the chain, handing each slice to `f` (blocking: it reads the journal's files).
/// Only entries durable when the walk starts are read.
pub fn walk(
    journal: &Journal,
    cp: &Checkpoint,
    f: impl FnMut(Slice) -> Result<(), ChainError>,
) -> Result<ChainEnd, ChainError> {
    walk_entries(journal.replay(ReplayFrom::Lsn(cp.from_lsn))?, cp, f)
}

/// [`walk`] over entries read some other way: `walrus verify` reads a journal that is not
/// open for writing ([`crate::journal::open::replay_dir`]). The entries must start at the
/// checkpoint's `from_lsn` or before it.
pub fn walk_entries(
    entries: impl Iterator<Item = Result<ReplayEntry, JournalError>>,
    cp: &Checkpoint,
    mut f: impl FnMut(Slice) -> Result<(), ChainError>,
) -> Result<ChainEnd, ChainError> {
    let mut end = ChainEnd {
        ids: vec![cp.replid.clone()],
        offset: cp.offset,
        entries: 0,
        bytes: 0,
    };
    for e in entries {
        let e = e?;
        if e.lsn < cp.from_lsn {
            continue;
        }
        let replid = String::from_utf8_lossy(&e.repl_id).into_owned();
        let start = e.repl_offset_end - e.payload.len() as u64;
        let known = end.ids.contains(&replid);
        if known && e.repl_offset_end <= end.offset {
            continue;
        }
        if !(start == end.offset || (known && start < end.offset)) {
            return Err(ChainError::Gap {
                lsn: e.lsn,
                replid,
                start,
                end: e.repl_offset_end,
                expected: end.offset,
            });
        }
        if !known {
            end.ids.push(replid);
        }
        let bytes = e.payload.slice((end.offset - start) as usize..);
        end.offset = e.repl_offset_end;
        end.entries += 1;
        end.bytes += bytes.len() as u64;
        f(Slice {
            lsn: e.lsn,
            repl_id: e.repl_id,
            bytes,
            end: e.repl_offset_end,
            time_ms: e.time_ms,
        })?;
    }
    Ok(end)
}
