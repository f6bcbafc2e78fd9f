//! Client requests (`walrus::resp::RequestParser`), RESP arrays and inline commands.
//!
//! Input: one byte of limits ([`limits`]), one byte of reads ([`super::reads`]), then the
//! bytes a client sends. Checked: the parser never panics; the requests and the final
//! outcome (an error and its reply, or the bytes still waiting) are the same whether the
//! bytes arrive at once or in pieces; every request is well formed, within the limits, and
//! reads back as itself; an error's reply is one RESP error line; and while a request is
//! incomplete, what the parser keeps buffered (and asks to reserve) is bounded by the limits.

use bytes::{Bytes, BytesMut};
use walrus::resp::{Limits, ReplyScanner, RequestParser};

pub fn run(data: &[u8]) {
    let mut input = super::Input::new(data);
    let limits = limits(input.byte());
    let seed = input.byte();
    let bytes = input.rest();
    check(bytes, &super::reads(bytes.len(), seed), limits);
}

/// Valkey's defaults when the top bit is clear; otherwise small limits (at the minimums
/// `config::validate` accepts and a little above), so that short inputs reach them.
pub fn limits(b: u8) -> Limits {
    if b & 0x80 == 0 {
        return Limits::default();
    }
    Limits {
        max_bulk_bytes: 1 + usize::from(b & 0x7) * 9,
        max_array_len: 1 + usize::from((b >> 3) & 0x3) * 3,
        max_inline_bytes: 16 + usize::from((b >> 5) & 0x3) * 24,
        ..Limits::default()
    }
}

/// One request as the parser returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub raw: Bytes,
    pub args: Vec<Bytes>,
}

/// The requests of a stream, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub requests: Vec<Parsed>,
    /// `Ok(bytes still buffered)` or `Err(the error reply)`.
    pub end: Result<Bytes, Bytes>,
}

/// Runs the checks on `bytes`, arriving in `reads`.
pub fn check(bytes: &[u8], reads: &[std::ops::Range<usize>], limits: Limits) -> Outcome {
    let whole = parse(bytes, &super::at_once(bytes.len()), limits);
    let pieces = parse(bytes, reads, limits);
    assert_eq!(whole, pieces, "the requests depend on how the bytes arrive");
    for r in &whole.requests {
        check_request(r, limits);
    }
    if let Err(reply) = &whole.end {
        assert!(reply.starts_with(b"-ERR Protocol error: "), "{reply:?}");
        assert_one_line(reply);
    }
    whole
}

/// Feeds `bytes` in `reads`, taking every request each read completes, as a session does.
pub fn parse(bytes: &[u8], reads: &[std::ops::Range<usize>], limits: Limits) -> Outcome {
    let mut parser = RequestParser::new(limits);
    let mut buf = BytesMut::new();
    let mut requests = Vec::new();
    for read in reads {
        buf.extend_from_slice(&bytes[read.clone()]);
        loop {
            match parser.next(&mut buf) {
                Ok(Some(r)) => requests.push(Parsed {
                    raw: r.raw,
                    args: r.args,
                }),
                Ok(None) => break,
                Err(e) => {
                    return Outcome {
                        requests,
                        end: Err(e.reply()),
                    }
                }
            }
        }
        let bound = pending_bound(limits);
        assert!(
            buf.len() <= bound && parser.bytes_wanted() <= bound,
            "an incomplete request keeps {} bytes and wants {}, past the {bound} its limits allow",
            buf.len(),
            parser.bytes_wanted()
        );
    }
    Outcome {
        requests,
        end: Ok(buf.freeze()),
    }
}

/// The most an incomplete request may hold: a count line, then for each argument a length
/// line and the bulk with its CRLF (lines are bounded by `max_inline_bytes`).
pub fn pending_bound(l: Limits) -> usize {
    let line = l.max_inline_bytes + 2;
    line + l.max_array_len * (line + l.max_bulk_bytes + 2)
}

fn check_request(r: &Parsed, limits: Limits) {
    assert!(!r.args.is_empty(), "a request without a command name");
    assert!(
        r.args.len() <= limits.max_array_len,
        "{} arguments",
        r.args.len()
    );
    // An inline command's arguments are bounded by its line instead.
    let longest = limits.max_bulk_bytes.max(limits.max_inline_bytes);
    for a in &r.args {
        assert!(a.len() <= longest, "an argument of {} bytes", a.len());
    }
    // What is forwarded upstream is one RESP array of exactly these arguments: parsed again,
    // it is the same request, whole.
    let again = parse(&r.raw, &super::at_once(r.raw.len()), Limits::default());
    assert_eq!(again.end, Ok(Bytes::new()), "raw {:?}", r.raw);
    assert_eq!(again.requests.len(), 1, "raw {:?}", r.raw);
    assert_eq!(again.requests[0].args, r.args);
    assert_eq!(r.raw[0], b'*');
}

/// `reply` is exactly one RESP simple line (`-...\r\n`): a client reads it as one reply.
pub fn assert_one_line(reply: &[u8]) {
    assert!(reply.ends_with(b"\r\n"), "{reply:?}");
    let body = &reply[..reply.len() - 2];
    assert!(
        !body.contains(&b'\r') && !body.contains(&b'\n'),
        "a line break inside the reply {reply:?}"
    );
    let mut s = ReplyScanner::new(Limits::default());
    assert_eq!(s.scan(reply), Ok(Some(reply.len())), "{reply:?}");
}
