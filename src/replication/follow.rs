//! The journal's durable position, followed into the durability gate.
//!
//! One task per attachment watches the journal's durable position and hands the gate the
//! replication offset it covers ([`Durability::set_durable`]): the one way held replies are
//! released. A journal that fails fails the gate. What Valkey is told (`REPLCONF ACK`) is
//! the acknowledger's business ([`super::link`]); both count the covered offset with
//! [`Covered`].

use crate::durability::Durability;
use crate::journal::{Durable, Journal};
use std::sync::{Arc, Weak};
use tokio::sync::watch;

/// The replication offset the journal covers durably in the current history.
#[derive(Debug, Clone, Copy)]
pub struct Covered {
    /// First LSN of the current history: earlier entries carry offsets of another history.
    history_lsn: u64,
    offset: u64,
}

impl Covered {
    /// `rdb_offset`: what a stored RDB covers at this attachment (0: none).
    pub fn new(history_lsn: u64, rdb_offset: u64) -> Covered {
        Covered {
            history_lsn,
            offset: rdb_offset,
        }
    }

    /// The offset covered once the journal is durable as `d` says.
    pub fn advance(&mut self, d: &Durable) -> u64 {
        if d.lsn >= self.history_lsn {
            self.offset = self.offset.max(d.repl_offset);
        }
        self.offset
    }
}

/// Runs until the journal closes or fails. `journal` is weak: an aborted follower may be
/// dropped a moment after the link, and the journal must close at shutdown. With
/// `archived` (`durability.ack = "archive"`), replies are released as the archive's
/// position moves (it never passes the journal's durable one); a journal that fails fails
/// the gate all the same.
pub async fn follow(
    journal: Weak<Journal>,
    durability: Arc<Durability>,
    mut covered: Covered,
    archived: Option<watch::Receiver<Durable>>,
) {
    let Some(mut durable) = journal.upgrade().map(|j| j.durable()) else {
        return;
    };
    let mut archived = archived;
    loop {
        let d = *durable.borrow_and_update();
        if d.failed {
            if let Some(j) = journal.upgrade() {
                durability.fail(&j.failure());
            }
            return;
        }
        let release = match archived.as_mut() {
            Some(a) => *a.borrow_and_update(),
            None => d,
        };
        durability.set_durable(covered.advance(&release));
        let moved = match archived.as_mut() {
            Some(a) => tokio::select! {
                r = durable.changed() => r,
                r = a.changed() => r,
            },
            None => durable.changed().await,
        };
        if moved.is_err() {
            return;
        }
    }
}
