//! Cutting the replication stream into journal entries.
//!
//! An entry is a run of whole commands, exactly as Valkey sent them: the entry's bytes are
//! the stream's bytes, so the replication offset at the end of an entry is the offset at its
//! start plus its length. Cuts fall only between commands, never inside a MULTI ... EXEC
//! block (a transaction, or a script's effects, is applied whole or not at all on replay).
//! PING and REPLCONF GETACK from the primary are part of the stream and count toward the
//! offset like everything else; replay skips them.
//!
//! One entry carries every complete command available at once (bounded by
//! `max_entry_bytes`, unless a single transaction is larger), so a busy stream becomes few,
//! large entries rather than one per command.

use crate::resp::{Limits, ReplyScanner, ScanError};
use bytes::{Bytes, BytesMut};

/// Whole commands from the stream, and the offset right after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEntry {
    pub payload: Bytes,
    /// Replication offset of the entry's last byte.
    pub offset_end: u64,
    /// The primary asked for an acknowledgement (REPLCONF GETACK) in this entry.
    pub getack: bool,
}

#[derive(Debug)]
pub struct StreamFramer {
    scanner: ReplyScanner,
    /// Offset of the last byte already emitted.
    offset: u64,
    /// Bytes at the front of the buffer that form complete commands.
    scanned: usize,
    /// Of those, the bytes that end outside a transaction: where an entry may end.
    boundary: usize,
    in_multi: bool,
    getack: bool,
    max_entry_bytes: usize,
}

impl StreamFramer {
    /// `offset`: the replication offset of the byte before the stream's first byte (the
    /// FULLRESYNC offset, or the offset a partial resync continues from).
    pub fn new(offset: u64, limits: Limits, max_entry_bytes: usize) -> Self {
        StreamFramer {
            scanner: ReplyScanner::new(limits),
            offset,
            scanned: 0,
            boundary: 0,
            in_multi: false,
            getack: false,
            max_entry_bytes,
        }
    }

    /// The offset of the last byte emitted in an entry.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Takes the complete commands at the front of `buf` as one entry, if there are any.
    pub fn next_entry(&mut self, buf: &mut BytesMut) -> Result<Option<StreamEntry>, ScanError> {
        while self.boundary < self.max_entry_bytes || self.boundary == 0 {
            let Some(n) = self.scanner.scan(&buf[self.scanned..])? else {
                break;
            };
            let cmd = &buf[self.scanned..self.scanned + n];
            if is_command(cmd, b"MULTI") {
                self.in_multi = true;
            } else if is_command(cmd, b"EXEC") {
                self.in_multi = false;
            } else if is_getack(cmd) {
                self.getack = true;
            }
            self.scanned += n;
            if !self.in_multi {
                self.boundary = self.scanned;
            }
        }
        if self.boundary == 0 {
            return Ok(None);
        }
        let payload = buf.split_to(self.boundary).freeze();
        self.scanned -= self.boundary;
        self.boundary = 0;
        self.offset += payload.len() as u64;
        let getack = std::mem::take(&mut self.getack);
        Ok(Some(StreamEntry {
            payload,
            offset_end: self.offset,
            getack,
        }))
    }
}

/// Whether a frame is the one-word command `word` (`*1\r\n$<len>\r\n<word>\r\n`).
/// Runs on every frame of the stream: any frame but a one-element array is turned away by
/// the prefix check, before anything allocates.
fn is_command(frame: &[u8], word: &[u8]) -> bool {
    let Some(body) = frame
        .strip_prefix(b"*1\r\n$")
        .and_then(|f| f.strip_suffix(b"\r\n"))
    else {
        return false;
    };
    let Some(split) = body.len().checked_sub(word.len()) else {
        return false;
    };
    let (len, w) = body.split_at(split);
    len.strip_suffix(b"\r\n")
        .is_some_and(|digits| digits == word.len().to_string().as_bytes())
        && w.eq_ignore_ascii_case(word)
}

fn is_getack(frame: &[u8]) -> bool {
    const PREFIX: &[u8] = b"*3\r\n$8\r\nREPLCONF\r\n$6\r\nGETACK\r\n";
    frame.len() >= PREFIX.len() && frame[..PREFIX.len()].eq_ignore_ascii_case(PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::write::command;

    #[test]
    fn one_word_commands_are_recognized_exactly() {
        assert!(is_command(b"*1\r\n$5\r\nMULTI\r\n", b"MULTI"));
        assert!(is_command(b"*1\r\n$5\r\nmulti\r\n", b"MULTI"));
        assert!(!is_command(b"*1\r\n$4\r\nEXEC\r\n", b"MULTI"));
        assert!(!is_command(b"*1\r\n$6\r\nMULTI\r\n", b"MULTI"));
        assert!(!is_command(b"*1\r\n$5\r\nXMULTI\r\n", b"MULTI"));
        assert!(!is_command(b"*2\r\n$5\r\nMULTI\r\n$1\r\nx\r\n", b"MULTI"));
        assert!(!is_command(b"*1\r\n$\r\n", b"MULTI"));
        assert!(!is_command(b"", b"EXEC"));
    }

    fn feed(framer: &mut StreamFramer, buf: &mut BytesMut, bytes: &[u8]) -> Vec<StreamEntry> {
        buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(e) = framer.next_entry(buf).unwrap() {
            out.push(e);
        }
        out
    }

    #[test]
    fn entries_end_on_command_boundaries_and_keep_transactions_whole() {
        let mut f = StreamFramer::new(100, Limits::default(), 1 << 20);
        let mut buf = BytesMut::new();
        let set = command(["SET", "k", "v"]);
        let multi = command(["MULTI"]);
        let exec = command(["EXEC"]);
        let incr = command(["INCR", "n"]);
        // A command split across reads yields nothing until it is whole.
        assert!(feed(&mut f, &mut buf, &set[..5]).is_empty());
        let e = feed(&mut f, &mut buf, &set[5..]);
        assert_eq!(
            e,
            vec![StreamEntry {
                payload: set.clone(),
                offset_end: 100 + set.len() as u64,
                getack: false
            }]
        );
        // An open transaction is held back until EXEC.
        let mut bytes = multi.to_vec();
        bytes.extend_from_slice(&incr);
        assert!(feed(&mut f, &mut buf, &bytes).is_empty());
        let e = feed(&mut f, &mut buf, &exec);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].payload.len(), multi.len() + incr.len() + exec.len());
        assert_eq!(
            e[0].offset_end,
            100 + (set.len() + multi.len() + incr.len() + exec.len()) as u64
        );
        // Commands after a transaction in the same read join the entry.
        let getack = command(["REPLCONF", "GETACK", "*"]);
        let e = feed(&mut f, &mut buf, &getack);
        assert!(e[0].getack);
        assert_eq!(f.offset(), e[0].offset_end);
    }

    #[test]
    fn large_streams_are_cut_near_the_entry_size() {
        let mut f = StreamFramer::new(0, Limits::default(), 64);
        let mut buf = BytesMut::new();
        let set = command(["SET", "key", "0123456789"]);
        let all: Vec<u8> = std::iter::repeat_n(set.to_vec(), 20).flatten().collect();
        let entries = feed(&mut f, &mut buf, &all);
        assert!(entries.len() > 1);
        assert!(entries
            .iter()
            .all(|e| e.payload.len() % set.len() == 0 && e.payload.len() <= 64 + set.len()));
        assert_eq!(entries.last().unwrap().offset_end, all.len() as u64);
    }
}
