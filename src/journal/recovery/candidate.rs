//! Candidates: the record that lies at a position of the ring, if any, before its place in
//! the sequence is known. Read through a window of one segment, so that small records do
//! not each cost a syscall; the scan asks here what is at each position it tries, and the
//! look-ahead where the next record magic is.

use std::fmt;

use super::super::format::{
    record_crc, record_fits_at, stored_crc, HeaderError, Kind, RecordHeader, HEADER_BYTES, MAGIC,
    UNKEYED_FORMAT_VERSION,
};
use super::super::ring::{Geometry, RingRead};
use super::start::ScanLimits;

/// Size of the read-ahead window: large sequential reads.
const WINDOW_BYTES: usize = 1 << 20;

/// Caches a window of one segment so that small records do not each cost a syscall.
struct Window<R> {
    ring: R,
    geo: Geometry,
    buf: Vec<u8>,
    /// Logical position of buf[0]; u64::MAX when empty.
    start: u64,
    len: usize,
}

impl<R: RingRead> Window<R> {
    fn new(ring: R, geo: Geometry) -> Self {
        Window {
            ring,
            geo,
            buf: Vec::new(),
            start: u64::MAX,
            len: 0,
        }
    }

    /// Bytes `[pos, pos+len)`; the range must lie within one segment.
    fn get(&mut self, pos: u64, len: usize) -> std::io::Result<&[u8]> {
        let seg_end = self.geo.seg_end(pos);
        assert!(
            pos + len as u64 <= seg_end,
            "window read crosses a segment end"
        );
        let cached = self.start != u64::MAX
            && pos >= self.start
            && pos + len as u64 <= self.start + self.len as u64;
        if !cached {
            let want = (len.max(WINDOW_BYTES) as u64).min(seg_end - pos) as usize;
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            self.ring.read_exact_at(
                self.geo.seg_index(pos),
                self.geo.seg_off(pos),
                &mut self.buf[..want],
            )?;
            self.start = pos;
            self.len = want;
        }
        let o = (pos - self.start) as usize;
        Ok(&self.buf[o..o + len])
    }
}

/// Why a candidate position does not hold the next record.
#[derive(Debug)]
pub(super) enum Reject {
    NoRoom,
    Header(HeaderError),
    Length(u32),
    Crc,
    Format(u8),
    StaleLap {
        found: u64,
        expected: u64,
    },
    Epoch {
        found: u32,
        min: u32,
        max: u32,
    },
    Sequence {
        kind: Kind,
        lsn: u64,
        expected: String,
    },
    BeyondRing,
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reject::NoRoom => f.write_str("no room for a record before the segment end"),
            Reject::Header(e) => write!(f, "no record header ({e:?})"),
            Reject::Length(n) => write!(f, "payload length {n} runs past the segment end"),
            Reject::Crc => f.write_str("CRC mismatch"),
            Reject::Format(v) => {
                write!(
                    f,
                    "format {v} record where the journal writes another format"
                )
            }
            Reject::StaleLap { found, expected } => write!(
                f,
                "stale record from an earlier lap (seg_seq {found}, expected {expected})"
            ),
            Reject::Epoch { found, min, max } => {
                write!(f, "record epoch {found} outside [{min}, {max}]")
            }
            Reject::Sequence {
                kind,
                lsn,
                expected,
            } => write!(f, "{kind:?} record with LSN {lsn}, expected {expected}"),
            Reject::BeyondRing => f.write_str("the ring is full up to here"),
        }
    }
}

/// The ring read as candidate records, under a scan's limits (key, formats).
pub(super) struct Candidates<R> {
    win: Window<R>,
    pub(super) geo: Geometry,
    pub(super) limits: ScanLimits,
}

impl<R: RingRead> Candidates<R> {
    pub(super) fn new(ring: R, geo: Geometry, limits: ScanLimits) -> Self {
        Candidates {
            win: Window::new(ring, geo),
            geo,
            limits,
        }
    }

    /// Bytes `[pos, pos+len)`; the range must lie within one segment.
    pub(super) fn bytes(&mut self, pos: u64, len: usize) -> std::io::Result<&[u8]> {
        self.win.get(pos, len)
    }

    /// The well-formed, correctly keyed record at `c`, whatever its place in the sequence.
    pub(super) fn decode_at(&mut self, c: u64) -> std::io::Result<Result<RecordHeader, Reject>> {
        let seg_size = self.geo.segment_size_bytes;
        if !record_fits_at(self.geo.seg_off(c), seg_size) {
            return Ok(Err(Reject::NoRoom));
        }
        let h = match RecordHeader::parse(self.win.get(c, HEADER_BYTES)?) {
            Ok(h) => h,
            Err(e) => return Ok(Err(Reject::Header(e))),
        };
        let total = HEADER_BYTES as u64 + u64::from(h.payload_len);
        if c + total > self.geo.seg_end(c) {
            return Ok(Err(Reject::Length(h.payload_len)));
        }
        let may_be_unkeyed =
            h.epoch < self.limits.keyed_from_epoch && c < self.limits.unkeyed_below_pos;
        if (h.version == UNKEYED_FORMAT_VERSION) != may_be_unkeyed {
            return Ok(Err(Reject::Format(h.version)));
        }
        let rec = self.win.get(c, total as usize)?;
        if record_crc(self.limits.key, rec, &rec[HEADER_BYTES..]) != stored_crc(rec) {
            return Ok(Err(Reject::Crc));
        }
        Ok(Ok(h))
    }

    /// The first position in `[from, stop)` holding the record magic, if any.
    pub(super) fn find_magic(&mut self, from: u64, stop: u64) -> std::io::Result<Option<u64>> {
        const HAY_BYTES: u64 = 64 * 1024;
        let magic = MAGIC.to_le_bytes();
        let mut p = from;
        while p < stop {
            let hay_end = (p + HAY_BYTES).min(self.geo.seg_end(p)).min(stop);
            let hay = self.win.get(p, (hay_end - p) as usize)?;
            if let Some(i) = memchr::memmem::find(hay, &magic) {
                return Ok(Some(p + i as u64));
            }
            // The magic may straddle the end of this piece, unless a segment ends there.
            let overlap = (magic.len() as u64 - 1) * u64::from(hay_end < self.geo.seg_end(p));
            p = (hay_end - overlap).max(p + 1);
        }
        Ok(None)
    }
}
