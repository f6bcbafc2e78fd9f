//! What a scan found: the segments it read, the entries and records it accepted, and how
//! the log ended.

use super::super::error::Corruption;
use super::super::ring::Geometry;
use super::start::{EntryStart, LogEnd, ScanStart};

/// What the scan saw in one segment of the live log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegStat {
    pub seg_seq: u64,
    pub records: u64,
    pub first_lsn: u64,
    pub last_lsn: u64,
    pub first_repl_offset_end: u64,
    pub last_repl_offset_end: u64,
    /// Offset just past the last accepted record in this segment.
    pub used_bytes: u64,
    pub first_entry_start: Option<EntryStart>,
}

/// How the log ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// Normal end (never written, stale lap, or torn tail). `reason` says what was found.
    End { pos: u64, reason: String },
    /// Mid-log corruption: valid, acknowledged-after entries follow a bad record.
    Corrupt(Corruption),
}

#[derive(Debug, Clone)]
pub struct ScanReport {
    pub start: ScanStart,
    pub end: LogEnd,
    pub entries: u64,
    pub records: u64,
    pub segments: Vec<SegStat>,
    pub tail: Tail,
    /// True when the last entry was cut because it ended inside a fragmented entry.
    pub dropped_partial_entry: bool,
}

impl ScanReport {
    /// Mid-log corruption, as `walrus journal verify` and `walrus verify` report it: what
    /// is wrong, what is lost, and the command that cuts the log there. `None`: the log is
    /// clean (a torn tail is a normal end). `dir` is the journal's directory.
    pub fn corruption(&self, dir: &std::path::Path) -> Option<String> {
        let Tail::Corrupt(c) = &self.tail else {
            return None;
        };
        Some(format!(
            "CORRUPT: {c}; entries after LSN {} are unreachable; \
             `walrus journal repair --dir {} --accept-data-loss` cuts the log there",
            self.end.last_lsn(),
            dir.display()
        ))
    }

    /// What cutting the log at its end overwrites (`journal repair`): from the end to the
    /// end of the ring. What an older run wrote past a cut is valid, of the current lap,
    /// with durable hints beyond the cut: left in place, any later open whose look-ahead
    /// reaches it would take it as evidence of corruption.
    pub fn repair_range(&self, geo: Geometry) -> (u64, u64) {
        (self.end.end_pos, geo.write_limit(self.start.pos))
    }
}
