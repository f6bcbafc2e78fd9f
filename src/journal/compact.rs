//! Compact rings: a backup's journal as small as its log.
//!
//! A serving ring is preallocated (every segment zero-filled) so that appends never
//! allocate and never meet a full disk. A backup makes no append until it is served, and as
//! a ring of zeros a 324-byte dataset's backup would take a gigabyte. So a backup's journal
//! is written into sparse segments ([`super::OpenOptions::sparse`]), then cut
//! ([`super::open::cut`]): every segment file ends after the block that holds the log's
//! end (the files after it are empty), and the manifest records that end
//! ([`Manifest::compact_end_pos`]).
//!
//! What keeps it honest:
//! - Readers read a cut file's missing bytes as zeros, as a full ring holds them
//!   ([`super::ring::FileRing`]); a compact ring's file may be shorter than a segment,
//!   never longer, and none may be missing ([`check_files`]).
//! - A scan of a compact ring must end exactly at the recorded end ([`check_end`]): a file
//!   cut shorter (entries lost) is refused, naming both positions, not taken for a torn tail.
//! - The first open for writing proves that, then fills every file out to a whole segment
//!   ([`fill_out`], zero-filled as a new ring is), then clears the mark: the ring is as
//!   configured again. A start interrupted in between finds the mark and does it again.
//! - Only a journal that never released anything is cut: its log never left the ring's first
//!   lap, so every position it holds lies below the end, in its own segment file.

use std::fs::{File, OpenOptions};
use std::path::Path;

use super::error::JournalError;
use super::manifest::{fsync_dir, Manifest};
use super::ring::{segment_path, Geometry};

/// The files of a compact ring: every segment present, none longer than a segment.
pub(super) fn check_files(dir: &Path, geo: Geometry) -> Result<(), JournalError> {
    for i in 0..geo.segments {
        let path = segment_path(dir, i);
        let len = std::fs::metadata(&path)
            .map_err(|e| JournalError::io(format!("reading {}", path.display()), e))?
            .len();
        if len > geo.segment_size_bytes {
            return Err(JournalError::Layout(format!(
                "{} is {len} bytes, more than segment_size_bytes = {}",
                path.display(),
                geo.segment_size_bytes
            )));
        }
    }
    Ok(())
}

/// Refuses a compact ring whose log, as scanned, does not end where its manifest says.
pub(super) fn check_end(dir: &Path, m: &Manifest, end_pos: u64) -> Result<(), JournalError> {
    match m.compact_end_pos {
        Some(recorded) if recorded != end_pos => Err(JournalError::Layout(format!(
            "{}: the compact journal's log ends at position {end_pos}, but its MANIFEST says it \
             was cut at {recorded}: its segment files were cut short or changed since, and \
             entries would be lost",
            dir.display()
        ))),
        _ => Ok(()),
    }
}

/// Fills every segment file of a compact ring out to a whole segment: with zeros, as a new
/// ring is made, or, `sparse`, by its length only.
pub(super) fn fill_out(dir: &Path, geo: Geometry, sparse: bool) -> Result<(), JournalError> {
    let zeros = vec![0u8; 1 << 20];
    for i in 0..geo.segments {
        let path = segment_path(dir, i);
        let io = |e| JournalError::io(format!("filling out {}", path.display()), e);
        let f = OpenOptions::new().write(true).open(&path).map_err(io)?;
        let mut len = f.metadata().map_err(io)?.len();
        if len == geo.segment_size_bytes {
            continue;
        }
        if sparse {
            f.set_len(geo.segment_size_bytes).map_err(io)?;
        } else {
            while len < geo.segment_size_bytes {
                let n = (geo.segment_size_bytes - len).min(zeros.len() as u64);
                write_at(&f, &zeros[..n as usize], len).map_err(io)?;
                len += n;
            }
        }
        f.sync_all().map_err(io)?;
    }
    fsync_dir(dir)
}

fn write_at(f: &File, bytes: &[u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(f, bytes, at)
}
