//! Reading the journal for the archive: entries after a point, taken as a restore takes
//! them (the chain's rule, [`crate::datadir::chain`]), resumed where the last read stopped.

use super::object::ArchivedEntry;
use crate::journal::{Journal, JournalError, ReplayFrom, ScanStart};

pub(super) type ReplId = [u8; crate::journal::format::REPL_ID_BYTES];

/// What to read from the journal.
pub(super) struct Read {
    /// Where the replay resumes (before `next_lsn`); `None`: from the ring's start.
    pub(super) from: Option<ScanStart>,
    pub(super) next_lsn: u64,
    pub(super) upto_lsn: u64,
    /// The stream offset the archive holds through: entries up to it are skipped, one across
    /// it is cut there.
    pub(super) pos: u64,
    pub(super) ids: Vec<ReplId>,
    pub(super) max_bytes: u64,
}

/// Entries read, all of one replication id, and where the next read goes on.
#[derive(Debug, Default)]
pub(super) struct Batch {
    pub(super) entries: Vec<ArchivedEntry>,
    pub(super) replid: Option<ReplId>,
    pub(super) ids: Vec<ReplId>,
    pub(super) next_lsn: u64,
    pub(super) cursor: Option<ScanStart>,
    /// Where the replay resumes before the first entry read.
    pub(super) start_cursor: Option<ScanStart>,
    /// An entry of another history, not continuing the stream, came next.
    pub(super) broke: bool,
    /// The journal no longer holds `next_lsn`.
    pub(super) released: bool,
}

/// Reads entries after `r.next_lsn` as a restore would take them: each continues the
/// stream at `r.pos` (the chain's rule, [`crate::datadir::chain`]), those already held are
/// skipped. Stops before another replication id (an object holds one), past `max_bytes`,
/// at `upto_lsn`, and at an entry that does not continue the stream. Blocking.
pub(super) fn read_batch(journal: &Journal, r: Read) -> Result<Batch, JournalError> {
    let mut b = Batch {
        ids: r.ids,
        next_lsn: r.next_lsn,
        cursor: r.from,
        ..Batch::default()
    };
    let mut iter = match r.from {
        Some(at) => match journal.replay_at(at) {
            Ok(i) => i,
            Err(JournalError::InvalidArgument(_)) => {
                b.released = true;
                return Ok(b);
            }
            Err(e) => return Err(e),
        },
        None => journal.replay(ReplayFrom::Lsn(r.next_lsn))?,
    };
    let (mut pos, mut bytes) = (r.pos, 0u64);
    while let Some(e) = iter.next() {
        let e = e?;
        if e.lsn > r.upto_lsn {
            break;
        }
        if e.lsn != b.next_lsn {
            b.released = true;
            break;
        }
        let start = e.repl_offset_end - e.payload.len() as u64;
        let known = b.ids.contains(&e.repl_id);
        if known && e.repl_offset_end <= pos {
            b.next_lsn += 1;
            b.cursor = iter.resume_point();
            continue;
        }
        if !(start == pos || (known && start < pos)) {
            b.broke = true;
            break;
        }
        if b.replid.is_some_and(|id| id != e.repl_id) {
            break;
        }
        let len = e.repl_offset_end - pos;
        if !b.entries.is_empty() && bytes + len > r.max_bytes {
            break;
        }
        if b.entries.is_empty() {
            b.start_cursor = b.cursor;
        }
        if !known {
            b.ids.push(e.repl_id);
        }
        b.replid = Some(e.repl_id);
        b.entries.push(ArchivedEntry {
            lsn: e.lsn,
            end: e.repl_offset_end,
            payload: e.payload.slice((pos - start) as usize..),
            time_ms: e.time_ms,
        });
        bytes += len;
        pos = e.repl_offset_end;
        b.next_lsn += 1;
        b.cursor = iter.resume_point();
    }
    Ok(b)
}
