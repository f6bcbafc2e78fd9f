//! Where a scan starts, what it accepts, and where the log it reads ends.

use super::super::error::JournalError;
use super::super::format::{RecordKey, REPL_ID_BYTES};
use super::super::manifest::{Checkpoint, Manifest};

/// Where a scan starts: a record boundary with the LSN expected there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanStart {
    pub pos: u64,
    pub lsn: u64,
    /// Replication position at the end of the entry before `lsn`.
    pub repl_id: [u8; REPL_ID_BYTES],
    pub repl_offset: u64,
    /// Epoch of the entry before `lsn`: the log's epochs never decrease, so nothing older
    /// continues it (a checkpoint at the very end of the log reads no record first).
    pub epoch: u32,
}

#[derive(Debug, Clone, Copy)]
pub struct ScanLimits {
    /// Records from a newer epoch than the manifest's cannot exist; treat them as junk.
    pub max_epoch: u32,
    pub lookahead_bytes: u64,
    /// The journal's secret: only records whose checksum includes it are records.
    pub key: RecordKey,
    /// Records of epochs below this are unkeyed (format 1), those from it on keyed: 0 for a
    /// journal made keyed, the upgrade's epoch for one made before keys, `u32::MAX` before.
    pub keyed_from_epoch: u32,
    /// Format 1 records lie only below this position (0: none; `u64::MAX` before the
    /// upgrade): a client's value may hold one, well formed without the key.
    pub unkeyed_below_pos: u64,
    /// Where the newest run (of epoch `max_epoch`) began writing, if known: past it, only
    /// that run's records are evidence (older ones were cut by its open).
    pub resumed_at_pos: Option<u64>,
}

impl ScanLimits {
    /// How recovery reads `m`'s records: its key, epochs, and how far it looks past a bad
    /// record (`JournalConfig::lookahead_bytes`).
    pub fn of(m: &Manifest, lookahead_bytes: u64) -> ScanLimits {
        let (key, keyed_from_epoch, unkeyed_below_pos) = m.record_keys();
        ScanLimits {
            max_epoch: m.epoch,
            lookahead_bytes,
            key,
            keyed_from_epoch,
            unkeyed_below_pos,
            resumed_at_pos: m.resumed_at_pos,
        }
    }
}

impl ScanStart {
    /// The start of a journal that never released anything: the ring's first byte, LSN 1.
    pub const ORIGIN: ScanStart = ScanStart {
        pos: 0,
        lsn: 1,
        repl_id: [0; REPL_ID_BYTES],
        repl_offset: 0,
        epoch: 0,
    };

    /// Where a scan resumes after the entry that ends the log at `end`.
    pub fn after(end: &LogEnd) -> ScanStart {
        ScanStart {
            pos: end.end_pos,
            lsn: end.next_lsn,
            repl_id: end.last_repl_id,
            repl_offset: end.last_repl_offset,
            epoch: end.last_epoch,
        }
    }

    /// Where recovery starts: the checkpoint's first retained record and what came before.
    pub fn at(cp: &Checkpoint) -> Result<ScanStart, JournalError> {
        Ok(ScanStart {
            pos: cp.start_pos,
            lsn: cp.start_lsn,
            repl_id: cp.prev_repl_id()?,
            repl_offset: cp.prev_repl_offset,
            epoch: cp.prev_epoch,
        })
    }
}

/// End of the recovered log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEnd {
    /// Logical position just after the last record of the last complete entry.
    pub end_pos: u64,
    /// LSN the next appended entry gets.
    pub next_lsn: u64,
    pub last_repl_id: [u8; REPL_ID_BYTES],
    pub last_repl_offset: u64,
    pub last_epoch: u32,
}

impl LogEnd {
    pub fn last_lsn(&self) -> u64 {
        self.next_lsn - 1
    }
}

/// First entry starting in a segment: a place where a checkpoint can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryStart {
    pub pos: u64,
    pub lsn: u64,
    pub prev_repl_id: [u8; REPL_ID_BYTES],
    pub prev_repl_offset: u64,
    /// Epoch of the entry before `lsn`.
    pub prev_epoch: u32,
}
