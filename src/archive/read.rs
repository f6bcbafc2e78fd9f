//! Reading the journal for the archive: entries after a point, taken as a restore takes
//! them (the chain's rule, [`crate::datadir::chain`]), resumed where the last read stopped.

use std::collections::VecDeque;

use super::object::ArchivedEntry;
use crate::journal::reader::EntryIter;
use crate::journal::ring::FileRing;
use crate::journal::{Journal, JournalError, ReplayEntry, ReplayFrom, ScanStart};

/// Entries taken from the journal's memory at a time (each lock of its appenders' mutex).
const MEMORY_CHUNK: usize = 256;

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
    let mut iter = Entries {
        journal,
        next_lsn: r.next_lsn,
        memory: VecDeque::new(),
        ring: None,
        resume: r.from,
    };
    if !iter.take_from_memory() {
        match iter.open_ring() {
            Ok(()) => {}
            Err(JournalError::InvalidArgument(_)) => {
                b.released = true;
                return Ok(b);
            }
            Err(e) => return Err(e),
        }
    }
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

/// The journal's entries from `next_lsn` on: from its memory of the newest ones while it
/// holds them (no read of the disk the journal writes to), else from the ring, where the
/// last entry taken ends. Both give the same entries and resume points.
struct Entries<'a> {
    journal: &'a Journal,
    next_lsn: u64,
    memory: VecDeque<(ReplayEntry, ScanStart)>,
    ring: Option<EntryIter<FileRing>>,
    /// Where a replay of the ring resumes after the last entry taken.
    resume: Option<ScanStart>,
}

impl Entries<'_> {
    /// Takes the next entries from memory; false when it does not hold them.
    fn take_from_memory(&mut self) -> bool {
        match self.journal.recent_from(self.next_lsn, MEMORY_CHUNK) {
            Some(v) => {
                self.memory.extend(v);
                true
            }
            None => false,
        }
    }

    fn open_ring(&mut self) -> Result<(), JournalError> {
        self.ring = Some(match self.resume {
            Some(at) => self.journal.replay_at(at)?,
            None => self.journal.replay(ReplayFrom::Lsn(self.next_lsn))?,
        });
        Ok(())
    }

    fn next(&mut self) -> Option<Result<ReplayEntry, JournalError>> {
        if self.ring.is_none() && self.memory.is_empty() && !self.take_from_memory() {
            // Memory dropped the next entry for room since: the ring still holds it (the
            // caller's pin keeps it from being released).
            if let Err(e) = self.open_ring() {
                return Some(Err(e));
            }
        }
        let (e, resume) = match self.ring.as_mut() {
            Some(ring) => match ring.next()? {
                Ok(e) => (e, ring.resume_point()),
                Err(e) => return Some(Err(e)),
            },
            None => {
                let (e, resume) = self.memory.pop_front()?;
                (e, Some(resume))
            }
        };
        self.next_lsn = e.lsn + 1;
        self.resume = resume;
        Some(Ok(e))
    }

    fn resume_point(&self) -> Option<ScanStart> {
        self.resume
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::recent::ENTRY_OVERHEAD_BYTES;
    use crate::journal::{Entry, JournalConfig};

    async fn append(j: &Journal, lsns: std::ops::RangeInclusive<u64>) {
        let mut last = None;
        for lsn in lsns {
            let entry = Entry {
                repl_id: [b'a'; 40],
                repl_offset_end: lsn * 100,
                payload: bytes::Bytes::from(vec![lsn as u8; 100]),
            };
            last = Some(j.append(entry).await.unwrap());
        }
        last.unwrap().wait().await.unwrap();
    }

    /// Memory drops the next entry for room between two of its chunks (the journal goes on
    /// appending meanwhile): the read goes on from the ring where the last entry taken ends.
    #[tokio::test]
    async fn a_read_goes_on_from_the_ring_where_memory_no_longer_holds_the_next_entry() {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) =
            Journal::open(dir.path(), &JournalConfig::small_for_tests(64 * 1024, 8)).unwrap();
        j.keep_recent(300 * (100 + ENTRY_OVERHEAD_BYTES as u64));
        append(&j, 1..=400).await;
        let mut entries = Entries {
            journal: &j,
            next_lsn: 101,
            memory: VecDeque::new(),
            ring: None,
            resume: None,
        };
        assert!(entries.take_from_memory());
        let mut lsns = Vec::new();
        for _ in 0..MEMORY_CHUNK {
            lsns.push(entries.next().unwrap().unwrap().lsn);
        }
        assert!(entries.ring.is_none(), "the first chunk came from memory");
        // Where the ring goes on after it, as a replay of the ring says.
        let mut ring = j.replay(ReplayFrom::Lsn(356)).unwrap();
        ring.next().unwrap().unwrap();
        assert_eq!(entries.resume_point(), ring.resume_point());
        append(&j, 401..=700).await;
        assert!(j.recent_from(entries.next_lsn, 1).is_none());
        while let Some(e) = entries.next() {
            lsns.push(e.unwrap().lsn);
        }
        assert!(entries.ring.is_some(), "the rest came from the ring");
        assert_eq!(lsns, (101..=700).collect::<Vec<_>>());
        assert_eq!(entries.resume_point().unwrap().lsn, 701);
    }
}
