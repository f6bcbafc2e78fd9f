//! RESP on the wire: what walrus must understand of the bytes it relays.
//!
//! walrus never re-encodes what it forwards. A client's request is split into arguments
//! that point into the bytes read from the socket ([`request`]), and an upstream reply is
//! only *delimited* ([`reply`]): its bytes go back to the client untouched, so RESP3 replies
//! stay Valkey's own. Both parsers are resumable (a large frame arriving in pieces is never
//! re-parsed from its start) and bounded by [`Limits`]; the redis-protocol crate is used
//! where a whole frame is decoded into values, on the control plane ([`crate::upstream::client`]).

pub mod reply;
pub mod request;
pub mod write;

pub use reply::{ReplyScanner, ScanError};
pub use request::{ParseError, Request, RequestParser};

/// Protocol limits, enforced once each, in the parsers. Defaults mirror Valkey's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk string a client may send (Valkey's `proto-max-bulk-len`).
    pub max_bulk_bytes: usize,
    /// Most arguments in one request.
    pub max_array_len: usize,
    /// Largest inline command line (Valkey's PROTO_INLINE_MAX_SIZE).
    pub max_inline_bytes: usize,
    /// Deepest nesting accepted in an upstream reply.
    pub max_reply_depth: usize,
    /// Largest single reply accepted from upstream.
    pub max_reply_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_bytes: 512 << 20,
            max_array_len: 16 << 20,
            max_inline_bytes: 64 << 10,
            max_reply_depth: 128,
            max_reply_bytes: 1 << 30,
        }
    }
}

/// Finds `\r\n` in `buf` starting at `from`, returning the index of `\r`.
#[inline]
pub(crate) fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < buf.len() {
        match buf[i..].iter().position(|&b| b == b'\r') {
            None => return None,
            Some(p) => {
                let at = i + p;
                if at + 1 >= buf.len() {
                    return None;
                }
                if buf[at + 1] == b'\n' {
                    return Some(at);
                }
                i = at + 1;
            }
        }
    }
    None
}

/// Parses a signed decimal as Valkey's `string2ll` does: no sign-only, no leading `+`,
/// no leading zeros (`01`, `-0`), no spaces, no overflow.
pub(crate) fn parse_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    if digits.first() == Some(&b'0') && s != b"0" {
        return None;
    }
    std::str::from_utf8(s)
        .ok()?
        .parse::<i64>()
        .ok()
        .filter(|_| s[0] != b'+')
}
