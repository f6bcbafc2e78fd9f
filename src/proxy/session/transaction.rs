//! A client's transaction (MULTI to EXEC or DISCARD, on its session's dedicated connection)
//! as walrus follows it: whether one is open, the dirty-key marks of the writes it queued,
//! whether walrus refused a command while it queued, and the database a SELECT queued in it
//! moves the client to. [`Transaction`] owns that state and its transitions; the session
//! tells it what it sends and what Valkey answers.
//!
//! - It opens when Valkey answers MULTI with `+OK` (MULTI is a barrier: [`Session::multi`]).
//! - A write queued in it marks its keys dirty (every key, once a SELECT is queued: they may
//!   be in any database); the marks ride with EXEC, whose reply shows what it did.
//! - A command walrus refuses while it queues aborts it, as Valkey's own queue-time errors
//!   do: EXEC then runs nothing ([`Session::abort_exec`]).
//! - Whether it ran is EXEC's reply's to say, not what was queued: an array (it ran) moves the
//!   client to the database its last queued SELECT chose; `-EXECABORT`, the nil of a WATCH
//!   that aborted it, any other error, and DISCARD leave the client where it was.
//! - One the client never finishes (it leaves, or sends RESET, AUTH or HELLO) runs nothing:
//!   its marks are released.
//!
//! [`Session::multi`]: super::Session::multi
//! [`Session::abort_exec`]: super::Session::abort_exec

use crate::durability::{Durability, WriteMark};
use crate::proxy::pipeline::TxCmd;
use crate::resp::Request;
use std::sync::Arc;

pub(super) struct Transaction {
    open: bool,
    /// The database the last valid SELECT queued in it chose (one out of range fails when
    /// EXEC runs it, and moves nobody).
    select: Option<u32>,
    /// A SELECT was queued: the keys of its writes may be in any database.
    selects: bool,
    /// Dirty-key marks of the writes queued in it; EXEC carries them.
    marks: Vec<WriteMark>,
    /// walrus refused a command while it queued.
    refused: bool,
    durability: Option<Arc<Durability>>,
}

impl Transaction {
    pub(super) fn new(durability: Option<Arc<Durability>>) -> Transaction {
        Transaction {
            open: false,
            select: None,
            selects: false,
            marks: Vec::new(),
            refused: false,
            durability,
        }
    }

    /// Inside MULTI: what the client sends is queued.
    pub(super) fn is_open(&self) -> bool {
        self.open
    }

    /// Valkey answered MULTI with `reply`.
    pub(super) fn opened(&mut self, reply: &[u8]) {
        self.open = reply == crate::resp::write::OK;
    }

    /// Where `req`, sent on the session's dedicated connection, stands in the transaction.
    pub(super) fn classify(&self, req: &Request) -> TxCmd {
        let n = req.name();
        if !self.open && n.eq_ignore_ascii_case(b"MULTI") {
            TxCmd::Multi
        } else if self.open
            && (n.eq_ignore_ascii_case(b"EXEC") || n.eq_ignore_ascii_case(b"DISCARD"))
        {
            TxCmd::End
        } else if self.open && n.eq_ignore_ascii_case(b"SELECT") {
            TxCmd::SelectInMulti
        } else {
            TxCmd::Other
        }
    }

    /// `SELECT index` is queued (`databases`: Valkey's count of them).
    pub(super) fn queue_select(&mut self, index: Option<&[u8]>, databases: u32) {
        self.selects = true;
        let valid = index
            .and_then(crate::resp::parse_i64)
            .filter(|&d| d >= 0 && d < i64::from(databases));
        if let Some(d) = valid {
            self.select = Some(d as u32);
        }
    }

    /// A SELECT is queued: a write queued from now on may touch any database.
    pub(super) fn selects(&self) -> bool {
        self.selects
    }

    /// A write is queued: its mark rides with EXEC.
    pub(super) fn queue_write(&mut self, mark: WriteMark) {
        self.marks.push(mark);
    }

    /// walrus refused a command while the transaction queued (if one is open).
    pub(super) fn refuse(&mut self) {
        self.refused |= self.open;
    }

    /// walrus refused a command of it: EXEC must run nothing.
    pub(super) fn aborts(&self) -> bool {
        self.refused
    }

    /// The marks EXEC carries.
    pub(super) fn take_marks(&mut self) -> Vec<WriteMark> {
        std::mem::take(&mut self.marks)
    }

    /// EXEC or DISCARD is sent: the transaction is over. Returns the database a queued
    /// SELECT moves the client to, should EXEC's reply say it ran ([`ran`]).
    pub(super) fn end(&mut self) -> Option<u32> {
        let select = self.select;
        self.discard();
        select
    }

    /// The transaction is over and none of it runs: its marks are released.
    pub(super) fn discard(&mut self) {
        let marks = std::mem::take(&mut self.marks);
        if let Some(d) = &self.durability {
            d.cancel_write(marks);
        }
        self.open = false;
        self.select = None;
        self.selects = false;
        self.refused = false;
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        self.discard();
    }
}

/// Whether EXEC's reply says the transaction ran: an array of its commands' replies. An
/// error (`-EXECABORT`, or walrus's own) and the nil of an aborted WATCH (`*-1` in RESP2,
/// `_` in RESP3) say it did not.
pub(super) fn ran(exec_reply: &[u8]) -> bool {
    exec_reply.first() == Some(&b'*') && !exec_reply.starts_with(b"*-1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_ran_only_when_it_answers_an_array() {
        assert!(ran(b"*2\r\n+OK\r\n:1\r\n"));
        assert!(ran(b"*0\r\n"));
        assert!(!ran(b"*-1\r\n"));
        assert!(!ran(b"_\r\n"));
        assert!(!ran(
            b"-EXECABORT Transaction discarded because of previous errors.\r\n"
        ));
        assert!(!ran(b"-ERR walrus: connection to Valkey lost\r\n"));
    }

    #[test]
    fn the_last_valid_select_is_where_exec_moves_the_client() {
        let mut t = Transaction::new(None);
        t.opened(b"+OK\r\n");
        t.queue_select(Some(b"3".as_slice()), 16);
        t.queue_select(Some(b"99".as_slice()), 16);
        t.queue_select(Some(b"x".as_slice()), 16);
        assert!(t.selects());
        assert_eq!(t.end(), Some(3));
        assert!(!t.is_open() && !t.selects());
    }
}
