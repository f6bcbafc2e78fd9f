//! Large values: a SET of 64 KiB to 1 MiB to one of the worker's own keys, or, rarely, a
//! transaction of such SETs whose effects exceed what the journal takes in one entry
//! (`max_entry_bytes`, 8 MiB in the test journal), which walrus covers with a full resync.

use crate::common::Rng;
use crate::conn::{cmd, describe, Cmd, Reply};
use crate::history::{Fate, History, BIG_SLOTS};
use crate::keys::big_key;
use crate::values::big_value;
use redis_protocol::resp2::types::OwnedFrame;

/// SETs in a huge transaction: 9 MiB of effects, more than one journal entry takes.
const HUGE: usize = 9;
const MIB: usize = 1 << 20;

/// One request writing large values: the versions it writes, and its commands.
pub struct LargeWrite {
    writes: Vec<(String, usize)>,
    pub cmds: Vec<Cmd>,
}

impl LargeWrite {
    /// A SET of 64 KiB to 1 MiB to one of `worker`'s keys.
    pub fn single(h: &mut History, worker: usize, rng: &mut Rng) -> LargeWrite {
        h.count("op: large value");
        let key = big_key(worker, rng.below(BIG_SLOTS as u64) as usize);
        let size = (64 << 10) + rng.below(960 << 10) as usize;
        let version = h.new_big(&key, size);
        let set = vec![
            b"SET".to_vec(),
            key.clone().into_bytes(),
            big_value(&key, version, size),
        ];
        LargeWrite {
            writes: vec![(key, version)],
            cmds: vec![set],
        }
    }

    /// MULTI, `HUGE` SETs of 1 MiB across `worker`'s keys, EXEC.
    pub fn huge_transaction(h: &mut History, worker: usize) -> LargeWrite {
        h.count("op: transaction larger than a journal entry");
        let mut writes = Vec::with_capacity(HUGE);
        let mut cmds = vec![cmd(&["MULTI"])];
        for i in 0..HUGE {
            let key = big_key(worker, i % BIG_SLOTS);
            let version = h.new_big(&key, MIB);
            let value = big_value(&key, version, MIB);
            cmds.push(vec![b"SET".to_vec(), key.clone().into_bytes(), value]);
            writes.push((key, version));
        }
        cmds.push(cmd(&["EXEC"]));
        LargeWrite { writes, cmds }
    }

    /// Settles the versions from the replies (none: never sent); true when they were
    /// written.
    pub fn settle(&self, h: &mut History, mut replies: Vec<Reply>) -> bool {
        if replies.len() == 1 {
            let fate = set_fate(h, replies.remove(0), &self.cmds[0]);
            h.big_settled(&self.writes, fate);
            return fate == Fate::Acked;
        }
        let multi_ok = matches!(replies.first(), Some(Reply::Frame(f)) if ok(f));
        if !multi_ok {
            // MULTI refused (or never sent): any SET that ran, ran on its own.
            let sets = replies
                .into_iter()
                .skip(1)
                .chain(std::iter::repeat_with(|| Reply::Lost));
            for ((write, reply), c) in self.writes.iter().zip(sets).zip(&self.cmds[1..]) {
                let fate = set_fate(h, reply, c);
                h.big_settled(std::slice::from_ref(write), fate);
            }
            return false;
        }
        let exec = replies.pop().expect("EXEC's reply");
        let mut taken = true;
        for (r, c) in replies.iter().zip(&self.cmds).skip(1) {
            match r {
                Reply::Frame(OwnedFrame::SimpleString(s)) if s == b"QUEUED" => {}
                // Refused while queued (-MISCONF, -LOADING): EXEC aborts.
                Reply::Error(e) => {
                    h.error(&describe(c), e);
                    taken = false;
                }
                Reply::Lost => taken = false,
                Reply::Frame(f) => {
                    h.unexpected(&describe(c), f);
                    taken = false;
                }
            }
        }
        let fate = match exec {
            Reply::Frame(OwnedFrame::Array(all)) if all.len() == HUGE && all.iter().all(ok) => {
                Fate::Acked
            }
            Reply::Error(e) if e.starts_with("EXECABORT") => Fate::NotRun,
            Reply::Error(e) => {
                h.error("EXEC", &e);
                Fate::Unknown
            }
            Reply::Lost => Fate::Unknown,
            Reply::Frame(f) => {
                h.unexpected("EXEC", &f);
                Fate::Unknown
            }
        };
        h.big_settled(&self.writes, fate);
        fate == Fate::Acked && taken
    }
}

fn ok(f: &OwnedFrame) -> bool {
    matches!(f, OwnedFrame::SimpleString(s) if s == b"OK")
}

/// What a SET's reply says of it.
fn set_fate(h: &mut History, reply: Reply, c: &Cmd) -> Fate {
    match reply {
        Reply::Frame(f) if ok(&f) => return Fate::Acked,
        Reply::Error(e) => h.error(&describe(c), &e),
        Reply::Lost => {}
        Reply::Frame(f) => h.unexpected(&describe(c), &f),
    }
    Fate::Unknown
}
