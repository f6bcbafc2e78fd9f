//! The replication stream after a checkpoint, read as the commands it is made of: each with
//! the offsets it spans and the transaction it belongs to. [`super::export`] keeps some of
//! them; [`super::pitr`] finds where a point-in-time restore may stop: between commands,
//! never inside one, and never inside a transaction (MULTI ... EXEC, which is also how
//! Valkey propagates a script's effects), which a replay applies whole or not at all.
//!
//! The stream is parsed with the client request parser: it is made of the same arrays of
//! bulk strings. A command may continue from one journal slice into the next (it waits),
//! though the journal cuts its entries on command boundaries.

use super::DataDirError;
use crate::resp::{Limits, Request, RequestParser};
use bytes::BytesMut;

/// One command of the stream.
#[derive(Debug, Clone)]
pub struct Command {
    /// Replication offsets: of its first byte, and of the byte after it.
    pub start: u64,
    pub end: u64,
    pub request: Request,
    /// Where the transaction it is part of begins (its MULTI's `start`), for MULTI, the
    /// commands it queues and EXEC; `None` outside one.
    pub transaction: Option<u64>,
}

impl Command {
    /// The name, as sent (any case).
    pub fn name(&self) -> &[u8] {
        self.request.name()
    }

    /// Where a cut that leaves this command out falls: right before it, or before its
    /// transaction's MULTI.
    pub fn cut_before(&self) -> u64 {
        self.transaction.unwrap_or(self.start)
    }

    /// Whether a cut may fall right after it: outside a transaction, or after its EXEC.
    pub fn cut_after(&self) -> bool {
        self.transaction.is_none() || self.is(b"EXEC")
    }

    fn is(&self, name: &[u8]) -> bool {
        self.name().eq_ignore_ascii_case(name)
    }
}

/// Cuts the bytes fed to it into [`Command`]s.
pub struct Commands {
    parser: RequestParser,
    pending: BytesMut,
    /// Replication offset of the first byte not yet consumed (the start of `pending`).
    offset: u64,
    /// The open transaction's MULTI, if any.
    transaction: Option<u64>,
}

impl Commands {
    /// The stream from replication offset `offset` on.
    pub fn new(offset: u64) -> Commands {
        Commands {
            // A command is as large as Valkey accepted it; the journal's entry limit already
            // bounded what was stored.
            parser: RequestParser::new(Limits {
                max_bulk_bytes: usize::MAX / 2,
                max_array_len: usize::MAX / 2,
                ..Limits::default()
            }),
            pending: BytesMut::new(),
            offset,
            transaction: None,
        }
    }

    /// Hands `each` the whole commands `bytes` completes; stops at the first error, `each`'s
    /// or the stream's (what is not a command), naming the offset.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        each: impl FnMut(Command) -> Result<(), String>,
    ) -> Result<(), DataDirError> {
        self.take(bytes, each).map_err(DataDirError::Failed)
    }

    /// [`feed`](Self::feed), saying what in the stream, or `each`, failed.
    fn take(
        &mut self,
        bytes: &[u8],
        mut each: impl FnMut(Command) -> Result<(), String>,
    ) -> Result<(), String> {
        self.pending.extend_from_slice(bytes);
        loop {
            // The parser would take anything else for an inline command.
            if self.pending.first().is_some_and(|&b| b != b'*') {
                return Err(format!(
                    "the journal's stream holds something other than a command at replication offset {}: {:?}",
                    self.offset,
                    String::from_utf8_lossy(&self.pending[..self.pending.len().min(64)])
                ));
            }
            let parsed = self.parser.next(&mut self.pending).map_err(|e| {
                format!(
                    "the journal's stream is not RESP at replication offset {}: {}",
                    self.offset, e.0
                )
            })?;
            let Some(request) = parsed else {
                return Ok(());
            };
            let start = self.offset;
            self.offset += request.raw.len() as u64;
            let name = request.name();
            if name.eq_ignore_ascii_case(b"MULTI") {
                self.transaction = Some(start);
            }
            let transaction = self.transaction;
            if name.eq_ignore_ascii_case(b"EXEC") {
                self.transaction = None;
            }
            each(Command {
                start,
                end: self.offset,
                request,
                transaction,
            })?;
        }
    }

    /// The stream must end after a whole command.
    pub fn finish(&self) -> Result<(), DataDirError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        Err(DataDirError::Failed(format!(
            "the journal's stream ends inside a command ({} bytes from replication offset {})",
            self.pending.len(),
            self.offset
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::write::command;

    #[test]
    fn commands_carry_their_offsets_and_transaction_across_slices() {
        let set = command(["SET", "k", "v\r\n*1\r\n$4\r\nEXEC\r\n"]);
        let (multi, exec) = (command(["multi"]), command(["EXEC"]));
        let flush = command(["FLUSHALL"]);
        let stream = [&set[..], &multi, &flush, &set, &exec, &flush].concat();
        let mut want = Vec::new();
        let mut at = 100u64;
        let mut tx = None;
        for (c, in_tx) in [
            (&set, false),
            (&multi, true),
            (&flush, true),
            (&set, true),
            (&exec, true),
            (&flush, false),
        ] {
            if c == &multi {
                tx = Some(at);
            }
            want.push((at, at + c.len() as u64, if in_tx { tx } else { None }));
            at += c.len() as u64;
        }
        for cut in 0..=stream.len() {
            let mut cmds = Commands::new(100);
            let mut got = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                cmds.feed(part, |c| {
                    got.push((c.start, c.end, c.transaction, c.cut_after(), c.cut_before()));
                    Ok(())
                })
                .unwrap();
            }
            cmds.finish().unwrap();
            let seen: Vec<_> = got.iter().map(|g| (g.0, g.1, g.2)).collect();
            assert_eq!(seen, want, "cut at {cut}");
            let after: Vec<_> = got.iter().map(|g| g.3).collect();
            assert_eq!(after, [true, false, false, false, true, true]);
            assert_eq!(got[2].4, 100 + set.len() as u64, "before the MULTI");
            assert_eq!(got[5].4, got[5].0);
        }
        let mut cmds = Commands::new(0);
        cmds.feed(&set[..set.len() - 2], |_| Ok(())).unwrap();
        assert!(cmds
            .finish()
            .unwrap_err()
            .to_string()
            .contains("ends inside a command"));
    }

    #[test]
    fn what_is_not_a_command_is_refused_with_its_offset() {
        let mut cmds = Commands::new(7);
        let err = cmds.feed(b"+OK\r\n", |_| Ok(())).unwrap_err().to_string();
        assert!(err.contains("offset 7"), "{err}");
    }
}
