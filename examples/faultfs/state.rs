//! The state every request and control command shares, behind one lock.
//!
//! One lock for everything is what makes `crash` atomic: while it runs no write can be half
//! recorded and no sync half applied. Requests hold it only for memory work and a pwrite or
//! two to the backing directory, never while waiting (see sched.rs).

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use fuser::Errno;

use crate::cache::{Cache, Frag};
use crate::crash::{self, Mode, Rng};
use crate::faults::Faults;
use crate::handles::Handles;
use crate::inodes::Inodes;
use crate::names::Names;
use crate::sched::Scheduler;

pub struct Shared {
    /// The backing directory: the "disk". What is in it is durable.
    pub backing: PathBuf,
    pub state: Mutex<State>,
    pub sched: Scheduler,
}

#[derive(Default)]
pub struct Stats {
    pub writes: u64,
    pub syncs: u64,
    pub faults: u64,
    pub crashes: u64,
}

pub struct State {
    pub inodes: Inodes,
    pub handles: Handles,
    pub cache: Cache,
    pub names: Names,
    pub faults: Faults,
    /// Set by `crash`, cleared by `recover`: every request fails with EIO meanwhile.
    pub fenced: bool,
    /// Counts crashes. A request whose completion was deferred compares the epoch it
    /// started in with this one: changed means a crash came first, and it fails.
    pub epoch: u64,
    pub rng: Rng,
    pub stats: Stats,
}

impl Shared {
    pub fn new(backing: PathBuf, root_id: (u64, u64)) -> std::io::Result<Arc<Shared>> {
        Ok(Arc::new(Shared {
            state: Mutex::new(State {
                inodes: Inodes::new(root_id),
                handles: Handles::default(),
                cache: Cache::default(),
                names: Names::new(&backing)?,
                faults: Faults::default(),
                fenced: false,
                epoch: 0,
                rng: Rng::new(0),
                stats: Stats::default(),
            }),
            backing,
            sched: Scheduler::start(),
        }))
    }

    /// The state, for any request: EIO while crashed.
    pub fn live(&self) -> Result<MutexGuard<'_, State>, Errno> {
        let st = self.lock();
        if st.fenced {
            return Err(Errno::EIO);
        }
        Ok(st)
    }

    /// The state, whatever happened (release, forget, control commands).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in one request must not take every later one down with a poisoned lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The backing path of a relative one.
    pub fn real(&self, rel: &std::path::Path) -> PathBuf {
        self.backing.join(rel)
    }
}

impl State {
    /// Makes write `seq` of `ino` durable (a synchronous write's completion). Fine if it is
    /// no longer pending: an fsync made it durable meanwhile.
    pub fn persist_write(&mut self, ino: u64, seq: u64) -> Result<(), Errno> {
        let frags = self.cache.take_write(ino, seq);
        self.write_back(ino, &frags)
    }

    /// Makes every write of `ino` older than `barrier` durable (an fsync's completion).
    pub fn persist_before(&mut self, ino: u64, barrier: u64) -> Result<(), Errno> {
        let frags = self.cache.take_before(ino, barrier);
        self.write_back(ino, &frags)
    }

    /// An fsync of `ino` (or a synchronous write to it) completed: the name operations it
    /// covers are durable (names.rs).
    pub fn persist_names(&mut self, ino: u64, dir: bool, barrier: u64) {
        if let Some(id) = self.inodes.get(ino).map(|i| i.id) {
            self.names.synced(id, dir, barrier);
        }
    }

    fn write_back(&mut self, ino: u64, frags: &[Frag]) -> Result<(), Errno> {
        if frags.is_empty() {
            return Ok(());
        }
        let writer = self
            .inodes
            .get(ino)
            .and_then(|i| i.writer.clone())
            .ok_or(Errno::EIO)?;
        // Lost writes leave the cache without reaching the disk.
        for f in frags.iter().filter(|f| !f.lost) {
            writer.write_all_at(&f.data, f.offset)?;
        }
        let pending = self.cache.has(ino);
        self.inodes.tidy(ino, pending);
        Ok(())
    }

    /// The power loss: pending writes and name operations go, but for what `mode` lets
    /// survive, and every request fails until `recover`. Returns the control reply. The
    /// caller then runs the deferred completions (they fail: the epoch moved).
    pub fn crash(&mut self, mode: Mode) -> String {
        self.fenced = true;
        self.epoch += 1;
        self.stats.crashes += 1;
        let mut pending = self.cache.take_all();
        // Writes a failed sync lost were never going to reach the disk.
        pending.retain(|(_, f)| !f.lost);
        let out = crash::decide(mode, pending, &mut self.rng);
        let mut error = None;
        for (ino, f) in &out.keep {
            let writer = self.inodes.get(*ino).and_then(|i| i.writer.clone());
            let written = match writer {
                Some(w) => w.write_all_at(&f.data, f.offset),
                None => Err(std::io::Error::other(format!("inode {ino} has no writer"))),
            };
            if let Err(e) = written {
                error.get_or_insert(e.to_string());
            }
        }
        // Names after data: the survivors were written through descriptors, whatever their
        // files' names are now. A reorder keeps the oldest few name operations (a journal
        // commits in order), the other modes none.
        let pending_names = self.names.pending();
        let keep = match mode {
            Mode::Reorder if pending_names > 0 => self.rng.below(pending_names as u64 + 1) as usize,
            _ => 0,
        };
        let names = self.names.rollback(keep, &mut self.inodes);
        if let Some(e) = names.error {
            error.get_or_insert(e);
        }
        // Nothing is pending any more: writers of files not open are not needed.
        self.inodes.tidy_all(|_| false);
        let mut reply = format!(
            "ok crash writes={} bytes={} kept_writes={} kept_bytes={} names={} kept_names={}",
            out.writes, out.bytes, out.kept_writes, out.kept_bytes, names.pending, names.kept
        );
        if let Some((ino, cut)) = out.torn {
            reply += &format!(" torn_at={cut} torn_path={}", self.inodes.display(ino));
        }
        if let Some(e) = error {
            reply = format!("err crash applied partly: {e}; {reply}");
        }
        reply
    }

    /// The `status` reply.
    pub fn status(&self, sched: &Scheduler) -> String {
        let (writes, bytes) = self.cache.totals();
        let (held, timed, stalled) = sched.counts();
        format!(
            "ok pending_writes={writes} pending_bytes={bytes} pending_names={} writes={} \
             syncs={} faults={} crashes={} fenced={} stalled={} held={held} delayed={timed} \
             latency_us={} epoch={}",
            self.names.pending(),
            self.stats.writes,
            self.stats.syncs,
            self.stats.faults,
            self.stats.crashes,
            u8::from(self.fenced),
            u8::from(stalled),
            self.faults.latency.as_micros(),
            self.epoch,
        )
    }
}
