//! Recovery: find the true end of the log, and tell a torn tail from mid-log corruption.
//!
//! Scanning starts at the checkpoint (a record start with a known LSN) and walks records.
//! After a record ending at `end`, the next record is at `end` (same write) or at
//! `align_up(end)` (a new write; this may be the next segment's start). A candidate is
//! accepted only when all of these hold:
//! - magic, version, kind and reserved bytes are right, the record fits in its segment;
//! - the CRC over the journal's key, header and payload matches (a record a client planted
//!   inside a value never has the key); unkeyed format 1 records only from the epochs before
//!   a journal made before keys was upgraded;
//! - `seg_seq` equals the position's segment sequence (a previous lap's record is stale);
//! - `epoch` is not older than the previous record's (leftovers of a crashed run) and not
//!   newer than the manifest's;
//! - the kind and LSN continue the sequence: FULL/FIRST with LSN exactly previous + 1,
//!   MIDDLE/LAST of the entry in progress, with its FIRST's epoch, replication id and
//!   offset (fragments of two runs never splice into one entry).
//!
//! The first rejected position is the end. Then a look-ahead searches the following bytes
//! (a write may continue inside the previous write's last block, so records start
//! anywhere) for a valid record of the current lap whose
//! `durable_hint` is at least the expected LSN: such a record was encoded after the missing
//! entry had been acknowledged durable, so the gap is corruption, not a torn tail. Without
//! such proof the tail is cut silently: writes after a torn one may have completed, but none
//! of them was reported durable (durability is the contiguous prefix of completed writes).
//!
//! The files, in the order a scan uses them: [`start`] (where a scan starts, what it
//! accepts, where the log ends), [`candidate`] (the record that lies at a position, read
//! through a window, before its place in the sequence is known), [`scanner`] (the walk that
//! accepts records in sequence), [`tail`] (the look-ahead that tells a torn tail from
//! corruption) and [`report`] (what the scan found).

pub mod candidate;
pub mod report;
pub mod scanner;
pub mod start;
pub mod tail;

pub use report::{ScanReport, SegStat, Tail};
pub use scanner::{scan, Record, Scanner};
pub use start::{EntryStart, LogEnd, ScanLimits, ScanStart};
pub use tail::key_seals_the_ring;
