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
//! `entry_bytes`, unless a single transaction is larger), so a busy stream becomes few,
//! large entries rather than one per command.
//!
//! The journal refuses an entry larger than its `max_entry_bytes`; the link then takes a
//! full resync, whose RDB covers what the stream could not journal. The framer keeps to that
//! limit: a command or transaction that would take an entry past it starts an entry of its
//! own, and one that alone exceeds it is refused as the journal would refuse it, as soon as
//! its bytes show it (a transaction never closed must not hold the buffer growing).

use crate::journal::JournalError;
use crate::resp::{Limits, ReplyScanner};
use bytes::{Bytes, BytesMut};

use super::error::LinkError;

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
    /// Of those, the bytes the next entry takes: whole commands and transactions.
    boundary: usize,
    /// Where the command or transaction being scanned starts (after `boundary` when the
    /// last one completed would take the entry past `max_entry_bytes`).
    unit_start: usize,
    in_multi: bool,
    /// A GETACK before `boundary`, and one scanned after it (in a unit not yet taken).
    getack: bool,
    getack_pending: bool,
    /// A scan error found after complete commands: reported once they are emitted.
    failed: Option<crate::resp::ScanError>,
    entry_bytes: usize,
    max_entry_bytes: usize,
}

impl StreamFramer {
    /// `offset`: the replication offset of the byte before the stream's first byte (the
    /// FULLRESYNC offset, or the offset a partial resync continues from). Entries are cut
    /// at about `entry_bytes`, and none exceeds `max_entry_bytes` (the journal's limit).
    pub fn new(offset: u64, limits: Limits, entry_bytes: usize, max_entry_bytes: u64) -> Self {
        StreamFramer {
            scanner: ReplyScanner::new(limits),
            offset,
            scanned: 0,
            boundary: 0,
            unit_start: 0,
            in_multi: false,
            getack: false,
            getack_pending: false,
            failed: None,
            entry_bytes,
            max_entry_bytes: usize::try_from(max_entry_bytes).unwrap_or(usize::MAX),
        }
    }

    /// The offset of the last byte emitted in an entry.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Takes the complete commands at the front of `buf` as one entry, if there are any.
    /// Fails on bytes that are not RESP, and with [`JournalError::EntryTooLarge`] on a
    /// command or transaction larger than the journal takes.
    pub fn next_entry(&mut self, buf: &mut BytesMut) -> Result<Option<StreamEntry>, LinkError> {
        while self.failed.is_none() {
            // A command or transaction just completed: it joins the entry if it fits.
            if !self.in_multi && self.scanned > self.unit_start {
                if self.scanned > self.max_entry_bytes {
                    if self.boundary > 0 {
                        break; // it starts the next entry
                    }
                    return Err(self.too_large(self.scanned));
                }
                self.boundary = self.scanned;
                self.unit_start = self.scanned;
                self.getack |= std::mem::take(&mut self.getack_pending);
            }
            if self.boundary >= self.entry_bytes {
                break;
            }
            let n = match self.scanner.scan(&buf[self.scanned..]) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                // Whatever complete commands precede the bad bytes are journaled first.
                Err(e) if self.boundary > 0 => {
                    self.failed = Some(e);
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            let cmd = &buf[self.scanned..self.scanned + n];
            if is_command(cmd, b"MULTI") {
                self.in_multi = true;
            } else if is_command(cmd, b"EXEC") {
                self.in_multi = false;
            } else if is_getack(cmd) {
                self.getack_pending = true;
            }
            self.scanned += n;
        }
        if self.boundary == 0 {
            if let Some(e) = self.failed.take() {
                return Err(e.into());
            }
            // What waits is one command or transaction not yet complete: already too large,
            // it can only grow.
            let waiting = buf.len() - self.unit_start;
            if waiting > self.max_entry_bytes {
                return Err(self.too_large(waiting));
            }
            return Ok(None);
        }
        let payload = buf.split_to(self.boundary).freeze();
        self.scanned -= self.boundary;
        self.unit_start -= self.boundary;
        self.boundary = 0;
        self.offset += payload.len() as u64;
        let getack = std::mem::take(&mut self.getack);
        Ok(Some(StreamEntry {
            payload,
            offset_end: self.offset,
            getack,
        }))
    }

    /// The journal's refusal of a command or transaction of at least `len` bytes.
    fn too_large(&self, len: usize) -> LinkError {
        LinkError::Journal(JournalError::EntryTooLarge {
            len_bytes: len as u64,
            max_entry_bytes: self.max_entry_bytes as u64,
        })
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
        let mut f = StreamFramer::new(100, Limits::default(), 1 << 20, 1 << 20);
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

    /// Found by fuzzing (fuzz/regressions/stream/entry-before-a-protocol-error): the
    /// commands before bad bytes were journaled or not depending on how the reads fell.
    #[test]
    fn commands_before_bad_bytes_are_emitted_first() {
        let set = command(["SET", "k", "v"]);
        let mut f = StreamFramer::new(0, Limits::default(), 1 << 20, 1 << 20);
        let mut buf = BytesMut::from(&[&set[..], b"?junk\r\n"].concat()[..]);
        assert_eq!(f.next_entry(&mut buf).unwrap().unwrap().payload, set);
        assert!(matches!(f.next_entry(&mut buf), Err(LinkError::Stream(_))));
    }

    #[test]
    fn getack_belongs_to_the_entry_that_holds_it() {
        let set = command(["SET", "k", "v"]);
        let getack = command(["REPLCONF", "GETACK", "*"]);
        let (multi, exec) = (command(["MULTI"]), command(["EXEC"]));
        let mut f = StreamFramer::new(0, Limits::default(), 1 << 20, 1 << 20);
        let mut buf = BytesMut::new();
        // The transaction is still open: its GETACK is not the first entry's.
        let first = feed(&mut f, &mut buf, &[&set[..], &multi, &getack].concat());
        assert_eq!((first.len(), first[0].getack), (1, false));
        let second = feed(&mut f, &mut buf, &exec);
        assert_eq!((second.len(), second[0].getack), (1, true));
    }

    /// The journal refuses entries over its limit: none is made, and what cannot fit is
    /// refused without waiting for it whole (a transaction never closed grew the buffer
    /// without bound).
    #[test]
    fn entries_keep_to_the_journals_limit() {
        let set = command(["SET", "k", "0123456789"]);
        let multi = command(["MULTI"]);
        let max = 3 * set.len() as u64;
        // Three commands fit, a fourth starts the next entry.
        let mut f = StreamFramer::new(0, Limits::default(), 1 << 20, max);
        let mut buf = BytesMut::new();
        let four = feed(&mut f, &mut buf, &set.repeat(4));
        let sizes: Vec<usize> = four.iter().map(|e| e.payload.len()).collect();
        assert_eq!(sizes, [3 * set.len(), set.len()]);
        // A transaction that outgrows the limit, complete or not.
        for close in [true, false] {
            let mut f = StreamFramer::new(0, Limits::default(), 1 << 20, max);
            let mut tx = [&multi[..], &set.repeat(3)].concat();
            if close {
                tx.extend_from_slice(&command(["EXEC"]));
            }
            let mut buf = BytesMut::from(&tx[..]);
            let err = f.next_entry(&mut buf).unwrap_err();
            assert!(
                matches!(err, LinkError::Journal(JournalError::EntryTooLarge { .. })),
                "{err}"
            );
        }
    }

    #[test]
    fn large_streams_are_cut_near_the_entry_size() {
        let mut f = StreamFramer::new(0, Limits::default(), 64, 1 << 20);
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
