//! On-disk record format: encoder and decoder of one record header.
//!
//! The layout (a 96-byte little-endian header, then the payload), why each field exists,
//! the per-journal key in the checksum and where records may start are written once, in
//! docs/journal.md ("Record format", "The open tail block"); this file implements them.
//!
//! The log is a logical byte stream; logical position `pos` lives in segment sequence
//! `pos / S` (S = segment size), stored in file `(pos / S) % N`, at offset `pos % S`.
//!
//! An entry written in the current format (3) begins with its time: the wall clock when
//! walrus journaled it, [`ENTRY_TIME_BYTES`] little-endian milliseconds since the Unix
//! epoch, before the stream bytes, in the entry's first record (or across its first
//! fragments). Records keep their layout: only what an entry's payload holds changed.

use crc64fast::Digest;

/// Alignment and padding unit of every write (O_DIRECT needs it).
pub const BLOCK_BYTES: usize = 4096;
/// Size of a record header.
pub const HEADER_BYTES: usize = 96;
/// Bytes covered by the CRC inside the header (everything before the CRC field).
pub const CRC_COVERED_HEADER_BYTES: usize = 88;
/// "WJL1" read as little-endian u32: walrus journal log.
pub const MAGIC: u32 = u32::from_le_bytes(*b"WJL1");
/// Version of the records this build writes: checksums keyed with the journal's secret, and
/// each entry's time before its stream bytes.
pub const FORMAT_VERSION: u8 = 3;
/// Records written before entries carried their time (keyed); read, never written.
pub const UNTIMED_FORMAT_VERSION: u8 = 2;
/// Records written before the key existed (unkeyed checksum); read, never written.
pub const UNKEYED_FORMAT_VERSION: u8 = 1;
/// The time at the start of an entry of the current format: milliseconds since the Unix
/// epoch, little-endian (0: unknown, an entry copied from a journal that had no times).
pub const ENTRY_TIME_BYTES: usize = 8;
/// Length of a Valkey replication id.
pub const REPL_ID_BYTES: usize = 40;

/// Record kind: whole entry or a fragment of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Full = 1,
    First = 2,
    Middle = 3,
    Last = 4,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::Full),
            2 => Some(Kind::First),
            3 => Some(Kind::Middle),
            4 => Some(Kind::Last),
            _ => None,
        }
    }

    /// True when this record begins an entry.
    pub fn starts_entry(self) -> bool {
        matches!(self, Kind::Full | Kind::First)
    }
}

/// The journal's secret, mixed into every record's checksum. Its Debug output is redacted:
/// it must not reach logs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RecordKey(pub u64);

impl std::fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordKey(..)")
    }
}

impl RecordKey {
    /// A fresh key from the operating system's random source.
    pub fn random() -> std::io::Result<RecordKey> {
        getrandom::u64()
            .map(RecordKey)
            .map_err(std::io::Error::other)
    }
}

/// Whether the entries of records of `version` begin with their time.
pub fn is_timed(version: u8) -> bool {
    version >= FORMAT_VERSION
}

/// Decoded header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// FORMAT_VERSION; UNTIMED_FORMAT_VERSION or UNKEYED_FORMAT_VERSION for a record of a
    /// journal made before entries carried their time, or before keys.
    pub version: u8,
    pub kind: Kind,
    pub payload_len: u32,
    pub epoch: u32,
    pub seg_seq: u64,
    pub lsn: u64,
    pub repl_offset_end: u64,
    pub durable_hint: u64,
    pub repl_id: [u8; REPL_ID_BYTES],
}

/// Why bytes are not a well-formed header (before any CRC or sequence check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer than HEADER_BYTES available.
    Short,
    /// Wrong magic: zeros, junk, or the middle of a payload.
    Magic,
    /// Unknown format version.
    Version(u8),
    /// Unknown record kind.
    Kind(u8),
    /// Reserved bytes not zero.
    Reserved,
}

/// Does a record (header plus at least one payload byte) fit at `seg_off` in a segment?
/// The writer and recovery both use this one rule for where records may start.
pub fn record_fits_at(seg_off: u64, segment_size_bytes: u64) -> bool {
    segment_size_bytes.saturating_sub(seg_off) > HEADER_BYTES as u64
}

/// The most ring an entry of `len` bytes of stream can take (stored with its time,
/// [`ENTRY_TIME_BYTES`] more), counted from the end of the log before it, for writes of at
/// most `max_write_bytes` in segments of `segment_size_bytes`.
///
/// With L = len + ENTRY_TIME_BYTES, H = HEADER_BYTES, B = BLOCK_BYTES, W, S: the entry may
/// first skip to the next block
/// (< B) or, near a segment's end, to the next segment (<= H); each record costs H, and
/// each write buffer it fills leaves at most H unused at its end. A span of X bytes touches
/// at most X/W + X/S + 3 buffers (one per W, one more per segment end, the first and last
/// partial), so X <= L + B + 8H + 2H (X/W + X/S), that is
/// X <= (L + B + 8H) * W * S / (W * S - 2H (W + S)). docs/journal.md ("Large entries")
/// gives the admission rule built on it.
pub fn entry_span_bound(len: u64, max_write_bytes: u64, segment_size_bytes: u64) -> u64 {
    let (h, b) = (HEADER_BYTES as u128, BLOCK_BYTES as u128);
    let (w, s) = (u128::from(max_write_bytes), u128::from(segment_size_bytes));
    let stored = u128::from(len) + ENTRY_TIME_BYTES as u128;
    let denominator = (w * s).saturating_sub(2 * h * (w + s)).max(1);
    let bound = (stored + b + 8 * h) * w * s;
    u64::try_from(bound.div_ceil(denominator)).unwrap_or(u64::MAX)
}

/// The most write buffers an entry of `len` bytes of stream can fill: one per `max_write_bytes` of
/// its span, one more per segment end it crosses, and the first and last partial ones
/// (see [`entry_span_bound`]).
pub fn entry_buffers_bound(len: u64, max_write_bytes: u64, segment_size_bytes: u64) -> u64 {
    let span = entry_span_bound(len, max_write_bytes, segment_size_bytes);
    span.div_ceil(max_write_bytes) + span.div_ceil(segment_size_bytes) + 3
}

/// Round `pos` up to the next block boundary.
pub fn align_up(pos: u64) -> u64 {
    let b = BLOCK_BYTES as u64;
    pos.div_ceil(b) * b
}

/// Round `pos` down to the start of its block.
pub fn align_down(pos: u64) -> u64 {
    pos - pos % BLOCK_BYTES as u64
}

impl RecordHeader {
    /// Writes the header fields (CRC left zero) into `out[..HEADER_BYTES]`.
    pub fn write_fields(&self, out: &mut [u8]) {
        assert!(out.len() >= HEADER_BYTES, "header buffer too small");
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4] = self.version;
        out[5] = self.kind as u8;
        out[6..8].copy_from_slice(&[0, 0]);
        out[8..12].copy_from_slice(&self.payload_len.to_le_bytes());
        out[12..16].copy_from_slice(&self.epoch.to_le_bytes());
        out[16..24].copy_from_slice(&self.seg_seq.to_le_bytes());
        out[24..32].copy_from_slice(&self.lsn.to_le_bytes());
        out[32..40].copy_from_slice(&self.repl_offset_end.to_le_bytes());
        out[40..48].copy_from_slice(&self.durable_hint.to_le_bytes());
        out[48..88].copy_from_slice(&self.repl_id);
        out[88..96].copy_from_slice(&[0; 8]);
    }

    /// Parses the fixed fields; does not check the CRC.
    pub fn parse(bytes: &[u8]) -> Result<RecordHeader, HeaderError> {
        if bytes.len() < HEADER_BYTES {
            return Err(HeaderError::Short);
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        if u32_at(0) != MAGIC {
            return Err(HeaderError::Magic);
        }
        let version = bytes[4];
        if !(UNKEYED_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(HeaderError::Version(version));
        }
        let kind = Kind::from_u8(bytes[5]).ok_or(HeaderError::Kind(bytes[5]))?;
        if bytes[6] != 0 || bytes[7] != 0 {
            return Err(HeaderError::Reserved);
        }
        let mut repl_id = [0u8; REPL_ID_BYTES];
        repl_id.copy_from_slice(&bytes[48..88]);
        Ok(RecordHeader {
            version,
            kind,
            payload_len: u32_at(8),
            epoch: u32_at(12),
            seg_seq: u64_at(16),
            lsn: u64_at(24),
            repl_offset_end: u64_at(32),
            durable_hint: u64_at(40),
            repl_id,
        })
    }
}

/// CRC of a record: the key (unless the header says format 1), the header bytes before the
/// CRC field, then the payload.
pub fn record_crc(key: RecordKey, header: &[u8], payload: &[u8]) -> u64 {
    let mut d = Digest::new();
    if header[4] != UNKEYED_FORMAT_VERSION {
        d.write(&key.0.to_le_bytes());
    }
    d.write(&header[..CRC_COVERED_HEADER_BYTES]);
    d.write(payload);
    d.sum64()
}

/// Stores the CRC into an encoded header whose fields are already written.
pub fn seal_crc(key: RecordKey, header: &mut [u8], payload: &[u8]) {
    let crc = record_crc(key, header, payload);
    header[88..96].copy_from_slice(&crc.to_le_bytes());
}

/// CRC stored in an encoded header.
pub fn stored_crc(header: &[u8]) -> u64 {
    u64::from_le_bytes(header[88..96].try_into().unwrap())
}

/// Encodes header + payload into `out` (which must hold HEADER_BYTES + payload.len()).
/// Returns the number of bytes written. Used by tests and tools; the hot path encodes in place.
pub fn encode_record(key: RecordKey, h: &RecordHeader, payload: &[u8], out: &mut [u8]) -> usize {
    assert_eq!(
        h.payload_len as usize,
        payload.len(),
        "payload_len disagrees with payload"
    );
    let total = HEADER_BYTES + payload.len();
    assert!(out.len() >= total, "output buffer too small");
    let (hdr, rest) = out.split_at_mut(HEADER_BYTES);
    h.write_fields(hdr);
    rest[..payload.len()].copy_from_slice(payload);
    seal_crc(key, hdr, payload);
    total
}

/// Decodes a whole record from `bytes` (header at the start). Checks structure and CRC.
pub fn decode_record(key: RecordKey, bytes: &[u8]) -> Result<(RecordHeader, &[u8]), DecodeError> {
    let h = RecordHeader::parse(bytes).map_err(DecodeError::Header)?;
    let end = HEADER_BYTES + h.payload_len as usize;
    if bytes.len() < end {
        return Err(DecodeError::Truncated {
            needed: end,
            available: bytes.len(),
        });
    }
    let payload = &bytes[HEADER_BYTES..end];
    if record_crc(key, bytes, payload) != stored_crc(bytes) {
        return Err(DecodeError::Crc);
    }
    Ok((h, payload))
}

/// Why a record failed to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    Header(HeaderError),
    Truncated { needed: usize, available: usize },
    Crc,
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: RecordKey = RecordKey(0x5eed);

    fn hdr(len: u32) -> RecordHeader {
        RecordHeader {
            version: FORMAT_VERSION,
            kind: Kind::Full,
            payload_len: len,
            epoch: 3,
            seg_seq: 7,
            lsn: 42,
            repl_offset_end: 1000,
            durable_hint: 40,
            repl_id: [b'a'; REPL_ID_BYTES],
        }
    }

    #[test]
    fn roundtrip_and_crc_detects_flip() {
        let payload = b"*3\r\n$3\r\nSET\r\n";
        let mut buf = vec![0u8; HEADER_BYTES + payload.len()];
        let n = encode_record(KEY, &hdr(payload.len() as u32), payload, &mut buf);
        assert_eq!(n, buf.len());
        let (h, p) = decode_record(KEY, &buf).unwrap();
        assert_eq!(h, hdr(payload.len() as u32));
        assert_eq!(p, payload);
        for bit in 0..buf.len() * 8 {
            let mut b = buf.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_record(KEY, &b).is_err(), "bit {bit} flip undetected");
        }
    }

    #[test]
    fn a_record_sealed_with_another_key_does_not_decode() {
        let payload = b"*1\r\n$8\r\nFLUSHALL\r\n";
        let mut buf = vec![0u8; HEADER_BYTES + payload.len()];
        encode_record(RecordKey(1), &hdr(payload.len() as u32), payload, &mut buf);
        assert_eq!(decode_record(KEY, &buf), Err(DecodeError::Crc));
        // A format 1 record has no key: any key reads it.
        let mut h = hdr(payload.len() as u32);
        h.version = UNKEYED_FORMAT_VERSION;
        encode_record(RecordKey(1), &h, payload, &mut buf);
        assert_eq!(decode_record(KEY, &buf).unwrap().0, h);
    }

    #[test]
    fn zeros_are_not_a_record() {
        assert_eq!(
            decode_record(KEY, &[0u8; 200]),
            Err(DecodeError::Header(HeaderError::Magic))
        );
        assert_eq!(RecordHeader::parse(&[0u8; 10]), Err(HeaderError::Short));
    }

    #[test]
    fn fits_and_align() {
        assert!(record_fits_at(0, 65536));
        assert!(!record_fits_at(65536 - 96, 65536));
        assert!(record_fits_at(65536 - 97, 65536));
        assert_eq!(align_up(0), 0);
        assert_eq!(align_up(1), 4096);
        assert_eq!(align_up(4096), 4096);
    }
}
