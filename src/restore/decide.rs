//! The decision at every attach: what walrus does with the Valkey it finds, given what its
//! checkpoint and journal hold. This table is the whole rule; [`decide`] implements it.
//!
//! "walrus holds H" means a checkpoint is recorded; H is its chain (the replication ids it
//! went through and the offset after its last journal entry, see [`super::chain`]).
//!
//! | Valkey | walrus holds nothing | walrus holds H |
//! |---|---|---|
//! | primary whose id (or previous id, within its offset) is one of H's, offset at or past H's end | - | **(a) continue**: `PSYNC <id> <end+1>`; nothing is replayed. Valkey ahead of the end ran writes walrus never acknowledged: the stream brings them. Backlog too short: Valkey answers with a full resync of its own id, whose RDB becomes the checkpoint. |
//! | empty (no keys), not (a) | **(d) fresh**: `PSYNC ? -1`, a new history | **(b) restore** |
//! | a replica whose primary id is one of H's (a restore that was cut short) | by its keys, as the rows above and below | **(b) restore** |
//! | holds keys of another history, or of H but behind its end | **adopt**: `PSYNC ? -1`, Valkey's data becomes walrus's first checkpoint | **(c) conflict**: `restore.on_conflict` = `refuse` (default: stop and say so), `valkey-wins` (adopt, dropping H), `journal-wins` (restore over Valkey's data) |
//!
//! A restore, (b) or (c) with `journal-wins`, then checks that this Valkey can take what
//! walrus holds, before it sends anything ([`super::compatible`]): a downgrade is refused.
//!
//! A journal whose entries span several histories is no special case: a new history always
//! starts with a new checkpoint, so H is the chain of the newest one, and entries before its
//! `from_lsn` are never replayed.

use crate::config::OnConflict;
use crate::valkey::handshake::Position;
use crate::valkey::view::ValkeyView;

/// The replication history the data directory stores: the ids of its current checkpoint's
/// chain, and the offset it ends at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredHistory {
    pub ids: Vec<String>,
    pub end: u64,
}

impl StoredHistory {
    pub fn describe(&self) -> String {
        format!(
            "walrus's checkpoint and journal hold history {} up to offset {}",
            self.ids.join(" then "),
            self.end
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// (a): Valkey has everything walrus holds; continue its stream from here.
    Continue(Position),
    /// (b), or (c) with `journal-wins`: load Valkey from the checkpoint and journal.
    Restore,
    /// (d), adopt, or (c) with `valkey-wins`: a full resynchronization starts a new history
    /// from what Valkey holds.
    NewHistory,
    /// (c) with `refuse`: the message says what each side holds and what to do.
    Refuse(String),
}

pub fn decide(v: &ValkeyView, stored: Option<&StoredHistory>, on_conflict: OnConflict) -> Decision {
    let Some(h) = stored else {
        return Decision::NewHistory;
    };
    if v.primary && v.offset >= h.end {
        let current = h.ids.contains(&v.replid);
        let previous = h.ids.contains(&v.replid2) && (h.end as i64) < v.second_offset;
        if current || previous {
            let replid = if current { &v.replid } else { &v.replid2 };
            return Decision::Continue(Position {
                replid: replid.clone(),
                offset: h.end,
            });
        }
    }
    let our_replica = !v.primary && h.ids.contains(&v.replid);
    if v.keys == 0 || our_replica {
        return Decision::Restore;
    }
    match on_conflict {
        OnConflict::ValkeyWins => Decision::NewHistory,
        OnConflict::JournalWins => Decision::Restore,
        OnConflict::Refuse => Decision::Refuse(format!(
            "{}, but {}; refusing to continue, since either side would overwrite the other. \
             Start Valkey empty to restore walrus's data, or set restore.on_conflict = \
             \"valkey-wins\" (keep Valkey's data, drop the journal's) or \"journal-wins\" \
             (replace Valkey's data with the journal's)",
            v.describe(),
            h.describe()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const C: &str = "cccccccccccccccccccccccccccccccccccccccc";

    fn valkey(
        primary: bool,
        replid: &str,
        replid2: &str,
        second: i64,
        offset: u64,
        keys: u64,
    ) -> ValkeyView {
        ValkeyView {
            version: "Valkey 9.1.2".parse().unwrap(),
            run_id: "9d2e".into(),
            primary,
            replid: replid.into(),
            replid2: replid2.into(),
            second_offset: second,
            offset,
            keys,
        }
    }

    fn stored(ids: &[&str], end: u64) -> StoredHistory {
        StoredHistory {
            ids: ids.iter().map(|s| s.to_string()).collect(),
            end,
        }
    }

    fn cont(replid: &str, offset: u64) -> Decision {
        Decision::Continue(Position {
            replid: replid.into(),
            offset,
        })
    }

    #[test]
    fn the_table() {
        let zero = "0000000000000000000000000000000000000000";
        let h = stored(&[A, B], 500);
        let r = OnConflict::Refuse;
        // (a) same history, at or past the end (past: writes never acknowledged).
        assert_eq!(
            decide(&valkey(true, B, zero, -1, 500, 9), Some(&h), r),
            cont(B, 500)
        );
        assert_eq!(
            decide(&valkey(true, A, zero, -1, 900, 9), Some(&h), r),
            cont(A, 500)
        );
        // (a) through replid2: Valkey was promoted after a restore that announced A.
        assert_eq!(
            decide(&valkey(true, C, A, 538, 537, 9), Some(&h), r),
            cont(A, 500)
        );
        // ... but not when A is valid only below the end.
        assert!(matches!(
            decide(&valkey(true, C, A, 300, 537, 9), Some(&h), r),
            Decision::Refuse(_)
        ));
        // (b) an empty Valkey (restarted: new id, offset 0), or our own half-restored replica.
        assert_eq!(
            decide(&valkey(true, C, zero, -1, 0, 0), Some(&h), r),
            Decision::Restore
        );
        assert_eq!(
            decide(&valkey(false, A, zero, -1, 200, 7), Some(&h), r),
            Decision::Restore
        );
        // Same id but behind the end, with keys: not ours to trust.
        assert!(matches!(
            decide(&valkey(true, B, zero, -1, 100, 5), Some(&h), r),
            Decision::Refuse(_)
        ));
        // (c) foreign data: refuse, naming both histories, or as configured.
        let Decision::Refuse(why) = decide(&valkey(true, C, zero, -1, 80, 3), Some(&h), r) else {
            panic!("conflict must refuse")
        };
        assert!(
            why.contains(C) && why.contains(A) && why.contains("on_conflict"),
            "{why}"
        );
        let v = valkey(true, C, zero, -1, 80, 3);
        assert_eq!(
            decide(&v, Some(&h), OnConflict::ValkeyWins),
            Decision::NewHistory
        );
        assert_eq!(
            decide(&v, Some(&h), OnConflict::JournalWins),
            Decision::Restore
        );
        // (d) and adopt: walrus holds nothing.
        assert_eq!(
            decide(&valkey(true, C, zero, -1, 0, 0), None, r),
            Decision::NewHistory
        );
        assert_eq!(decide(&v, None, r), Decision::NewHistory);
    }
}
