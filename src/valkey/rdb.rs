//! Receiving the RDB of a full resynchronization ([`receive`]); where its bytes go is the
//! receiver's ([`RdbSink`]: a checkpoint stores them durably, `crate::checkpoint::rdb_file`).
//!
//! The primary announces the payload as `$<len>\r\n` followed by exactly `len` bytes (no
//! trailing CRLF), or, for a diskless transfer of unknown size, as `$EOF:<40-byte mark>\r\n`
//! followed by the payload and then the mark itself. Either way, bytes that follow the
//! payload in the same read already belong to the command stream and stay in the
//! connection's buffer. The payload's checksum (its trailer) is checked as it arrives.
//!
//! The RDB's format version is read from its header as it arrives ([`format_version`]):
//! a restore may only send it to a server that loads that format ([`loads`]).

use super::handshake::read_line;
use crate::net::{read_chunk, room_to_read};
use crate::upstream::client::{Conn, UpstreamError};
use bytes::Buf;

pub const EOF_MARK_LEN: usize = 40;

/// Valkey's RDB checksum: CRC-64/Jones (`crc64.c`), over every byte before the 8-byte
/// trailer, which holds it little-endian (0 when Valkey runs with `rdbchecksum no`).
/// Slice-by-16 tables: a restore verifies gigabytes of RDB before Valkey may load them.
static RDB_CRC: crc::Crc<u64, crc::Table<16>> =
    crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_REDIS);
const TRAILER_LEN: usize = 8;
/// `REDIS0011`, `VALKEY080`: a name and the format version in decimal digits.
const HEADER_LEN: usize = 9;

/// The format version in an RDB's 9-byte header: `REDIS` and four digits (Redis OSS, and
/// Valkey before 9), or `VALKEY` and three (Valkey 9 and later, from format 80).
pub fn format_version(header: &[u8]) -> Option<u16> {
    let digits = header
        .strip_prefix(b"REDIS")
        .filter(|d| d.len() >= 4)
        .map(|d| &d[..4])
        .or_else(|| {
            header
                .strip_prefix(b"VALKEY")
                .filter(|d| d.len() >= 3)
                .map(|d| &d[..3])
        })?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Whether a server that writes RDB format `server` can load format `rdb`. Formats up to 11
/// are the common ancestry of Redis OSS and Valkey: each loads its own and older ones.
/// Formats 12 to 79 are Redis OSS's after the fork, which Valkey refuses; 80 and up are
/// Valkey's, which Redis OSS cannot read (another header).
pub fn loads(server: u16, rdb: u16) -> bool {
    const REDIS_ONLY: std::ops::RangeInclusive<u16> = 12..=79;
    rdb <= server && (!REDIS_ONLY.contains(&rdb) || REDIS_ONLY.contains(&server))
}

/// Computes an RDB's checksum as its bytes stream by, holding back the last 8 bytes (the
/// trailer) because the end of a diskless transfer is only known when it comes.
pub struct RdbDigest {
    digest: crc::Digest<'static, u64, crc::Table<16>>,
    tail: Vec<u8>,
    bytes: u64,
    /// The first bytes, up to the header's length.
    header: Vec<u8>,
}

impl Default for RdbDigest {
    fn default() -> Self {
        RdbDigest {
            digest: RDB_CRC.digest(),
            tail: Vec::with_capacity(2 * TRAILER_LEN),
            bytes: 0,
            header: Vec::with_capacity(HEADER_LEN),
        }
    }
}

impl RdbDigest {
    pub fn update(&mut self, data: &[u8]) {
        let missing = HEADER_LEN - self.header.len();
        self.header
            .extend_from_slice(&data[..missing.min(data.len())]);
        self.bytes += data.len() as u64;
        if data.len() >= TRAILER_LEN {
            self.digest.update(&self.tail);
            let (body, tail) = data.split_at(data.len() - TRAILER_LEN);
            self.digest.update(body);
            self.tail.clear();
            self.tail.extend_from_slice(tail);
        } else {
            self.tail.extend_from_slice(data);
            let over = self.tail.len().saturating_sub(TRAILER_LEN);
            self.digest.update(&self.tail[..over]);
            self.tail.drain(..over);
        }
    }

    /// The checksum of everything before the trailer and the format version; an error if
    /// the trailer holds a different checksum (Valkey wrote 0 there when it does not
    /// checksum) or the header is not an RDB's.
    pub fn finish(self) -> Result<RdbSum, UpstreamError> {
        self.check().map_err(UpstreamError::Decode)
    }

    fn check(self) -> Result<RdbSum, String> {
        if self.tail.len() < TRAILER_LEN {
            return Err(format!("{} bytes is too short for an RDB", self.bytes));
        }
        let trailer = u64::from_le_bytes(self.tail[..].try_into().expect("8 bytes"));
        let crc64 = self.digest.finalize();
        if trailer != 0 && trailer != crc64 {
            return Err(format!(
                "RDB checksum mismatch: its trailer says {trailer:016x}, its bytes give {crc64:016x}"
            ));
        }
        let version = format_version(&self.header).ok_or_else(|| {
            format!(
                "not an RDB: it starts with {:?}",
                String::from_utf8_lossy(&self.header)
            )
        })?;
        Ok(RdbSum {
            bytes: self.bytes,
            crc64,
            version,
        })
    }
}

/// Size, CRC-64/Jones and format version of an RDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdbSum {
    pub bytes: u64,
    pub crc64: u64,
    pub version: u16,
}

/// Where a received RDB's bytes go, in order, as they arrive.
pub trait RdbSink {
    fn write(
        &mut self,
        data: &[u8],
    ) -> impl std::future::Future<Output = std::io::Result<()>> + Send;
}

/// What [`receive`] took in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub sum: RdbSum,
    /// Sent in the diskless `$EOF:<mark>` form rather than with its length up front.
    pub eof_mark: bool,
}

/// Reads the RDB of a full resynchronization from `conn`: its header line, then the payload
/// as the header delimits it (at most `max_bytes`), handed to `sink` as it arrives and
/// checked ([`RdbDigest`]). The bytes after it stay in `conn.buf`.
pub async fn receive(
    conn: &mut Conn,
    sink: &mut impl RdbSink,
    max_bytes: u64,
) -> Result<Received, UpstreamError> {
    let header = read_line(conn).await?;
    let transfer = Transfer::parse(&header, max_bytes)?;
    let eof_mark = matches!(transfer, Transfer::Marked(_));
    let mut payload = Payload::new(transfer, max_bytes);
    let mut digest = RdbDigest::default();
    loop {
        let piece = payload.next(&conn.buf)?;
        let data = &conn.buf[..piece.payload];
        digest.update(data);
        sink.write(data).await?;
        conn.buf.advance(piece.consumed);
        if piece.done {
            break;
        }
        room_to_read(&mut conn.buf, read_chunk::BULK, 0);
        // Each piece within upstream.reply_timeout_ms: bounded by progress, not by a total.
        conn.read_more().await?;
    }
    Ok(Received {
        sum: digest.finish()?,
        eof_mark,
    })
}

/// How a transfer delimits its payload, as its header line announced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transfer {
    /// `$<len>`: exactly `len` bytes.
    Sized(u64),
    /// `$EOF:<mark>`: every byte up to the mark's first appearance.
    Marked(Vec<u8>),
}

impl Transfer {
    /// Reads the header line that announces the payload; a payload announced larger than
    /// `max_bytes` is refused, and an error reply comes back as [`UpstreamError::Refused`].
    pub fn parse(header: &str, max_bytes: u64) -> Result<Transfer, UpstreamError> {
        if header.starts_with('-') {
            return Err(UpstreamError::Refused(bytes::Bytes::from(format!(
                "{header}\r\n"
            ))));
        }
        if let Some(mark) = header.strip_prefix("$EOF:") {
            if mark.len() != EOF_MARK_LEN {
                return Err(UpstreamError::Decode(format!(
                    "bad RDB EOF mark in {header:?}"
                )));
            }
            return Ok(Transfer::Marked(mark.as_bytes().to_vec()));
        }
        let len: u64 = header
            .strip_prefix('$')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| UpstreamError::Decode(format!("bad RDB header {header:?}")))?;
        if len > max_bytes {
            return Err(UpstreamError::Decode(format!(
                "RDB of {len} bytes exceeds the limit of {max_bytes}"
            )));
        }
        Ok(Transfer::Sized(len))
    }
}

/// Finds the payload's end in the bytes that follow the header, as they arrive: the
/// framing of [`receive`], apart from the socket and the file.
#[derive(Debug)]
pub struct Payload {
    transfer: Transfer,
    /// Payload bytes handed out so far.
    taken: u64,
    max_bytes: u64,
}

/// What [`Payload::next`] found at the front of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The first `payload` bytes are payload.
    pub payload: usize,
    /// Bytes to drop from the buffer: the payload, and the EOF mark if it ended there.
    pub consumed: usize,
    /// The payload is complete: the bytes after `consumed` belong to the stream.
    pub done: bool,
}

impl Payload {
    pub fn new(transfer: Transfer, max_bytes: u64) -> Payload {
        Payload {
            transfer,
            taken: 0,
            max_bytes,
        }
    }

    /// Looks at `buf`, the bytes received since the last piece was consumed. A marked
    /// payload past `max_bytes` is refused once its bytes show it, whether the mark came
    /// in the same read or not.
    pub fn next(&mut self, buf: &[u8]) -> Result<Piece, UpstreamError> {
        let piece = match &self.transfer {
            Transfer::Sized(len) => {
                let take = (buf.len() as u64).min(len - self.taken) as usize;
                Piece {
                    payload: take,
                    consumed: take,
                    done: self.taken + take as u64 == *len,
                }
            }
            Transfer::Marked(mark) => match find(buf, mark) {
                Some(at) => Piece {
                    payload: at,
                    consumed: at + mark.len(),
                    done: true,
                },
                None => {
                    // Everything but a possible start of the mark is payload.
                    let safe = buf.len().saturating_sub(mark.len() - 1);
                    Piece {
                        payload: safe,
                        consumed: safe,
                        done: false,
                    }
                }
            },
        };
        self.taken += piece.payload as u64;
        if self.taken > self.max_bytes {
            return Err(UpstreamError::Decode(format!(
                "RDB exceeds the limit of {} bytes",
                self.max_bytes
            )));
        }
        Ok(piece)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if hay.len() < needle.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .find(|&i| hay[i] == needle[0] && &hay[i..i + needle.len()] == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_matches_valkeys_check_value_and_holds_back_the_trailer() {
        // CRC-64/Jones of "REDIS0011" is ddf881e71bd6a1ab (crc64.c's own check value is
        // e9c6d914c4b8d9ca, of "123456789", which is no RDB header).
        let mut rdb = b"REDIS0011".to_vec();
        rdb.extend_from_slice(&0xddf881e71bd6a1ab_u64.to_le_bytes());
        for split in 0..rdb.len() {
            let mut d = RdbDigest::default();
            for part in [&rdb[..split], &rdb[split..]] {
                for byte in part.chunks(3) {
                    d.update(byte);
                }
            }
            let sum = d.finish().unwrap();
            assert_eq!(sum.crc64, 0xddf881e71bd6a1ab);
            assert_eq!(sum.bytes, rdb.len() as u64);
            assert_eq!(sum.version, 11);
        }
        let mut bad = rdb.clone();
        bad[0] ^= 1;
        let mut d = RdbDigest::default();
        d.update(&bad);
        assert!(d
            .finish()
            .unwrap_err()
            .to_string()
            .contains("checksum mismatch"));
        // A zero trailer means Valkey did not checksum: accepted, the CRC is still computed.
        let mut unchecked = b"REDIS0011".to_vec();
        unchecked.extend_from_slice(&[0; 8]);
        let mut d = RdbDigest::default();
        d.update(&unchecked);
        assert_eq!(d.finish().unwrap().crc64, 0xddf881e71bd6a1ab);
        // Anything else is refused by its header.
        let mut d = RdbDigest::default();
        d.update(b"123456789\0\0\0\0\0\0\0\0");
        assert!(d.finish().unwrap_err().to_string().contains("not an RDB"));
    }

    /// Found by fuzzing (fuzz/regressions/rdb): a marked payload over the limit was taken
    /// when its mark came in the same read as its last bytes.
    #[test]
    fn a_marked_payload_keeps_to_the_limit_however_it_arrives() {
        let mark = [b'm'; EOF_MARK_LEN];
        let header = format!("$EOF:{}", std::str::from_utf8(&mark).unwrap());
        for (payload, fits) in [(&b"1234"[..], true), (b"12345", false)] {
            let transfer = Transfer::parse(&header, 4).unwrap();
            let whole = [payload, &mark[..], b"stream"].concat();
            let piece = Payload::new(transfer, 4).next(&whole);
            assert_eq!(piece.is_ok(), fits, "{payload:?}");
            if fits {
                let piece = piece.unwrap();
                assert_eq!((piece.payload, piece.done), (4, true));
                assert_eq!(&whole[piece.consumed..], b"stream");
            }
        }
        assert!(Transfer::parse("$5", 4).is_err());
        assert_eq!(Transfer::parse("$4", 4).unwrap(), Transfer::Sized(4));
        assert!(matches!(
            Transfer::parse("-ERR no", 4),
            Err(UpstreamError::Refused(_))
        ));
    }

    #[test]
    fn format_versions_and_who_loads_them() {
        assert_eq!(format_version(b"REDIS0010"), Some(10));
        assert_eq!(format_version(b"REDIS0011"), Some(11));
        assert_eq!(format_version(b"VALKEY080"), Some(80));
        assert_eq!(format_version(b"REDIS001"), None);
        assert_eq!(format_version(b"KEYDB0011"), None);
        // Redis 7.0 (10), Valkey 8 (11), Redis 7.4 (12), Valkey 9 (80).
        assert!(loads(11, 10) && loads(11, 11) && loads(80, 11) && loads(80, 80));
        assert!(!loads(10, 11) && !loads(11, 80) && !loads(10, 80));
        assert!(loads(12, 11) && loads(12, 12) && !loads(80, 12) && !loads(12, 80));
    }
}
