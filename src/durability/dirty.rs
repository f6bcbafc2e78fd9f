//! The dirty-key map: which keys (per database) have writes that Valkey executed but the
//! journal does not cover yet.
//!
//! Every write gets a *generation*, a number that grows by one per write. A key remembers how
//! many of its writes are pending and the newest one's generation. A read that finds its key
//! dirty waits until every write up to that generation is durable ([`settled_through`]):
//! later writes to the same key cannot extend the wait, so a hot key never starves readers,
//! and earlier writes to it (which may have run after the newest one on another connection)
//! are covered too.
//!
//! A blocking write (BLPOP, BLMOVE, XREADGROUP BLOCK, ...) gets no generation: it may wait
//! for hours, and no read may wait for it (nor behind it, through the generations). It has
//! written nothing while it blocks; once served, what it wrote is in Valkey's stream before
//! anything that ran after it. So a read that may see one of its keys reads at an *offset
//! barrier* instead: it is released once the journal covers Valkey's offset after the read
//! ran, which covers the pop if the read saw it ([`DirtyKeys::blocked_overlaps`]).
//!
//! A notice (a keyspace notification, a tracking invalidation: [`super::notices`]) waits as a
//! read of the keys it names would ([`DirtyKeys::pending_for_notice`]).
//!
//! [`settled_through`]: DirtyKeys::settled_through

use bytes::Bytes;
use std::collections::{BTreeSet, HashMap};

/// What a command touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// These keys of one database.
    Keys { db: u32, keys: Vec<Bytes> },
    /// Every key of one database (FLUSHDB).
    Db(u32),
    /// Every key of every database (FLUSHALL, SWAPDB, unknown commands, keyspace scans).
    All,
}

#[derive(Debug, Clone, Copy)]
struct Mark {
    pending_writes: u32,
    newest_generation: u64,
}

#[derive(Debug, Default)]
pub struct DirtyKeys {
    last_generation: u64,
    pending: BTreeSet<u64>,
    keys: HashMap<(u32, Bytes), Mark>,
    dbs: HashMap<u32, Mark>,
    all: Option<Mark>,
    /// Blocking writes in flight, by key; those of a wider scope are counted in
    /// `blocked_wide`.
    blocked_keys: HashMap<(u32, Bytes), u32>,
    blocked_wide: u32,
    blocked_total: u32,
    /// The highest database a write was marked in: a notice that names keys without their
    /// database (a tracking invalidation) looks for them in every one up to it.
    max_db: u32,
}

fn bump(slot: &mut Option<Mark>, generation: u64) {
    let m = slot.get_or_insert(Mark {
        pending_writes: 0,
        newest_generation: 0,
    });
    m.pending_writes += 1;
    m.newest_generation = generation;
}

impl DirtyKeys {
    /// Registers a write; returns its generation.
    pub fn mark(&mut self, scope: &Scope) -> u64 {
        self.last_generation += 1;
        let generation = self.last_generation;
        self.pending.insert(generation);
        self.note_db(scope);
        match scope {
            Scope::Keys { db, keys } => {
                for k in keys {
                    let m = self.keys.entry((*db, k.clone())).or_insert(Mark {
                        pending_writes: 0,
                        newest_generation: 0,
                    });
                    m.pending_writes += 1;
                    m.newest_generation = generation;
                }
            }
            Scope::Db(db) => {
                let mut slot = self.dbs.get(db).copied();
                bump(&mut slot, generation);
                self.dbs.insert(*db, slot.expect("just set"));
            }
            Scope::All => bump(&mut self.all, generation),
        }
        generation
    }

    /// The write of `generation` is durable (or will never be).
    pub fn unmark(&mut self, generation: u64, scope: &Scope) {
        self.pending.remove(&generation);
        fn drop_one<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Mark>, key: K) {
            if let std::collections::hash_map::Entry::Occupied(mut e) = map.entry(key) {
                e.get_mut().pending_writes -= 1;
                if e.get().pending_writes == 0 {
                    e.remove();
                }
            }
        }
        match scope {
            Scope::Keys { db, keys } => {
                for k in keys {
                    drop_one(&mut self.keys, (*db, k.clone()));
                }
            }
            Scope::Db(db) => drop_one(&mut self.dbs, *db),
            Scope::All => {
                if let Some(m) = &mut self.all {
                    m.pending_writes -= 1;
                    if m.pending_writes == 0 {
                        self.all = None;
                    }
                }
            }
        }
    }

    /// For a read of `scope`: the generation to wait for, or `None` when nothing it reads
    /// is dirty.
    pub fn pending_for(&self, scope: &Scope) -> Option<u64> {
        if self.pending.is_empty() {
            return None;
        }
        match scope {
            Scope::Keys { db, keys } => self.newest_of(*db, keys),
            // A scan of a database, or of everything, can see any pending write.
            Scope::Db(_) | Scope::All => self.pending.last().copied(),
        }
    }

    /// The newest pending write's generation among those that may have written `keys` of
    /// `db` (theirs, their database's, everything's).
    fn newest_of(&self, db: u32, keys: &[Bytes]) -> Option<u64> {
        let newest = |m: Option<&Mark>| m.map(|m| m.newest_generation);
        let mut g = newest(self.all.as_ref()).max(newest(self.dbs.get(&db)));
        for k in keys {
            // Hashing a (db, key) pair needs an owned key; the clone is a refcount bump.
            g = g.max(newest(self.keys.get(&(db, k.clone()))));
        }
        g
    }

    /// For a notice naming `keys` of `db`, or of whichever database (`None`): the generation
    /// to wait for, or `None` when none of them is dirty. As for a read, except near a
    /// blocking write in flight that may have written one of them (BLMOVE's destination,
    /// which no generation marks): then it waits for every write pending now. A blocked
    /// command is served right after the write that readied its key, before Valkey runs
    /// anything else, so that write's offset covers what it wrote, and that write is pending
    /// now or durable already (the notice came after it).
    pub fn pending_for_notice(&self, db: Option<u32>, keys: &[Bytes]) -> Option<u64> {
        if self.pending.is_empty() {
            return None;
        }
        let dbs = match db {
            Some(db) => db..=db,
            None => 0..=self.max_db,
        };
        if self.blocked_total > 0 && dbs.clone().any(|db| self.blocked_in(db, keys)) {
            return self.pending.last().copied();
        }
        dbs.filter_map(|db| self.newest_of(db, keys)).max()
    }

    /// Every write with a generation up to this one is settled.
    pub fn settled_through(&self) -> u64 {
        match self.pending.first() {
            Some(g) => g - 1,
            None => self.last_generation,
        }
    }

    /// Registers a blocking write (no generation: see the module doc).
    pub fn mark_blocked(&mut self, scope: &Scope) {
        self.blocked_total += 1;
        self.note_db(scope);
        match scope {
            Scope::Keys { db, keys } => {
                for k in keys {
                    *self.blocked_keys.entry((*db, k.clone())).or_default() += 1;
                }
            }
            Scope::Db(_) | Scope::All => self.blocked_wide += 1,
        }
    }

    /// The blocking write of `scope` is settled.
    pub fn unmark_blocked(&mut self, scope: &Scope) {
        self.blocked_total -= 1;
        match scope {
            Scope::Keys { db, keys } => {
                for k in keys {
                    if let std::collections::hash_map::Entry::Occupied(mut e) =
                        self.blocked_keys.entry((*db, k.clone()))
                    {
                        *e.get_mut() -= 1;
                        if *e.get() == 0 {
                            e.remove();
                        }
                    }
                }
            }
            Scope::Db(_) | Scope::All => self.blocked_wide -= 1,
        }
    }

    /// Whether a read of `scope` may see what a blocking write in flight wrote: it then
    /// reads at an offset barrier.
    pub fn blocked_overlaps(&self, scope: &Scope) -> bool {
        if self.blocked_total == 0 {
            return false;
        }
        match scope {
            Scope::Keys { db, keys } => self.blocked_in(*db, keys),
            Scope::Db(_) | Scope::All => true,
        }
    }

    /// Whether a blocking write in flight may write one of `keys` of `db`.
    fn blocked_in(&self, db: u32, keys: &[Bytes]) -> bool {
        self.blocked_wide > 0
            || keys
                .iter()
                .any(|k| self.blocked_keys.contains_key(&(db, k.clone())))
    }

    fn note_db(&mut self, scope: &Scope) {
        if let Scope::Keys { db, .. } | Scope::Db(db) = scope {
            self.max_db = self.max_db.max(*db);
        }
    }

    /// Blocking writes in flight.
    pub fn blocked_writes(&self) -> u32 {
        self.blocked_total
    }

    /// Writes registered and not yet settled.
    pub fn pending_writes(&self) -> usize {
        self.pending.len()
    }

    /// Dirty keys right now.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.dbs.is_empty() && self.all.is_none() && self.blocked_total == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(db: u32, ks: &[&str]) -> Scope {
        Scope::Keys {
            db,
            keys: ks
                .iter()
                .map(|k| Bytes::copy_from_slice(k.as_bytes()))
                .collect(),
        }
    }

    #[test]
    fn a_read_waits_for_the_writes_pending_on_its_keys_only() {
        let mut d = DirtyKeys::default();
        let a1 = d.mark(&keys(0, &["a"]));
        let b = d.mark(&keys(0, &["b"]));
        let a2 = d.mark(&keys(0, &["a"]));
        assert_eq!(d.pending_for(&keys(0, &["a"])), Some(a2));
        assert_eq!(d.pending_for(&keys(0, &["b"])), Some(b));
        assert_eq!(d.pending_for(&keys(0, &["c"])), None);
        assert_eq!(
            d.pending_for(&keys(1, &["a"])),
            None,
            "databases are separate"
        );
        // The newest write on `a` settles first: `a` is still dirty (a1 pending), and a read
        // of it waits through a2, which covers a1.
        d.unmark(a2, &keys(0, &["a"]));
        assert_eq!(d.pending_for(&keys(0, &["a"])), Some(a2));
        assert_eq!(d.settled_through(), a1 - 1);
        d.unmark(a1, &keys(0, &["a"]));
        assert_eq!(d.pending_for(&keys(0, &["a"])), None);
        assert_eq!(d.settled_through(), b - 1);
        d.unmark(b, &keys(0, &["b"]));
        assert_eq!(d.settled_through(), a2);
        assert!(d.is_empty());
    }

    #[test]
    fn blocking_writes_take_no_generation_and_only_overlap_their_keys() {
        let mut d = DirtyKeys::default();
        d.mark_blocked(&keys(0, &["jobs"]));
        let w = d.mark(&keys(0, &["other"]));
        // Nothing waits for the blocked pop through the generations.
        assert_eq!(d.pending_for(&keys(0, &["jobs"])), None);
        assert_eq!(d.settled_through(), w - 1);
        d.unmark(w, &keys(0, &["other"]));
        assert_eq!(d.settled_through(), w);
        // Reads that may see it read at an offset barrier instead.
        assert!(d.blocked_overlaps(&keys(0, &["jobs", "x"])));
        assert!(d.blocked_overlaps(&Scope::All));
        assert!(!d.blocked_overlaps(&keys(0, &["other"])));
        assert!(!d.blocked_overlaps(&keys(1, &["jobs"])));
        d.unmark_blocked(&keys(0, &["jobs"]));
        assert!(!d.blocked_overlaps(&Scope::All));
        assert!(d.is_empty());
    }

    #[test]
    fn a_notice_waits_as_a_read_of_its_keys_in_its_database_or_in_any() {
        let mut d = DirtyKeys::default();
        let k: &[Bytes] = &[Bytes::from_static(b"k")];
        assert_eq!(d.pending_for_notice(None, k), None);
        let a = d.mark(&keys(3, &["k"]));
        let other = d.mark(&keys(0, &["other"]));
        assert_eq!(d.pending_for_notice(Some(3), k), Some(a));
        assert_eq!(d.pending_for_notice(Some(0), k), None);
        assert_eq!(
            d.pending_for_notice(None, k),
            Some(a),
            "a tracking invalidation names no database: k of database 3 is dirty"
        );
        // A blocking write that may write `k` (BLMOVE's destination) takes no generation:
        // the notice waits for every write pending, the one that served it among them.
        d.mark_blocked(&keys(5, &["k"]));
        assert_eq!(d.pending_for_notice(Some(5), k), Some(other));
        assert_eq!(d.pending_for_notice(None, k), Some(other));
        assert_eq!(d.pending_for_notice(Some(4), k), None);
        d.unmark(a, &keys(3, &["k"]));
        d.unmark(other, &keys(0, &["other"]));
        assert_eq!(
            d.pending_for_notice(Some(5), k),
            None,
            "nothing pending: what served the blocked write is durable"
        );
    }

    #[test]
    fn whole_database_and_global_marks_cover_every_key() {
        let mut d = DirtyKeys::default();
        let f = d.mark(&Scope::Db(2));
        assert_eq!(d.pending_for(&keys(2, &["x"])), Some(f));
        assert_eq!(d.pending_for(&keys(0, &["x"])), None);
        let all = d.mark(&Scope::All);
        assert_eq!(d.pending_for(&keys(0, &["x"])), Some(all));
        assert_eq!(
            d.pending_for(&Scope::All),
            Some(all),
            "keyspace scans wait for everything"
        );
        d.unmark(all, &Scope::All);
        d.unmark(f, &Scope::Db(2));
        assert!(d.is_empty());
        assert_eq!(d.pending_for(&Scope::All), None);
    }
}
