//! Property tests of the record encoder and decoder.

use proptest::prelude::*;
use walrus::journal::format::{
    decode_record, encode_record, DecodeError, Kind, RecordHeader, RecordKey, FORMAT_VERSION,
    HEADER_BYTES,
};

const KEY: RecordKey = RecordKey(0x0123_4567_89ab_cdef);

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Full),
        Just(Kind::First),
        Just(Kind::Middle),
        Just(Kind::Last)
    ]
}

prop_compose! {
    fn header_and_payload()(
        kind in kind(),
        epoch in any::<u32>(),
        seg_seq in any::<u64>(),
        lsn in any::<u64>(),
        repl_offset_end in any::<u64>(),
        durable_hint in any::<u64>(),
        repl_id in prop::array::uniform32(any::<u8>()),
        id_tail in prop::array::uniform8(any::<u8>()),
        payload in prop::collection::vec(any::<u8>(), 0..5000),
    ) -> (RecordHeader, Vec<u8>) {
        let mut id = [0u8; 40];
        id[..32].copy_from_slice(&repl_id);
        id[32..].copy_from_slice(&id_tail);
        (RecordHeader { version: FORMAT_VERSION, kind, payload_len: payload.len() as u32, epoch, seg_seq, lsn, repl_offset_end, durable_hint, repl_id: id }, payload)
    }
}

proptest! {
    #[test]
    fn roundtrip((h, payload) in header_and_payload()) {
        let mut buf = vec![0u8; HEADER_BYTES + payload.len() + 17];
        let n = encode_record(KEY, &h, &payload, &mut buf);
        prop_assert_eq!(n, HEADER_BYTES + payload.len());
        let (h2, p2) = decode_record(KEY, &buf).unwrap();
        prop_assert_eq!(h2, h);
        prop_assert_eq!(p2, &payload[..]);
    }

    #[test]
    fn any_single_corruption_is_detected((h, payload) in header_and_payload(), idx in any::<prop::sample::Index>(), mask in 1u8..=255) {
        let mut buf = vec![0u8; HEADER_BYTES + payload.len()];
        encode_record(KEY, &h, &payload, &mut buf);
        let i = idx.index(buf.len());
        buf[i] ^= mask;
        match decode_record(KEY, &buf) {
            Err(_) => {}
            // A flipped length can only "succeed" if the CRC still matches: it must not.
            Ok((h2, p2)) => prop_assert!(false, "corruption at byte {} undetected: {:?} {}", i, h2, p2.len()),
        }
    }

    #[test]
    fn truncated_records_never_decode((h, payload) in header_and_payload(), cut in any::<prop::sample::Index>()) {
        let mut buf = vec![0u8; HEADER_BYTES + payload.len()];
        encode_record(KEY, &h, &payload, &mut buf);
        let cut = cut.index(buf.len());
        prop_assert!(decode_record(KEY, &buf[..cut]).is_err());
    }

    /// A record sealed with any other key (what a client, who cannot know the journal's
    /// key, can produce at best) does not decode.
    #[test]
    fn a_record_sealed_with_another_key_never_decodes((h, payload) in header_and_payload(), other in any::<u64>()) {
        prop_assume!(other != KEY.0);
        let mut buf = vec![0u8; HEADER_BYTES + payload.len()];
        encode_record(RecordKey(other), &h, &payload, &mut buf);
        prop_assert_eq!(decode_record(KEY, &buf), Err(DecodeError::Crc));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = decode_record(KEY, &bytes);
    }
}

#[test]
fn truncated_payload_reports_sizes() {
    let h = RecordHeader {
        version: FORMAT_VERSION,
        kind: Kind::Full,
        payload_len: 10,
        epoch: 1,
        seg_seq: 0,
        lsn: 1,
        repl_offset_end: 10,
        durable_hint: 0,
        repl_id: [b'x'; 40],
    };
    let mut buf = vec![0u8; HEADER_BYTES + 10];
    encode_record(KEY, &h, &[7; 10], &mut buf);
    assert_eq!(
        decode_record(KEY, &buf[..HEADER_BYTES + 4]),
        Err(DecodeError::Truncated {
            needed: HEADER_BYTES + 10,
            available: HEADER_BYTES + 4
        })
    );
}
