//! A restore sends Valkey data, not messages.
//!
//! Valkey propagates `PUBLISH` and `SPUBLISH` to its replicas (so that their subscribers get
//! the message too), so the journal holds every message ever published. Replayed, they would
//! reach whoever subscribes to the restored Valkey: messages published long ago, once, to
//! other subscribers. Valkey's own AOF never holds them.
//!
//! The stream a restore sends must keep its length, though: Valkey counts every byte of it
//! in its replication offset, and the replica link continues at the journal's end. So each
//! message becomes as many bare newlines as it had bytes. A primary may send its replica
//! newlines (Valkey's own do, to keep a link alive while they save an RDB); the replica
//! skips them and counts them in its offset.

use crate::resp::{Limits, ReplyScanner};
use bytes::{Bytes, BytesMut};

/// Whether a command of the stream delivers a message to subscribers.
pub fn is_message(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"PUBLISH") || name.eq_ignore_ascii_case(b"SPUBLISH")
}

/// The name of the command in `frame` (`*<n>\r\n$<len>\r\n<name>\r\n...`).
fn name_of(frame: &[u8]) -> Option<&[u8]> {
    let rest = &frame[frame.iter().position(|&b| b == b'\n')? + 1..];
    let rest = rest.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let len: usize = std::str::from_utf8(rest[..nl].strip_suffix(b"\r")?)
        .ok()?
        .parse()
        .ok()?;
    rest.get(nl + 1..nl + 1 + len)
}

/// `slice` (whole commands, as the [chain](super::chain) hands them over) with every message
/// blanked out, and how many there were. Returned as it is when it holds none.
pub fn blank(slice: Bytes) -> (Bytes, u64) {
    // A command is as large as Valkey accepted it; the journal's entry limit bounded it.
    let mut scanner = ReplyScanner::new(Limits {
        max_bulk_bytes: usize::MAX / 2,
        max_array_len: usize::MAX / 2,
        ..Limits::default()
    });
    let mut found = Vec::new();
    let mut at = 0;
    // A slice holds whole commands; anything the scanner cannot take is left as it is.
    while let Ok(Some(n)) = scanner.scan(&slice[at..]) {
        let frame = &slice[at..at + n];
        if name_of(frame).is_some_and(is_message) {
            found.push(at..at + n);
        }
        at += n;
    }
    if found.is_empty() {
        return (slice, 0);
    }
    let mut out = BytesMut::from(&slice[..]);
    for range in &found {
        out[range.clone()].fill(b'\n');
    }
    (out.freeze(), found.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::write::command;

    #[test]
    fn messages_become_newlines_of_the_same_length() {
        let set = command(["SET", "k", "PUBLISH inside a value"]);
        let publish = command(["publish", "news", "old"]);
        let spublish = command(["SPUBLISH", "shard", "old"]);
        let multi = command(["MULTI"]);
        let exec = command(["EXEC"]);
        let stream = [&set[..], &multi, &publish, &set, &exec, &spublish].concat();
        let (out, n) = blank(Bytes::from(stream.clone()));
        assert_eq!(n, 2);
        assert_eq!(out.len(), stream.len());
        let newlines = |c: &[u8]| vec![b'\n'; c.len()];
        let want = [
            &set[..],
            &multi,
            &newlines(&publish),
            &set,
            &exec,
            &newlines(&spublish),
        ]
        .concat();
        assert_eq!(&out[..], &want[..]);
    }

    #[test]
    fn a_slice_without_messages_is_handed_back_as_it_is() {
        let set = command(["SET", "k", "v"]);
        let (out, n) = blank(set.clone());
        assert_eq!((out.as_ptr(), n), (set.as_ptr(), 0));
    }
}
