//! The segment ring: geometry (logical position -> file and offset) and segment files.
//!
//! Segments are created once, zero-filled for real (not fallocate, whose unwritten extents
//! still cost a metadata update on first write), fsynced, and then overwritten forever.
//! A segment is created as `seg-NNNNN.wal.tmp` and renamed when complete, so a file with the
//! final name is always fully initialized.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::JournalError;
use super::manifest::fsync_dir;

/// Geometry of the ring: maps the infinite logical log onto N files of S bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub segment_size_bytes: u64,
    pub segments: u32,
}

impl Geometry {
    /// Segment sequence (lap tag) of a logical position.
    pub fn seg_seq(&self, pos: u64) -> u64 {
        pos / self.segment_size_bytes
    }

    /// Segment file index of a logical position.
    pub fn seg_index(&self, pos: u64) -> u32 {
        (self.seg_seq(pos) % u64::from(self.segments)) as u32
    }

    /// Offset inside its segment file.
    pub fn seg_off(&self, pos: u64) -> u64 {
        pos % self.segment_size_bytes
    }

    /// Logical position where segment sequence `seq` starts.
    pub fn seq_start(&self, seq: u64) -> u64 {
        seq * self.segment_size_bytes
    }

    /// Logical end of the segment containing `pos`.
    pub fn seg_end(&self, pos: u64) -> u64 {
        self.seq_start(self.seg_seq(pos) + 1)
    }

    pub fn ring_bytes(&self) -> u64 {
        self.segment_size_bytes * u64::from(self.segments)
    }

    /// First logical position that must not be written while `head_pos` is retained.
    pub fn write_limit(&self, head_pos: u64) -> u64 {
        self.seq_start(self.seg_seq(head_pos) + u64::from(self.segments))
    }
}

pub fn segment_path(dir: &Path, index: u32) -> PathBuf {
    dir.join(format!("seg-{index:05}.wal"))
}

fn segment_tmp_path(dir: &Path, index: u32) -> PathBuf {
    dir.join(format!("seg-{index:05}.wal.tmp"))
}

/// Indices of segments that do not exist yet. A segment of the wrong size is an error.
pub fn missing_segments(dir: &Path, geo: Geometry) -> Result<Vec<u32>, JournalError> {
    let mut missing = Vec::new();
    for i in 0..geo.segments {
        let p = segment_path(dir, i);
        match fs::metadata(&p) {
            Ok(md) if md.len() == geo.segment_size_bytes => {}
            Ok(md) => {
                return Err(JournalError::Layout(format!(
                    "{} is {} bytes, expected segment_size_bytes = {}",
                    p.display(),
                    md.len(),
                    geo.segment_size_bytes
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(i),
            Err(e) => return Err(JournalError::io(format!("stat {}", p.display()), e)),
        }
    }
    Ok(missing)
}

/// The chunk segments are zero-filled in: large sequential writes run at device bandwidth.
const INIT_CHUNK_BYTES: usize = 1 << 20;

/// Creates and zero-fills the missing segments. `progress(done_bytes, total_bytes)` is
/// called after every chunk. Returns the number of segments created.
pub fn init_missing_segments(
    dir: &Path,
    geo: Geometry,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u32, JournalError> {
    init_segments(dir, geo, false, progress)
}

/// [`init_missing_segments`]; `sparse`: each made by its length only, not written (a
/// journal written once and then cut: [`super::compact`]).
pub(super) fn init_segments(
    dir: &Path,
    geo: Geometry,
    sparse: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u32, JournalError> {
    fs::create_dir_all(dir)
        .map_err(|e| JournalError::io(format!("creating {}", dir.display()), e))?;
    let missing = missing_segments(dir, geo)?;
    let total = missing.len() as u64 * geo.segment_size_bytes;
    let zeros = vec![0u8; INIT_CHUNK_BYTES];
    let mut done = 0u64;
    progress(0, total);
    for &i in &missing {
        let tmp = segment_tmp_path(dir, i);
        let ctx = |w: &str| format!("{w} {}", tmp.display());
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| JournalError::io(ctx("creating"), e))?;
        crate::fault::fail_point!("journal::init::created");
        let mut left = geo.segment_size_bytes;
        if sparse {
            f.set_len(left)
                .map_err(|e| JournalError::io(ctx("sizing"), e))?;
            done += left;
            left = 0;
        }
        while left > 0 {
            let n = left.min(INIT_CHUNK_BYTES as u64) as usize;
            f.write_all(&zeros[..n])
                .map_err(|e| JournalError::io(ctx("zero-filling"), e))?;
            crate::fault::fail_point!("journal::init::filled");
            left -= n as u64;
            done += n as u64;
            progress(done, total);
        }
        f.sync_all()
            .map_err(|e| JournalError::io(ctx("fsync of"), e))?;
        drop(f);
        crate::fault::fail_point!("journal::init::synced");
        fs::rename(&tmp, segment_path(dir, i)).map_err(|e| JournalError::io(ctx("renaming"), e))?;
        crate::fault::fail_point!("journal::init::renamed");
    }
    if !missing.is_empty() {
        fsync_dir(dir)?;
        crate::fault::fail_point!("journal::init::dir_synced");
    }
    Ok(missing.len() as u32)
}

/// Random-access reads of the ring, by segment index. Implemented over files for real use
/// and over memory for tests and the fuzzer.
pub trait RingRead {
    /// Fills `buf` from segment `index` at `offset`; the range is inside the segment.
    fn read_exact_at(&mut self, index: u32, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

/// Reads segment files with plain buffered preads.
pub struct FileRing {
    files: Vec<File>,
}

impl FileRing {
    pub fn open(dir: &Path, geo: Geometry) -> Result<FileRing, JournalError> {
        let files = (0..geo.segments)
            .map(|i| {
                let p = segment_path(dir, i);
                File::open(&p).map_err(|e| JournalError::io(format!("opening {}", p.display()), e))
            })
            .collect::<Result<_, _>>()?;
        Ok(FileRing { files })
    }
}

/// Lends a ring to a reader that takes one by value (the scanner), keeping it for later reads.
impl<R: RingRead + ?Sized> RingRead for &mut R {
    fn read_exact_at(&mut self, index: u32, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        (**self).read_exact_at(index, offset, buf)
    }
}

/// Past a file's end it reads zeros: a compact ring's files are cut after its log
/// ([`super::compact`]). A serving ring's files are checked whole before they are read
/// ([`missing_segments`]), so there it never happens.
impl RingRead for FileRing {
    fn read_exact_at(&mut self, index: u32, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let f = &self.files[index as usize];
        let mut done = 0;
        while done < buf.len() {
            match f.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf[done..].fill(0);
        Ok(())
    }
}

/// An in-memory ring (tests, fuzzing).
pub struct MemRing {
    pub segments: Vec<Vec<u8>>,
}

impl MemRing {
    pub fn new(geo: Geometry) -> MemRing {
        MemRing {
            segments: vec![vec![0u8; geo.segment_size_bytes as usize]; geo.segments as usize],
        }
    }

    /// Writes bytes at a logical position (must not cross a segment end).
    pub fn write_at(&mut self, geo: Geometry, pos: u64, bytes: &[u8]) {
        let off = geo.seg_off(pos) as usize;
        let seg = &mut self.segments[geo.seg_index(pos) as usize];
        seg[off..off + bytes.len()].copy_from_slice(bytes);
    }

    /// Zeroes logical range `[from, to)`, across segments.
    pub fn zero(&mut self, geo: Geometry, from: u64, to: u64) {
        let mut p = from;
        while p < to {
            let end = geo.seg_end(p).min(to);
            let off = geo.seg_off(p) as usize;
            self.segments[geo.seg_index(p) as usize][off..off + (end - p) as usize].fill(0);
            p = end;
        }
    }
}

impl RingRead for MemRing {
    fn read_exact_at(&mut self, index: u32, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let seg = self.segments.get(index as usize).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no such segment")
        })?;
        let start = offset as usize;
        let end = start + buf.len();
        if end > seg.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past segment end",
            ));
        }
        buf.copy_from_slice(&seg[start..end]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_maps_positions() {
        let g = Geometry {
            segment_size_bytes: 65536,
            segments: 3,
        };
        assert_eq!(g.seg_seq(65536 * 4 + 5), 4);
        assert_eq!(g.seg_index(65536 * 4 + 5), 1);
        assert_eq!(g.seg_off(65536 * 4 + 5), 5);
        assert_eq!(g.seg_end(65536 * 4 + 5), 65536 * 5);
        assert_eq!(g.write_limit(65536 * 4 + 5), 65536 * 7);
    }

    #[test]
    fn init_creates_zeroed_segments_once() {
        let dir = tempfile::tempdir().unwrap();
        let g = Geometry {
            segment_size_bytes: 65536,
            segments: 3,
        };
        let mut calls = 0;
        assert_eq!(
            init_missing_segments(dir.path(), g, &mut |_, _| calls += 1).unwrap(),
            3
        );
        assert!(calls > 3);
        assert_eq!(
            init_missing_segments(dir.path(), g, &mut |_, _| {}).unwrap(),
            0
        );
        fs::remove_file(segment_path(dir.path(), 1)).unwrap();
        assert_eq!(missing_segments(dir.path(), g).unwrap(), vec![1]);
        assert_eq!(
            init_missing_segments(dir.path(), g, &mut |_, _| {}).unwrap(),
            1
        );
        let data = fs::read(segment_path(dir.path(), 1)).unwrap();
        assert_eq!(data.len(), 65536);
        assert!(data.iter().all(|&b| b == 0));
        fs::write(segment_path(dir.path(), 2), b"short").unwrap();
        assert!(missing_segments(dir.path(), g)
            .unwrap_err()
            .to_string()
            .contains("expected segment_size_bytes"));
    }
}
