//! Transactions: MULTI, an RPUSH to each of two lists, EXEC; what their replies say about
//! the two elements. Executed: both acknowledged at the positions EXEC reported. Aborted
//! (-EXECABORT after a command refused while queued, nil after a WATCH fired): neither may
//! ever be seen. Anything else: unknown, but all or nothing, unless MULTI itself was refused
//! (then the pushes ran, if at all, one by one). A transaction may also read the second
//! list between its pushes: a read released with the transaction's replies.

use crate::conn::{cmd, describe, Cmd, Reply};
use crate::history::History;
use crate::keys::list_key;
use crate::workers::{bulks, settle_push};
use redis_protocol::resp2::types::OwnedFrame;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum TxKind {
    Plain,
    /// WATCH its first list first: another worker's append makes EXEC answer nil.
    Watch,
    /// A command refused while queued (wrong arity): EXEC must answer -EXECABORT.
    Refused,
    /// LRANGE of the second list between the pushes: EXEC shows it just before its push.
    WithRead,
}

impl TxKind {
    pub fn name(self) -> &'static str {
        match self {
            TxKind::Plain => "op: transaction",
            TxKind::Watch => "op: transaction with WATCH",
            TxKind::Refused => "op: transaction with a refused command",
            TxKind::WithRead => "op: transaction with a read",
        }
    }
}

/// A transaction as sent: which replies belong to MULTI, its two pushes and its read.
pub struct Tx {
    kind: TxKind,
    /// The element pushed to each list, and the lists.
    elems: [u32; 2],
    keys: [usize; 2],
    /// When it was sent (its elements' send time).
    send_ts: u64,
    multi: usize,
    pushes: [usize; 2],
    read: Option<usize>,
}

impl Tx {
    /// The transaction of `kind` pushing `elems[i]` to list `keys[i]`, and its commands.
    pub fn new(kind: TxKind, elems: [u32; 2], keys: [usize; 2], send_ts: u64) -> (Tx, Vec<Cmd>) {
        let mut cmds = Vec::new();
        let push = |i: usize| cmd(&["RPUSH", &list_key(keys[i]), &format!("e{}", elems[i])]);
        if kind == TxKind::Watch {
            cmds.push(cmd(&["WATCH", &list_key(keys[0])]));
        }
        let multi = cmds.len();
        cmds.push(cmd(&["MULTI"]));
        cmds.push(push(0));
        let mut read = None;
        match kind {
            // Wrong arity: Valkey refuses it while queueing, as walrus must let it.
            TxKind::Refused => cmds.push(cmd(&["RPUSH", &list_key(keys[0])])),
            TxKind::WithRead => {
                read = Some(cmds.len());
                cmds.push(cmd(&["LRANGE", &list_key(keys[1]), "0", "-1"]));
            }
            TxKind::Plain | TxKind::Watch => {}
        }
        cmds.push(push(1));
        cmds.push(cmd(&["EXEC"]));
        let pushes = [multi + 1, cmds.len() - 2];
        let tx = Tx {
            kind,
            elems,
            keys,
            send_ts,
            multi,
            pushes,
            read,
        };
        (tx, cmds)
    }

    /// Settles the transaction's elements from its replies; true when it ran cleanly
    /// (executed, or aborted as intended).
    pub fn settle(&self, h: &mut History, cmds: &[Cmd], mut replies: Vec<Reply>) -> bool {
        let multi_ok =
            matches!(&replies[self.multi], Reply::Frame(OwnedFrame::SimpleString(s)) if s == b"OK");
        if !multi_ok {
            // MULTI refused or lost: the pushes, if they ran, ran one by one, outside any
            // transaction (EXEC then answers "without MULTI", or nothing).
            if let Reply::Error(e) = &replies[self.multi] {
                h.error("MULTI", e);
            }
            h.split(self.elems[0]);
            for (i, &at) in self.pushes.iter().enumerate() {
                let reply = std::mem::replace(&mut replies[at], Reply::Lost);
                settle_push(h, &[self.elems[i]], reply, &cmds[at]);
            }
            return false;
        }
        let mut clean = true;
        let exec = replies.len() - 1;
        for (i, reply) in replies.iter().enumerate().take(exec).skip(self.multi + 1) {
            match reply {
                Reply::Frame(OwnedFrame::SimpleString(s)) if s == b"QUEUED" => {}
                Reply::Error(e)
                    if self.kind == TxKind::Refused
                        && !self.pushes.contains(&i)
                        && e.starts_with("ERR wrong number of arguments") => {}
                Reply::Error(e) => {
                    h.error(&describe(&cmds[i]), e);
                    clean = false;
                }
                Reply::Lost => clean = false,
                Reply::Frame(f) => {
                    h.unexpected(&describe(&cmds[i]), f);
                    clean = false;
                }
            }
        }
        match replies.pop().expect("EXEC's reply") {
            Reply::Frame(OwnedFrame::Array(items)) => {
                if self.executed(h, items) {
                    return clean;
                }
            }
            Reply::Frame(OwnedFrame::Null) if self.kind == TxKind::Watch => {
                h.count("op: transaction aborted by WATCH");
                h.not_run(&self.elems);
                return clean;
            }
            Reply::Error(e) if e.starts_with("EXECABORT") => {
                h.not_run(&self.elems);
                return clean && self.kind == TxKind::Refused;
            }
            Reply::Error(e) => h.error("EXEC", &e),
            Reply::Lost => {}
            Reply::Frame(f) => h.unexpected("EXEC", &f),
        }
        h.unknown(&self.elems);
        false
    }

    /// EXEC's array: the pushes' lengths (and the read between them). False (reported)
    /// when it is not that.
    fn executed(&self, h: &mut History, mut items: Vec<OwnedFrame>) -> bool {
        let [e1, e2] = self.elems;
        let read = match (self.read, items.len()) {
            (None, 2) => None,
            (Some(_), 3) => match items.remove(1) {
                OwnedFrame::Array(read) => bulks(read),
                _ => None,
            },
            _ => {
                h.unexpected("EXEC", &items);
                return false;
            }
        };
        let (a, b) = match items.as_slice() {
            [OwnedFrame::Integer(a), OwnedFrame::Integer(b)] if *a > 0 && *b > 0 => {
                (*a as usize, *b as usize)
            }
            _ => {
                h.unexpected("EXEC", &items);
                return false;
            }
        };
        if self.kind == TxKind::Refused {
            h.violation(format!(
                "aborted write visible: EXEC ran a transaction in which a command was refused \
                 while queued (e{e1}, e{e2})"
            ));
        }
        h.ack(&[(e1, a), (e2, b)]);
        if let Some(read) = read {
            let what = "LRANGE in MULTI/EXEC";
            h.observe_list(self.keys[1], Some(self.send_ts), &read, what);
            if read.len() + 1 != b {
                h.violation(format!(
                    "not all-or-nothing: a transaction read {} elements of {}, then pushed e{e2} \
                     at position {b}: something ran in between",
                    read.len(),
                    list_key(self.keys[1])
                ));
            }
        }
        true
    }
}
