//! The replication stream cut into journal entries (`walrus::replication::stream`), and
//! each entry's messages blanked for a restore (`walrus::datadir::messages::blank`).
//!
//! Input: one byte for the entry size the stream is cut at, one for the journal's entry
//! limit ([`sizes`]), one byte of reads ([`super::reads`]), then the stream. Checked: no
//! panic; the bytes emitted (and whether the stream fails) do not depend on how the stream
//! arrives, though where entries end may; every entry is whole commands, ends outside a
//! transaction, says `getack` exactly when it holds a `REPLCONF GETACK`, carries the
//! offset of its last byte, and fits the journal's limit; what waits in the buffer never
//! exceeds that limit; blanking keeps an entry's length and touches only messages.

use bytes::{Bytes, BytesMut};
use walrus::replication::stream::{StreamEntry, StreamFramer};
use walrus::resp::{Limits, ReplyScanner};

/// The replication offset the stream starts after.
const START_OFFSET: u64 = 1000;

pub fn run(data: &[u8]) {
    let mut input = super::Input::new(data);
    let (entry_bytes, max_entry_bytes) = sizes(input.byte(), input.byte());
    let seed = input.byte();
    let bytes = input.rest();
    check(
        bytes,
        &super::reads(bytes.len(), seed),
        entry_bytes,
        max_entry_bytes,
    );
}

/// The entry size the stream is cut at (1 byte to 1 KiB, or walrus's 64 KiB floor) and the
/// journal's largest entry (64 bytes to 4 KiB, or its 576 MiB default).
pub fn sizes(cut: u8, max: u8) -> (usize, u64) {
    let entry_bytes = if cut == 0 {
        64 << 10
    } else {
        usize::from(cut) * 4
    };
    let max_entry_bytes = if max == 0 {
        576 << 20
    } else {
        64 + u64::from(max) * 16
    };
    (entry_bytes, max_entry_bytes)
}

/// What the framer made of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub entries: Vec<StreamEntry>,
    /// `Ok(bytes still buffered)`, or `Err(())`.
    pub end: Result<Bytes, ()>,
}

pub fn check(
    bytes: &[u8],
    reads: &[std::ops::Range<usize>],
    entry_bytes: usize,
    max_entry_bytes: u64,
) -> Outcome {
    let whole = frame(
        bytes,
        &super::at_once(bytes.len()),
        entry_bytes,
        max_entry_bytes,
    );
    let pieces = frame(bytes, reads, entry_bytes, max_entry_bytes);
    assert_eq!(
        emitted(&whole),
        emitted(&pieces),
        "the journaled bytes depend on how the stream arrives"
    );
    assert_eq!(
        whole.end.is_err(),
        pieces.end.is_err(),
        "{whole:?} {pieces:?}"
    );
    for outcome in [&whole, &pieces] {
        let mut offset = START_OFFSET;
        for e in &outcome.entries {
            offset += e.payload.len() as u64;
            assert_eq!(e.offset_end, offset, "offset of {e:?}");
            check_entry(e, max_entry_bytes);
        }
    }
    whole
}

/// Everything emitted, in order, and how the stream ended (what stays buffered is the rest).
fn emitted(o: &Outcome) -> (Vec<u8>, bool) {
    let all = o.entries.iter().flat_map(|e| e.payload.iter().copied());
    (all.collect(), o.end.is_err())
}

/// Feeds the stream in `reads`, taking every entry each read completes, as the link does.
pub fn frame(
    bytes: &[u8],
    reads: &[std::ops::Range<usize>],
    entry_bytes: usize,
    max_entry_bytes: u64,
) -> Outcome {
    let mut framer = StreamFramer::new(
        START_OFFSET,
        Limits::default(),
        entry_bytes,
        max_entry_bytes,
    );
    let mut buf = BytesMut::new();
    let mut entries = Vec::new();
    for read in reads {
        buf.extend_from_slice(&bytes[read.clone()]);
        loop {
            match framer.next_entry(&mut buf) {
                Ok(Some(e)) => entries.push(e),
                Ok(None) => break,
                Err(_) => {
                    return Outcome {
                        entries,
                        end: Err(()),
                    }
                }
            }
        }
        assert!(
            buf.len() as u64 <= max_entry_bytes,
            "{} bytes wait in the buffer for an entry the journal's limit ({max_entry_bytes}) refuses",
            buf.len()
        );
    }
    Outcome {
        entries,
        end: Ok(buf.freeze()),
    }
}

fn check_entry(e: &StreamEntry, max_entry_bytes: u64) {
    assert!(!e.payload.is_empty());
    assert!(
        e.payload.len() as u64 <= max_entry_bytes,
        "an entry of {} bytes, past the journal's limit {max_entry_bytes}",
        e.payload.len()
    );
    let mut scanner = ReplyScanner::new(Limits::default());
    let (mut at, mut in_multi, mut getack) = (0, false, false);
    while at < e.payload.len() {
        let n = scanner
            .scan(&e.payload[at..])
            .expect("an entry holds whole commands")
            .expect("an entry ends after a whole command");
        let cmd = &e.payload[at..at + n];
        match one_word(cmd) {
            Some(w) if w.eq_ignore_ascii_case(b"MULTI") => in_multi = true,
            Some(w) if w.eq_ignore_ascii_case(b"EXEC") => in_multi = false,
            _ => getack |= is_getack(cmd),
        }
        at += n;
    }
    assert!(!in_multi, "an entry ends inside a transaction: {e:?}");
    assert_eq!(e.getack, getack, "getack of {e:?}");
    let (blanked, messages) = walrus::datadir::messages::blank(e.payload.clone());
    assert_eq!(
        blanked.len(),
        e.payload.len(),
        "blanking changed the length"
    );
    let changed = blanked.iter().zip(e.payload.iter()).any(|(b, p)| b != p);
    assert_eq!(changed, messages > 0);
    assert!(blanked
        .iter()
        .zip(e.payload.iter())
        .all(|(b, p)| b == p || *b == b'\n'));
}

/// The word of a one-word command (`*1\r\n$5\r\nMULTI\r\n`). This and [`is_getack`] are
/// written apart from the framer's own, to check it.
fn one_word(cmd: &[u8]) -> Option<&[u8]> {
    let rest = cmd.strip_prefix(b"*1\r\n$")?.strip_suffix(b"\r\n")?;
    let nl = rest.windows(2).position(|w| w == b"\r\n")?;
    let word = &rest[nl + 2..];
    (rest[..nl] == *word.len().to_string().as_bytes()).then_some(word)
}

/// `REPLCONF GETACK <anything>`, the primary asking for an acknowledgement.
fn is_getack(cmd: &[u8]) -> bool {
    const PREFIX: &[u8] = b"*3\r\n$8\r\nREPLCONF\r\n$6\r\nGETACK\r\n";
    cmd.len() >= PREFIX.len() && cmd[..PREFIX.len()].eq_ignore_ascii_case(PREFIX)
}
