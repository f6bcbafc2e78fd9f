//! Upstream replies: `walrus::resp::ReplyScanner` (RESP2 and RESP3, which the proxy relays
//! without decoding), the control plane's decoder of the frames it delimits
//! (`walrus::upstream::client::decode_reply`), and what the proxy reads of a message to hold
//! a notification (`walrus::proxy::notices::names`).
//!
//! Input: one byte of limits ([`limits`]), one byte of reads ([`super::reads`]), then the
//! bytes Valkey sends. Checked: no panic; the frames, those refused for a limit (then
//! skipped, as a connection's reader does), and whether the stream fails are the same however
//! the bytes arrive; no frame exceeds `max_reply_bytes`; an incomplete frame never holds more
//! than `max_reply_bytes` in the buffer, nor a refused one more than a line; and where the
//! redis-protocol crate's decoders take a frame the scanner delimited, they end it where the
//! scanner did.

use bytes::{Bytes, BytesMut};
use walrus::resp::{Limits, ReplyScanner};

pub fn run(data: &[u8]) {
    let mut input = super::Input::new(data);
    let limits = limits(input.byte());
    let seed = input.byte();
    let bytes = input.rest();
    check(bytes, &super::reads(bytes.len(), seed), limits);
}

/// The defaults when the top bit is clear; otherwise the minimums `config::validate`
/// accepts (depth 8, 1 KiB) and a little above.
pub fn limits(b: u8) -> Limits {
    if b & 0x80 == 0 {
        return Limits::default();
    }
    Limits {
        max_reply_depth: 8 + usize::from(b & 0x7),
        max_reply_bytes: 1024 + usize::from((b >> 3) & 0xf) * 64,
        ..Limits::default()
    }
}

/// The frames of a stream, and whether it ended in an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Each frame; an empty one stands for a frame refused for a limit, and skipped.
    pub frames: Vec<Bytes>,
    /// `Ok(bytes of the incomplete frame)` or `Err(())`: which error may depend on the reads
    /// (one read shows a bad line, a shorter one only that the frame is already too large).
    pub end: Result<Bytes, ()>,
}

pub fn check(bytes: &[u8], reads: &[std::ops::Range<usize>], limits: Limits) -> Outcome {
    let whole = scan(bytes, &super::at_once(bytes.len()), limits);
    let pieces = scan(bytes, reads, limits);
    assert_eq!(whole, pieces, "the frames depend on how the bytes arrive");
    for f in whole.frames.iter().filter(|f| !f.is_empty()) {
        assert!(
            f.len() <= limits.max_reply_bytes,
            "a frame of {} bytes",
            f.len()
        );
        agrees_with_decoders(f);
    }
    whole
}

/// Feeds `bytes` in `reads`, splitting off every frame each read completes and skipping
/// each one refused for a limit, as a connection's reader does.
pub fn scan(bytes: &[u8], reads: &[std::ops::Range<usize>], limits: Limits) -> Outcome {
    let mut scanner = ReplyScanner::new(limits);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for read in reads {
        buf.extend_from_slice(&bytes[read.clone()]);
        loop {
            if scanner.discarding() {
                match scanner.discard(&buf) {
                    Ok((n, done)) => {
                        assert!(n <= buf.len(), "discards {n} bytes of {}", buf.len());
                        bytes::Buf::advance(&mut buf, n);
                        if done {
                            continue;
                        }
                        // What is kept of a refused frame: the start of a line.
                        assert!(
                            buf.len() <= 64 << 10,
                            "a refused frame holds {} bytes",
                            buf.len()
                        );
                        break;
                    }
                    Err(_) => return failed(frames),
                }
            }
            match scanner.scan(&buf) {
                Ok(Some(n)) => {
                    assert!(
                        n > 0 && n <= buf.len(),
                        "a frame of {n} bytes in {}",
                        buf.len()
                    );
                    frames.push(buf.split_to(n).freeze());
                }
                Ok(None) => break,
                Err(e) if e.is_limit() => frames.push(Bytes::new()),
                Err(_) => return failed(frames),
            }
        }
        assert!(
            scanner.discarding() || buf.len() <= limits.max_reply_bytes,
            "an incomplete reply holds {} bytes, past max_reply_bytes = {}",
            buf.len(),
            limits.max_reply_bytes
        );
    }
    Outcome {
        frames,
        end: Ok(buf.freeze()),
    }
}

/// A stream that broke. A frame refused just before is not told apart: whether its size
/// or the broken bytes are found first depends on how they arrive.
fn failed(mut frames: Vec<Bytes>) -> Outcome {
    while frames.last().is_some_and(Bytes::is_empty) {
        frames.pop();
    }
    Outcome {
        frames,
        end: Err(()),
    }
}

/// A frame the scanner delimited, decoded whole (RESP2, as walrus's control connections do,
/// and RESP3): no panic, and a decoder that takes it takes exactly its bytes.
fn agrees_with_decoders(frame: &[u8]) {
    let _ = walrus::upstream::client::decode_reply(frame);
    let _ = walrus::proxy::notices::names(&Bytes::copy_from_slice(frame));
    if let Ok(Some((_, n))) = redis_protocol::resp2::decode::decode(frame) {
        assert_eq!(n, frame.len(), "RESP2 decoder ends {frame:?} elsewhere");
    }
    if let Ok(Some((_, n))) = redis_protocol::resp3::decode::complete::decode(frame) {
        assert_eq!(n, frame.len(), "RESP3 decoder ends {frame:?} elsewhere");
    }
}
