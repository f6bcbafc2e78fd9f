//! Journal records (`walrus::journal::format`): the header parser and the record decoder
//! that recovery runs on every candidate position of a segment.
//!
//! Input: the bytes found at a position. Checked: no panic; a header that parses writes back
//! as the same bytes; a record that decodes re-encodes as exactly its bytes, and does not
//! decode under another key unless it is format 1 (unkeyed); and, built from the input, a
//! fresh record decodes as itself and every single bit flipped in it is caught.

use walrus::journal::format::{
    decode_record, encode_record, Kind, RecordHeader, RecordKey, FORMAT_VERSION, HEADER_BYTES,
    REPL_ID_BYTES, UNKEYED_FORMAT_VERSION,
};

/// The key records are sealed with here, and one a forger might guess.
pub const KEY: RecordKey = RecordKey(0x5eed_cafe_f00d_0001);
pub const OTHER_KEY: RecordKey = RecordKey(0x5eed_cafe_f00d_0002);

pub fn run(data: &[u8]) {
    decode_found(data);
    roundtrip_built(data);
}

/// Whatever bytes sit where a record may start.
fn decode_found(data: &[u8]) {
    if let Ok(h) = RecordHeader::parse(data) {
        let mut back = [0u8; HEADER_BYTES];
        h.write_fields(&mut back);
        // Bytes 88..96 hold the CRC, which `write_fields` leaves zero.
        assert_eq!(back[..88], data[..88], "header {h:?} writes back otherwise");
    }
    if let Ok((h, payload)) = decode_record(KEY, data) {
        assert_eq!(h.payload_len as usize, payload.len());
        let mut out = vec![0u8; HEADER_BYTES + payload.len()];
        encode_record(KEY, &h, payload, &mut out);
        assert_eq!(out, data[..out.len()], "record {h:?} re-encodes otherwise");
        if h.version != UNKEYED_FORMAT_VERSION {
            assert!(
                decode_record(OTHER_KEY, data).is_err(),
                "decoded without its key"
            );
        }
    }
}

/// A record built from the input: header fields from its first bytes, the rest as payload.
fn roundtrip_built(data: &[u8]) {
    let mut fields = super::Input::new(data);
    let mut word = |n: usize| (0..n).fold(0u64, |acc, _| acc << 8 | u64::from(fields.byte()));
    let kind = [Kind::Full, Kind::First, Kind::Middle, Kind::Last][word(1) as usize % 4];
    let version = if word(1) % 2 == 0 {
        FORMAT_VERSION
    } else {
        UNKEYED_FORMAT_VERSION
    };
    let (epoch, seg_seq, lsn) = (word(4) as u32, word(8), word(8));
    let (repl_offset_end, durable_hint) = (word(8), word(8));
    let id_byte = word(1) as u8;
    // Short: every bit of it is flipped below.
    let rest = fields.rest();
    let payload = &rest[..rest.len().min(64)];
    let h = RecordHeader {
        version,
        kind,
        payload_len: payload.len() as u32,
        epoch,
        seg_seq,
        lsn,
        repl_offset_end,
        durable_hint,
        repl_id: [id_byte; REPL_ID_BYTES],
    };
    let mut out = vec![0u8; HEADER_BYTES + payload.len()];
    let n = encode_record(KEY, &h, payload, &mut out);
    assert_eq!(n, out.len());
    assert_eq!(decode_record(KEY, &out), Ok((h, payload)));
    // A CRC-64 catches every single-bit error; a flipped header field is refused before.
    for bit in 0..out.len() * 8 {
        out[bit / 8] ^= 1 << (bit % 8);
        assert!(
            decode_record(KEY, &out).is_err(),
            "bit {bit} flipped undetected in {h:?}"
        );
        out[bit / 8] ^= 1 << (bit % 8);
    }
}
