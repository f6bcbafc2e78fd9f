//! The journal: a pre-initialized, recycled ring of log segments.
//!
//! walrus journals Valkey's replication stream here and releases client replies only once
//! the entries covering them are durable. The design, in the order of the modules:
//!
//! - [`format`]: the record header (diagram there): magic, version, kind, length, epoch,
//!   segment sequence (lap tag), LSN, replication offset, durable hint, replication id, CRC64.
//! - [`manifest`]: the superblock (geometry, epoch, checkpoint), replaced atomically.
//! - [`ring`]: geometry of the ring (logical position -> file, offset) and segment files,
//!   zero-filled once and recycled forever.
//! - [`recovery`]: the scanner that finds the true end of the log and tells a torn tail
//!   from mid-log corruption.
//! - [`buf`]: aligned buffers and their pool; [`batcher`]: group commit into buffers.
//! - [`writer`]: the writer loop over an [`writer::IoBackend`]; [`io`]: the io_uring and
//!   sync backends and their selection.
//! - [`lock`]: a directory's one owner (the journal's, and the data directory's).
//! - [`compact`]: a backup's ring cut to its log, filled out again when it is served.
//! - [`open`]: opening (lock, init, recovery, repair, epoch bump); [`engine`]: the
//!   [`Journal`] handle; [`reader`]: replay; [`recent`]: the newest entries, in memory.
//!   `walrus journal ...` is in `crate::cli::journal`.
//!
//! See docs/journal.md for the full description and benchmark results.

pub mod batcher;
pub mod buf;
pub mod compact;
#[cfg(test)]
mod compact_tests;
pub mod config;
pub mod engine;
#[cfg(test)]
mod engine_tests;
pub mod error;
pub mod format;
pub mod io;
pub mod lock;
pub mod manifest;
pub mod open;
pub mod reader;
pub mod recent;
pub mod recovery;
pub mod ring;
pub mod sim;
pub mod writer;

pub use config::{DirectIo, IoBackendChoice, JournalConfig};
pub use engine::{Entry, Journal, JournalStatus, OpenOptions, Recovered, Ticket};
pub use error::{Corruption, JournalError};
pub use io::{BackendInfo, BackendKind};
pub use reader::{ReplayEntry, ReplayFrom};
pub use recovery::{LogEnd, ScanStart, Tail};
pub use writer::Durable;
