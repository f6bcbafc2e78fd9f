//! Encoding the few frames walrus writes itself: its own commands and its own replies.

use bytes::{BufMut, Bytes, BytesMut};

/// Encodes a command as a RESP array of bulk strings.
pub fn command<I, A>(args: I) -> Bytes
where
    I: IntoIterator<Item = A>,
    A: AsRef<[u8]>,
{
    let args: Vec<A> = args.into_iter().collect();
    let mut out =
        BytesMut::with_capacity(16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>());
    out.put_u8(b'*');
    put_decimal(&mut out, args.len() as i64);
    for a in &args {
        bulk_into(&mut out, a.as_ref());
    }
    out.freeze()
}

/// Appends `$<len>\r\n<data>\r\n`.
pub fn bulk_into(out: &mut BytesMut, data: &[u8]) {
    out.put_u8(b'$');
    put_decimal(out, data.len() as i64);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// An error reply. `msg` must not contain CR or LF; it is written after `-`.
pub fn error(msg: &str) -> Bytes {
    debug_assert!(!msg.contains(['\r', '\n']));
    let mut out = BytesMut::with_capacity(msg.len() + 3);
    out.put_u8(b'-');
    out.extend_from_slice(msg.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.freeze()
}

pub fn simple(msg: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(msg.len() + 3);
    out.put_u8(b'+');
    out.extend_from_slice(msg.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.freeze()
}

/// A bulk string reply, or the null bulk of the client's protocol when `None`.
pub fn bulk_or_null(data: Option<&[u8]>, resp3: bool) -> Bytes {
    match data {
        Some(d) => {
            let mut out = BytesMut::with_capacity(d.len() + 16);
            bulk_into(&mut out, d);
            out.freeze()
        }
        None if resp3 => Bytes::from_static(b"_\r\n"),
        None => Bytes::from_static(b"$-1\r\n"),
    }
}

pub const OK: &[u8] = b"+OK\r\n";

fn put_decimal(out: &mut BytesMut, n: i64) {
    use std::fmt::Write;
    // Writing into BytesMut cannot fail.
    let _ = write!(out, "{n}\r\n");
}
