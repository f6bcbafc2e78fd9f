//! Replay: iterate entries from an LSN or a replication offset.
//!
//! Uses the recovery scanner, so replay applies exactly the same validity rules as
//! recovery, and reassembles fragmented entries. Allocation per entry is fine here: replay
//! is not the hot path.

use bytes::{Bytes, BytesMut};

use super::error::JournalError;
use super::format::{Kind, REPL_ID_BYTES};
use super::recovery::{ScanStart, Scanner};
use super::ring::RingRead;

/// One entry read back from the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayEntry {
    pub lsn: u64,
    pub repl_id: [u8; REPL_ID_BYTES],
    /// Replication offset at the end of this entry; it starts at `repl_offset_end - payload.len()`.
    pub repl_offset_end: u64,
    pub payload: Bytes,
}

/// Where replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayFrom {
    /// Entries with LSN >= this.
    Lsn(u64),
    /// Entries whose replication offset range ends after this offset (the first one may
    /// start before it: slice its payload from `offset - (repl_offset_end - len)`).
    ReplOffset(u64),
}

/// Iterator over entries; stops at the end of the log or at `upto_lsn`.
pub struct EntryIter<R> {
    scanner: Scanner<R>,
    from: ReplayFrom,
    upto_lsn: u64,
    assembling: BytesMut,
    done: bool,
    /// Where a scan resumes after the last entry returned.
    resume: Option<ScanStart>,
}

impl<R: RingRead> EntryIter<R> {
    pub fn new(scanner: Scanner<R>, from: ReplayFrom, upto_lsn: u64) -> Self {
        EntryIter {
            scanner,
            from,
            upto_lsn,
            assembling: BytesMut::new(),
            done: false,
            resume: None,
        }
    }

    /// Where a new replay ([`crate::journal::Journal::replay_at`]) goes on after the last
    /// entry this one returned, without reading the log from its start again.
    pub fn resume_point(&self) -> Option<ScanStart> {
        self.resume
    }

    fn wanted(&self, lsn: u64, repl_offset_end: u64) -> bool {
        match self.from {
            ReplayFrom::Lsn(l) => lsn >= l,
            ReplayFrom::ReplOffset(o) => repl_offset_end > o,
        }
    }
}

impl<R: RingRead> Iterator for EntryIter<R> {
    type Item = Result<ReplayEntry, JournalError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            let rec = match self.scanner.next_record() {
                Ok(Some(r)) => r,
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(JournalError::io("reading journal segments", e)));
                }
            };
            let h = rec.header;
            if h.lsn > self.upto_lsn {
                self.done = true;
                return None;
            }
            let want = {
                let from = self.from;
                match from {
                    ReplayFrom::Lsn(l) => h.lsn >= l,
                    ReplayFrom::ReplOffset(o) => h.repl_offset_end > o,
                }
            };
            if !want {
                continue;
            }
            match h.kind {
                Kind::Full => {
                    let payload = Bytes::copy_from_slice(rec.payload);
                    self.resume = Some(ScanStart::after(&self.scanner.end()));
                    return Some(Ok(ReplayEntry {
                        lsn: h.lsn,
                        repl_id: h.repl_id,
                        repl_offset_end: h.repl_offset_end,
                        payload,
                    }));
                }
                Kind::First | Kind::Middle => {
                    if h.kind == Kind::First {
                        self.assembling.clear();
                    }
                    self.assembling.extend_from_slice(rec.payload);
                }
                Kind::Last => {
                    self.assembling.extend_from_slice(rec.payload);
                    let payload = self.assembling.split().freeze();
                    debug_assert!(self.wanted(h.lsn, h.repl_offset_end));
                    self.resume = Some(ScanStart::after(&self.scanner.end()));
                    return Some(Ok(ReplayEntry {
                        lsn: h.lsn,
                        repl_id: h.repl_id,
                        repl_offset_end: h.repl_offset_end,
                        payload,
                    }));
                }
            }
        }
        None
    }
}
