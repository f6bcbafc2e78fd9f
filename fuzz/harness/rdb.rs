//! The RDB of a full resynchronization as it arrives (`walrus::valkey::rdb`): the header
//! line after keepalive newlines (`handshake::take_line`), both transfer forms (`$<len>`
//! and the diskless `$EOF:<mark>`, [`Transfer`] and [`Payload`]), and the checksum of
//! what was received ([`RdbDigest`]).
//!
//! Input: one byte for the size limit ([`max_bytes`]), one byte of reads
//! ([`super::reads`]), then what the primary sends after `+FULLRESYNC`. Checked: no panic;
//! the payload, the bytes left for the stream after it and the result are the same however
//! the bytes arrive; a sized payload is exactly its length, a marked one ends at the
//! mark's first appearance; nothing past the limit is accepted; the digest fed in pieces
//! equals the digest fed at once and an independent CRC-64/Jones, and it accepts a
//! trailer only if it is 0 or that CRC.

use bytes::BytesMut;
use walrus::valkey::handshake::take_line;
use walrus::valkey::rdb::{format_version, Payload, RdbDigest, Transfer};

pub fn run(data: &[u8]) {
    let mut input = super::Input::new(data);
    let max = max_bytes(input.byte());
    let seed = input.byte();
    let bytes = input.rest();
    check(bytes, &super::reads(bytes.len(), seed), max);
}

/// No real limit for 0 (walrus's default is 64 GiB), else 0 to 254 bytes.
pub fn max_bytes(b: u8) -> u64 {
    match b {
        0 => 64 << 30,
        b => u64::from(b - 1),
    }
}

/// A transfer, received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub header: Option<String>,
    /// What the file holds; nothing after an error (`receive` deletes the file).
    pub payload: Vec<u8>,
    /// `Ok(the bytes after the payload)`, `Err(the error's text)`; `Ok` with `complete`
    /// false while the payload is still coming.
    pub end: Result<Vec<u8>, String>,
    pub complete: bool,
}

pub fn check(bytes: &[u8], reads: &[std::ops::Range<usize>], max: u64) -> Received {
    let whole = receive(bytes, &super::at_once(bytes.len()), max);
    let pieces = receive(bytes, reads, max);
    assert_eq!(whole, pieces, "the RDB depends on how the bytes arrive");
    assert!(
        whole.payload.len() as u64 <= max,
        "{} bytes past the limit {max}",
        whole.payload.len()
    );
    if let (Some(header), true) = (&whole.header, whole.complete) {
        match Transfer::parse(header, u64::MAX).expect("it was parsed before") {
            Transfer::Sized(len) => assert_eq!(whole.payload.len() as u64, len),
            Transfer::Marked(mark) => {
                assert!(
                    !contains(&whole.payload, &mark),
                    "the payload holds its mark"
                );
            }
        }
    }
    check_digest(&whole.payload, reads);
    whole
}

/// Receives as `rdb::receive` does, into memory.
pub fn receive(bytes: &[u8], reads: &[std::ops::Range<usize>], max: u64) -> Received {
    let mut buf = BytesMut::new();
    let mut header = None;
    let mut payload = None;
    let mut out = Vec::new();
    for read in reads {
        buf.extend_from_slice(&bytes[read.clone()]);
        if header.is_none() {
            match take_line(&mut buf) {
                Ok(None) => continue,
                Ok(Some(line)) => header = Some(line),
                Err(e) => return received(header, out, Err(e.to_string()), false),
            }
        }
        let line = header.as_deref().expect("read above");
        if payload.is_none() {
            match Transfer::parse(line, max) {
                Ok(t) => payload = Some(Payload::new(t, max)),
                Err(e) => return received(header, out, Err(e.to_string()), false),
            }
        }
        let p = payload.as_mut().expect("made above");
        match p.next(&buf) {
            Ok(piece) => {
                assert!(piece.payload <= piece.consumed && piece.consumed <= buf.len());
                out.extend_from_slice(&buf[..piece.payload]);
                let _ = buf.split_to(piece.consumed);
                if piece.done {
                    // The rest of the input is the stream's: it stays, untouched.
                    let rest = [&buf[..], &bytes[read.end..]].concat();
                    return received(header, out, Ok(rest), true);
                }
            }
            Err(e) => return received(header, out, Err(e.to_string()), false),
        }
        assert!(
            buf.len() < 64,
            "{} bytes held back from the file",
            buf.len()
        );
    }
    received(header, out, Ok(buf.to_vec()), false)
}

fn received(
    header: Option<String>,
    payload: Vec<u8>,
    end: Result<Vec<u8>, String>,
    complete: bool,
) -> Received {
    Received {
        header,
        payload: if end.is_ok() { payload } else { Vec::new() },
        end,
        complete,
    }
}

/// The digest of `payload` fed in the input's reads, at once, and a bitwise CRC-64/Jones
/// agree, and the trailer is judged as Valkey writes it.
fn check_digest(payload: &[u8], reads: &[std::ops::Range<usize>]) {
    let at_once = {
        let mut d = RdbDigest::default();
        d.update(payload);
        d.finish().map_err(|e| e.to_string())
    };
    let mut d = RdbDigest::default();
    for r in reads {
        let r = r.start.min(payload.len())..r.end.min(payload.len());
        d.update(&payload[r]);
    }
    assert_eq!(d.finish().map_err(|e| e.to_string()), at_once);
    let Some(body_len) = payload.len().checked_sub(8) else {
        assert!(at_once.is_err(), "{} bytes is no RDB", payload.len());
        return;
    };
    let (body, trailer) = payload.split_at(body_len);
    let trailer = u64::from_le_bytes(trailer.try_into().expect("8 bytes"));
    let crc = crc64_jones(body);
    let valid = (trailer == 0 || trailer == crc) && format_version(payload).is_some();
    match at_once {
        Ok(sum) => {
            assert!(valid, "a bad trailer or header accepted");
            assert_eq!((sum.crc64, sum.bytes), (crc, payload.len() as u64));
        }
        Err(_) => assert!(!valid, "a good RDB refused"),
    }
}

/// CRC-64/Jones (reflected, polynomial 0xad93d23594c935a9), one bit at a time: a second
/// implementation, too slow for walrus, to check its tables against.
pub fn crc64_jones(data: &[u8]) -> u64 {
    const REFLECTED_POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
    for &b in data {
        crc ^= u64::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ REFLECTED_POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
