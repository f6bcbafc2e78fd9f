//! The durability rule, written once:
//!
//! > **A reply leaves walrus only when the journal covers everything it reveals.**
//!
//! - A *write*'s reply is held until the journal's durable replication offset reaches the
//!   offset Valkey reported right after the write's batch (the `ROLE` appended to every
//!   upstream batch that writes; see [`crate::proxy::pipeline`]).
//! - A *read*'s reply is held when, at the moment it arrives from Valkey, any key it read is
//!   *dirty*: written by a write whose batch is not durable yet. It is released once every
//!   write that was pending on those keys at that moment is durable ([`dirty`]). Reads that
//!   scan the keyspace (KEYS, SCAN, DBSIZE, RANDOMKEY, INFO keyspace, read-only scripts)
//!   wait for every pending write. Writes whose keys walrus cannot know (unknown commands,
//!   FLUSHALL, SWAPDB, every script and function, which may touch keys it does not declare)
//!   dirty every key ([`access`]).
//! - Until the replica link is attached and the journal follows Valkey's stream, writes are
//!   refused: before that, Valkey's offsets do not move (no replication backlog yet), and a
//!   write would look durable with nothing journaled.
//! - While walrus restores Valkey ([`crate::restore`]), every command that reads or writes
//!   data gets Valkey's own `-LOADING`: an empty Valkey would answer reads with data the
//!   journal contradicts.
//! - Every upstream connection belongs to one *history epoch*, the gate's count of Valkey
//!   processes and replication histories it has followed. A batch or a read reply from an
//!   older epoch is answered with an error, never released: offsets of two histories (both
//!   may start at 0) are not comparable.
//! - When the journal fails (an I/O error, an fsync error: never retried and trusted), every
//!   held reply gets an error, writes are refused with `-MISCONF`, and reads of clean keys go
//!   on. A write whose connection broke before its offset was known is never acknowledged.
//! - Executed-but-not-durable bytes are bounded (`durability.max_pending_bytes`), and so is
//!   the memory of held replies (`durability.max_held_bytes`): past either, new writes wait
//!   before they are sent to Valkey; reads keep flowing.
//!
//! Side effects are not gated: Pub/Sub messages, keyspace notifications and CLIENT TRACKING
//! invalidations are delivered as Valkey sends them, possibly before the write that caused
//! them is durable (a subscriber can see an event for a write a crash then loses). The data
//! itself, read with any command, never is.

pub mod access;
pub mod dirty;
mod hold;
pub mod marks;

pub use access::{access, Access};
pub use marks::{resolve_orphans, WriteMark};

use bytes::Bytes;
use dirty::{DirtyKeys, Scope};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use tokio::sync::{oneshot, Notify};

/// A reply waiting for durability.
#[derive(Debug)]
pub struct Held {
    pub tx: oneshot::Sender<Bytes>,
    pub reply: Bytes,
    /// When Valkey's reply arrived: the hold time starts here.
    arrived: std::time::Instant,
}

impl Held {
    pub fn new(tx: oneshot::Sender<Bytes>, reply: Bytes) -> Held {
        Held {
            tx,
            reply,
            arrived: std::time::Instant::now(),
        }
    }

    /// Releases a reply the gate held (counted in `walrus_ack_hold_seconds`).
    fn release(self) {
        crate::metrics::ACK_HOLD.observe(self.arrived.elapsed().as_secs_f64());
        self.pass();
    }

    /// Releases a read that never had to wait.
    fn pass(self) {
        let _ = self.tx.send(self.reply);
    }

    fn fail(self, why: &Bytes) {
        let _ = self.tx.send(why.clone());
    }
}

/// Why writes are not accepted right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// The replica link is not (yet, or no longer) following Valkey's stream.
    Detached,
    Attached,
    /// walrus is loading Valkey from its checkpoint and journal.
    Restoring,
    /// The journal failed: permanent.
    Failed(String),
}

/// A settled batch: its write replies and the dirty-key marks they clear once durable.
type Batch = (Vec<Held>, Vec<WriteMark>);

struct State {
    status: Status,
    /// Highest replication offset the journal holds durably (or that a stored RDB covers).
    durable_offset: u64,
    /// Highest batch offset Valkey has reported.
    executed_offset: u64,
    /// Offset at which the link attached to the current replication history. Writes are
    /// refused until then, so a batch offset below it comes from another history: a Valkey
    /// that restarted before the link noticed.
    history_start: u64,
    /// The history epoch (module doc).
    epoch: u64,
    /// The Valkey process (`run_id`) the link is attached to, or was last.
    run_id: String,
    dirty: DirtyKeys,
    /// Settled write batches waiting for `durable_offset` to reach their offset.
    batches: BTreeMap<u64, Vec<Batch>>,
    /// Reads waiting for every write up to a generation to be durable.
    reads: BTreeMap<u64, Vec<Held>>,
    held_bytes: u64,
    /// Why new writes are refused although the journal is attached: a disk watermark
    /// ([`crate::disk`]). The `-MISCONF` reply, ready to send.
    blocked: Option<Bytes>,
}

pub struct Durability {
    state: Mutex<State>,
    /// Writes pending right now, blocking ones included, published after every change under
    /// the lock. A read reply that finds zero skips the lock: a write marked later was sent
    /// to Valkey after that reply arrived, so the read cannot have seen it.
    pending_writes: AtomicUsize,
    /// Blocking writes in flight, published likewise: a read about to be sent checks it
    /// without the lock (one marked later was sent after the read, which cannot see it).
    blocked_writes: AtomicUsize,
    /// The history epoch and whether a restore runs, published under the lock for the read
    /// path, which checks them without taking it.
    epoch_now: AtomicU64,
    restoring: AtomicBool,
    /// Woken when writes may proceed again (room freed, status changed).
    room: Notify,
    /// Raised when a connection reached another Valkey process than the one the link
    /// follows: the link checks at once instead of at its next probe.
    doubt: Notify,
    max_pending_bytes: u64,
    max_held_bytes: u64,
    /// How long any reply or write may wait ([`hold`]).
    max_hold: std::time::Duration,
    /// Where unsettled marks go when dropped ([`marks`]), and its receiving end until the
    /// resolver takes it.
    orphans: marks::Orphans,
    orphans_rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<marks::Orphan>>>,
}

/// Valkey's own reply while it loads a dataset.
pub fn loading() -> Bytes {
    crate::resp::write::error("LOADING Valkey is loading the dataset in memory")
}

/// What a read held behind a write whose outcome can never be known gets.
fn lost_write() -> Bytes {
    crate::resp::write::error(
        "ERR walrus: a write this read depends on was lost with its connection to Valkey; retry",
    )
}

fn history_changed() -> Bytes {
    crate::resp::write::error(
        "ERR walrus: Valkey's replication history changed before this write was journaled; it may be lost",
    )
}

/// The error a refused write gets.
fn refusal(status: &Status) -> Bytes {
    crate::resp::write::error(&match status {
        Status::Detached => {
            "MISCONF walrus: the journal is not attached to Valkey's replication stream; writes are refused until it is"
                .to_string()
        }
        Status::Failed(why) => format!("MISCONF walrus: journal failed, writes are refused: {}", why.replace(['\r', '\n'], " ")),
        Status::Restoring => return loading(),
        Status::Attached => unreachable!("attached writes are not refused"),
    })
}

impl Durability {
    pub fn new(max_pending_bytes: u64, max_held_bytes: u64) -> Durability {
        let (orphans, orphans_rx) = tokio::sync::mpsc::unbounded_channel();
        Durability {
            orphans,
            orphans_rx: Mutex::new(Some(orphans_rx)),
            state: Mutex::new(State {
                status: Status::Detached,
                durable_offset: 0,
                executed_offset: 0,
                history_start: 0,
                epoch: 0,
                run_id: String::new(),
                dirty: DirtyKeys::default(),
                batches: BTreeMap::new(),
                reads: BTreeMap::new(),
                held_bytes: 0,
                blocked: None,
            }),
            pending_writes: AtomicUsize::new(0),
            blocked_writes: AtomicUsize::new(0),
            epoch_now: AtomicU64::new(0),
            restoring: AtomicBool::new(false),
            room: Notify::new(),
            doubt: Notify::new(),
            max_pending_bytes,
            max_held_bytes,
            max_hold: std::time::Duration::from_secs(30),
        }
    }

    /// Bounds every wait at `max_hold` ([`hold`]); 30 s unless set.
    pub fn with_max_hold(mut self, max_hold: std::time::Duration) -> Durability {
        self.max_hold = max_hold;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("durability state lock")
    }

    /// Publishes the pending-write count; call with the lock held, after marking or
    /// unmarking.
    fn publish(&self, s: &State) {
        let blocked = s.dirty.blocked_writes() as usize;
        self.blocked_writes.store(blocked, Ordering::SeqCst);
        self.pending_writes
            .store(s.dirty.pending_writes() + blocked, Ordering::SeqCst);
    }

    pub fn status(&self) -> Status {
        self.lock().status.clone()
    }

    /// Waits until a write may be sent: attached, and pending bytes and held memory under
    /// their bounds. Returns the refusal reply when writes are refused instead.
    pub async fn write_room(&self) -> Result<(), Bytes> {
        tokio::time::timeout(self.max_hold, self.room_or_refusal())
            .await
            .unwrap_or_else(|_| Err(self.no_room()))
    }

    async fn room_or_refusal(&self) -> Result<(), Bytes> {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let s = self.lock();
                s.admit_write()?;
                let pending = s.executed_offset.saturating_sub(s.durable_offset);
                if pending <= self.max_pending_bytes && s.held_bytes <= self.max_held_bytes {
                    return Ok(());
                }
            }
            notified.await;
        }
    }

    /// Waits until the replica link is attached (or the journal failed) in another epoch than
    /// `not_epoch`; returns the epoch and its Valkey process then.
    pub async fn wait_attached(&self, not_epoch: Option<u64>) -> (u64, String) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(p) = self.attached(not_epoch) {
                return p;
            }
            notified.await;
        }
    }

    /// The epoch and its Valkey process, if the link is attached (or the journal failed) in
    /// another epoch than `not_epoch`.
    pub fn attached(&self, not_epoch: Option<u64>) -> Option<(u64, String)> {
        let s = self.lock();
        (matches!(s.status, Status::Attached | Status::Failed(_)) && Some(s.epoch) != not_epoch)
            .then(|| (s.epoch, s.run_id.clone()))
    }

    /// The current history epoch.
    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// A connection found another Valkey process than [`attached`](Self::attached) names: the
    /// one the link follows died, and the link may not have noticed yet (it notices a closed
    /// stream only when it reads, and it does not read while the ring is full).
    pub fn doubt_valkey(&self) {
        self.doubt.notify_one();
    }

    /// Resolves at the next [`doubt_valkey`](Self::doubt_valkey) (one raised since the last
    /// call counts).
    pub async fn doubted(&self) {
        self.doubt.notified().await
    }

    /// Whether a read may be sent now: not while Valkey is being restored.
    pub fn admit_read(&self) -> Result<(), Bytes> {
        match self.lock().status {
            Status::Restoring => Err(loading()),
            _ => Ok(()),
        }
    }

    /// Registers a blocking write about to be sent (BLPOP, BLMOVE, ...): it takes no
    /// generation, and reads that may see it read at an offset barrier ([`dirty`]).
    pub fn begin_blocked(&self, scope: Scope) -> Result<WriteMark, Bytes> {
        let mut s = self.lock();
        s.admit_write()?;
        s.dirty.mark_blocked(&scope);
        self.publish(&s);
        Ok(WriteMark::new_blocked(scope, s.epoch, self.orphans.clone()))
    }

    /// Whether a read of `scope` about to be sent may see what a blocking write in flight
    /// wrote: it then takes an offset barrier in its own batch (the `ROLE` after it).
    pub fn blocked_overlaps(&self, scope: &Scope) -> bool {
        self.blocked_writes.load(Ordering::SeqCst) != 0 && self.lock().dirty.blocked_overlaps(scope)
    }

    /// Registers a write about to be sent: its keys become dirty.
    pub fn begin_write(&self, scope: Scope) -> Result<WriteMark, Bytes> {
        let mut s = self.lock();
        s.admit_write()?;
        let generation = s.dirty.mark(&scope);
        self.publish(&s);
        Ok(WriteMark::new(
            generation,
            scope,
            s.epoch,
            self.orphans.clone(),
        ))
    }

    /// The orphaned marks, for [`resolve_orphans`] (once).
    pub fn take_orphans(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<marks::Orphan>> {
        self.orphans_rx.lock().expect("orphans lock").take()
    }

    /// A batch's offset is known: its write replies wait for it. `epoch`: the history epoch
    /// of the connection it ran on.
    pub fn settle_batch(&self, offset: u64, epoch: u64, replies: Vec<Held>, marks: Vec<WriteMark>) {
        let mut s = self.lock();
        if let Status::Failed(_) = s.status {
            let why = refusal(&s.status);
            s.unmark(marks);
            drop(s);
            replies.into_iter().for_each(|h| h.fail(&why));
            return;
        }
        if epoch != s.epoch || offset < s.history_start {
            // It ran on a Valkey whose history the journal does not follow.
            s.unmark(marks);
            let reads = s.ready_reads();
            drop(s);
            let why = history_changed();
            replies.into_iter().for_each(|h| h.fail(&why));
            reads.into_iter().for_each(Held::release);
            return;
        }
        s.executed_offset = s.executed_offset.max(offset);
        if offset <= s.durable_offset {
            s.unmark(marks);
            let reads = s.ready_reads();
            drop(s);
            replies.into_iter().chain(reads).for_each(Held::release);
            return;
        }
        s.held_bytes += replies.iter().map(|h| h.reply.len() as u64).sum::<u64>();
        s.batches.entry(offset).or_default().push((replies, marks));
    }

    /// A batch whose offset can never be known (its connection broke, ROLE failed): its
    /// replies get `why`. Its writes may have run, so their keys stay dirty until the journal
    /// passes `offset_hint` (Valkey's offset learned afterwards, on a connection of `epoch`).
    /// Without a hint, reads held behind them get an error (never the value they might
    /// show) and the marks go to the orphan resolver, which keeps asking.
    pub fn abandon_batch(
        &self,
        replies: Vec<Held>,
        marks: Vec<WriteMark>,
        why: Bytes,
        offset_hint: Option<(u64, u64)>,
    ) {
        replies.into_iter().for_each(|h| h.fail(&why));
        if marks.is_empty() {
            return;
        }
        match offset_hint {
            Some((offset, epoch)) => self.settle_batch(offset, epoch, Vec::new(), marks),
            None => {
                // Reads wait on generations, which blocking writes do not take.
                let lost_from = marks
                    .iter()
                    .filter(|m| !m.blocked)
                    .map(|m| m.generation)
                    .min()
                    .unwrap_or(u64::MAX);
                let failed = self.lock().take_reads_from(lost_from);
                let err = lost_write();
                failed.into_iter().for_each(|h| h.fail(&err));
                // Dropped unsettled, outside the lock: they become orphans.
                drop(marks);
            }
        }
    }

    /// A write that never got a reply or was never sent: releases its marks. Nothing it
    /// might have done is visible through walrus afterwards (its keys were dirty until now).
    pub fn cancel_write(&self, marks: Vec<WriteMark>) {
        if marks.is_empty() {
            return;
        }
        let mut s = self.lock();
        s.unmark(marks);
        let reads = s.ready_reads();
        self.publish(&s);
        drop(s);
        reads.into_iter().for_each(Held::release);
    }

    /// A read's reply arrived on a connection of `epoch`: release it now, or hold it while
    /// its keys are dirty. Returned when it may show what a blocking write in flight wrote:
    /// the caller then holds it until the journal covers Valkey's offset as it is now, after
    /// the read ran ([`settle_batch`](Self::settle_batch)).
    pub fn read_reply(&self, scope: &Scope, epoch: u64, held: Held) -> Option<Held> {
        if self.restoring.load(Ordering::SeqCst) || self.epoch_now.load(Ordering::SeqCst) != epoch {
            // Read from a Valkey the journal does not describe (restarted, being restored).
            held.fail(&loading());
            return None;
        }
        if self.pending_writes.load(Ordering::SeqCst) == 0 {
            held.pass();
            return None;
        }
        let mut s = self.lock();
        if s.dirty.blocked_overlaps(scope) {
            return Some(held);
        }
        let Some(generation) = s.dirty.pending_for(scope) else {
            drop(s);
            held.pass();
            return None;
        };
        if let Status::Failed(_) = s.status {
            // The write it would reveal can no longer become durable.
            let why = refusal(&s.status);
            drop(s);
            held.fail(&why);
            return None;
        }
        s.held_bytes += held.reply.len() as u64;
        s.reads.entry(generation).or_default().push(held);
        None
    }

    /// The journal's durable offset advanced.
    pub fn set_durable(&self, offset: u64) {
        let mut s = self.lock();
        if offset <= s.durable_offset {
            return;
        }
        s.durable_offset = offset;
        let later = s.batches.split_off(&(offset + 1));
        let done = std::mem::replace(&mut s.batches, later);
        let mut out = Vec::new();
        for (_, batches) in done {
            for (replies, marks) in batches {
                s.held_bytes -= replies.iter().map(|h| h.reply.len() as u64).sum::<u64>();
                s.unmark(marks);
                out.extend(replies);
            }
        }
        out.extend(s.ready_reads());
        self.publish(&s);
        drop(s);
        out.into_iter().for_each(Held::release);
        self.room.notify_waiters();
    }

    /// The replica link attached (or re-attached) to Valkey process `run_id`'s stream at
    /// `offset`. After a full resynchronization, `offset` is covered by the stored RDB, so it
    /// is durable too. A new replication history (`new_history`: Valkey restarted or failed
    /// over) invalidates every held write: its offset belongs to the old history. So does a
    /// new process that continues the same history (one that loaded an RDB ending exactly at
    /// the journal's end): the writes the old one ran beyond the journal died with it, and the
    /// new one's offsets would otherwise release their replies.
    ///
    /// `valkey_offset`: Valkey's own offset at attach. Beyond `offset`, Valkey ran writes the
    /// journal does not hold yet (walrus restarted while Valkey kept running): until the
    /// journal covers it, every key counts as dirty, so no read shows what a crash could
    /// still lose. Marked under the same lock as the attach: no read slips in between.
    pub fn attach(
        &self,
        run_id: &str,
        offset: u64,
        durable: bool,
        new_history: bool,
        valkey_offset: u64,
    ) {
        let mut s = self.lock();
        if let Status::Failed(_) = s.status {
            // The journal was fenced (a damaged segment file, say): nothing reopens it.
            return;
        }
        let mut failed = Vec::new();
        if new_history {
            failed = self.new_epoch(&mut s);
            s.durable_offset = offset;
            s.executed_offset = offset;
            s.history_start = offset;
        } else if !s.run_id.is_empty() && s.run_id != run_id {
            failed = self.new_epoch(&mut s);
            // What the dead process ran beyond the journal is gone: it is not pending.
            s.executed_offset = s.durable_offset.max(offset);
        }
        s.run_id = run_id.to_string();
        if s.history_start == 0 {
            s.history_start = offset;
        }
        if valkey_offset > offset.max(s.durable_offset) {
            let generation = s.dirty.mark(&Scope::All);
            let mark = WriteMark::new(generation, Scope::All, s.epoch, self.orphans.clone());
            s.batches
                .entry(valkey_offset)
                .or_default()
                .push((Vec::new(), vec![mark]));
            self.publish(&s);
        }
        s.status = Status::Attached;
        self.restoring.store(false, Ordering::SeqCst);
        drop(s);
        let why = history_changed();
        failed.into_iter().for_each(|h| h.fail(&why));
        if durable {
            self.set_durable(offset);
        }
        self.room.notify_waiters();
    }

    /// Valkey lost its dataset (it died, or came back empty) and walrus is about to load it
    /// again: every command touching data gets `-LOADING` until [`attach`](Self::attach), and
    /// every held reply gets an error (what it would reveal ran on a Valkey that is gone).
    pub fn begin_restore(&self) {
        let mut s = self.lock();
        if let Status::Failed(_) = s.status {
            return;
        }
        let failed = self.new_epoch(&mut s);
        s.status = Status::Restoring;
        self.restoring.store(true, Ordering::SeqCst);
        drop(s);
        let why = history_changed();
        failed.into_iter().for_each(|h| h.fail(&why));
        self.room.notify_waiters();
    }

    /// Starts a new history epoch: every held reply is taken out (to be failed by the caller)
    /// and every mark cleared.
    fn new_epoch(&self, s: &mut State) -> Vec<Held> {
        s.epoch += 1;
        self.epoch_now.store(s.epoch, Ordering::SeqCst);
        let out = s.take_held();
        self.publish(s);
        out
    }

    /// The replica link broke: refuse new writes until it is back. Held replies stay held:
    /// a partial resync will deliver their offsets.
    pub fn detach(&self) {
        let mut s = self.lock();
        if s.status == Status::Attached {
            s.status = Status::Detached;
        }
        drop(s);
        self.room.notify_waiters();
    }

    /// Refuses new writes with `-MISCONF <why>` (a disk watermark), or accepts them again
    /// (`None`). Writes already sent are not affected: the journal has room for them.
    pub fn block_writes(&self, why: Option<&str>) {
        // One line: the message names paths, which may hold anything.
        self.lock().blocked = why.map(|w| {
            let w = w.replace(['\r', '\n'], " ");
            crate::resp::write::error(&format!("MISCONF walrus: {w}"))
        });
        self.room.notify_waiters();
    }

    /// The journal failed for good: every held reply gets an error, writes are refused.
    pub fn fail(&self, why: &str) {
        crate::metrics::JOURNAL_FAILED.set(1);
        let mut s = self.lock();
        s.status = Status::Failed(why.to_string());
        let err = refusal(&s.status);
        let out = s.take_held();
        drop(s);
        out.into_iter().for_each(|h| h.fail(&err));
        self.room.notify_waiters();
    }

    /// Sets the gate's gauges (a scrape hook: the hot path keeps none of them).
    pub fn publish_metrics(&self) {
        use crate::metrics as m;
        let s = self.lock();
        let held = s
            .batches
            .values()
            .flatten()
            .map(|(r, _)| r.len())
            .sum::<usize>()
            + s.reads.values().map(Vec::len).sum::<usize>();
        m::HELD_REPLIES.set(held as i64);
        m::HELD_BYTES.set(s.held_bytes as i64);
        m::DIRTY_KEYS.set(s.dirty.len() as i64);
        m::DURABLE_LAG.set(s.executed_offset.saturating_sub(s.durable_offset) as i64);
        m::REPLICA_LINK_UP.set(i64::from(s.status == Status::Attached));
    }

    /// For metrics and tests: (durable offset, executed offset, held bytes, dirty keys).
    pub fn snapshot(&self) -> (u64, u64, u64, usize) {
        let s = self.lock();
        (
            s.durable_offset,
            s.executed_offset,
            s.held_bytes,
            s.dirty.len(),
        )
    }
}

impl State {
    /// Whether a new write may be sent to Valkey now; `Err` is the refusal.
    fn admit_write(&self) -> Result<(), Bytes> {
        use crate::metrics::Refusal;
        let refused = match (&self.status, &self.blocked) {
            (Status::Attached, None) => return Ok(()),
            (Status::Attached, Some(why)) => {
                Refusal::DiskWatermark.count();
                return Err(why.clone());
            }
            (Status::Detached, _) => Refusal::Detached,
            (Status::Restoring, _) => Refusal::Restoring,
            (Status::Failed(_), _) => Refusal::JournalFailed,
        };
        refused.count();
        Err(refusal(&self.status))
    }

    fn unmark(&mut self, marks: Vec<WriteMark>) {
        let failed = matches!(self.status, Status::Failed(_));
        for mut m in marks {
            m.disarm();
            // After a journal failure those writes ran in Valkey but will never be journaled:
            // their keys stay dirty, so reading them fails instead of showing data a crash
            // would lose.
            if failed {
                continue;
            }
            if m.blocked {
                self.dirty.unmark_blocked(&m.scope);
            } else {
                self.dirty.unmark(m.generation, &m.scope);
            }
        }
    }

    /// Every held reply, write and read, with the writes' marks settled.
    fn take_held(&mut self) -> Vec<Held> {
        let mut out = Vec::new();
        for (_, batches) in std::mem::take(&mut self.batches) {
            for (replies, marks) in batches {
                self.unmark(marks);
                out.extend(replies);
            }
        }
        out.extend(std::mem::take(&mut self.reads).into_values().flatten());
        self.held_bytes = 0;
        out
    }

    /// Held reads waiting for generations from `generation` on.
    fn take_reads_from(&mut self, generation: u64) -> Vec<Held> {
        let out: Vec<Held> = self
            .reads
            .split_off(&generation)
            .into_values()
            .flatten()
            .collect();
        self.held_bytes -= out.iter().map(|h| h.reply.len() as u64).sum::<u64>();
        out
    }

    /// Reads whose writes are all durable now.
    fn ready_reads(&mut self) -> Vec<Held> {
        let upto = self.dirty.settled_through();
        let later = self.reads.split_off(&(upto + 1));
        let ready = std::mem::replace(&mut self.reads, later);
        let out: Vec<Held> = ready.into_values().flatten().collect();
        self.held_bytes -= out.iter().map(|h| h.reply.len() as u64).sum::<u64>();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(reply: &str) -> (Held, oneshot::Receiver<Bytes>) {
        let (tx, rx) = oneshot::channel();
        (Held::new(tx, Bytes::copy_from_slice(reply.as_bytes())), rx)
    }

    /// A write of `k` whose reply waits for `offset`.
    fn held_write(d: &Durability, k: &str, offset: u64, epoch: u64) -> oneshot::Receiver<Bytes> {
        let mark = d.begin_write(key(k)).unwrap();
        let (w, rx) = held("+OK\r\n");
        d.settle_batch(offset, epoch, vec![w], vec![mark]);
        rx
    }

    fn key(k: &str) -> Scope {
        Scope::Keys {
            db: 0,
            keys: vec![Bytes::copy_from_slice(k.as_bytes())],
        }
    }

    #[test]
    fn writes_are_refused_until_attached() {
        let d = Durability::new(1 << 20, 1 << 20);
        let refused = d.begin_write(key("a")).unwrap_err();
        assert!(refused.starts_with(b"-MISCONF"));
        d.attach("p", 100, true, true, 0);
        assert!(d.begin_write(key("a")).is_ok());
        d.detach();
        assert!(d.begin_write(key("a")).is_err());
    }

    #[test]
    fn a_fenced_journal_stays_fenced_across_an_attach() {
        let d = Durability::new(1 << 20, 1 << 20);
        d.attach("p", 100, true, true, 0);
        d.fail("journal segment seg-00003.wal is gone");
        d.attach("p", 200, true, false, 0);
        assert!(matches!(d.status(), Status::Failed(_)));
        assert!(d
            .begin_write(key("a"))
            .unwrap_err()
            .starts_with(b"-MISCONF walrus: journal failed"));
    }

    #[test]
    fn a_write_reply_and_a_dirty_read_wait_for_the_durable_offset() {
        let d = Durability::new(1 << 20, 1 << 20);
        d.attach("p", 100, true, true, 0);
        let mut w_rx = held_write(&d, "a", 150, 1);
        let (r, mut r_rx) = held("$1\r\nv\r\n");
        d.read_reply(&key("a"), 1, r);
        let (clean, mut clean_rx) = held("$1\r\nc\r\n");
        d.read_reply(&key("b"), 1, clean);
        assert!(
            clean_rx.try_recv().is_ok(),
            "a clean read is released at once"
        );
        assert!(w_rx.try_recv().is_err() && r_rx.try_recv().is_err());
        d.set_durable(149);
        assert!(w_rx.try_recv().is_err() && r_rx.try_recv().is_err());
        d.set_durable(150);
        assert_eq!(&w_rx.try_recv().unwrap()[..], b"+OK\r\n");
        assert_eq!(&r_rx.try_recv().unwrap()[..], b"$1\r\nv\r\n");
        assert_eq!(d.snapshot().2, 0, "no held bytes left");
    }

    #[test]
    fn a_reply_held_past_the_bound_gets_an_error_and_its_keys_stay_dirty() {
        let d = Durability::new(1 << 20, 1 << 20).with_max_hold(std::time::Duration::from_secs(30));
        d.attach("p", 100, true, true, 0);
        let mut w_rx = held_write(&d, "a", 150, 1);
        let (r, mut r_rx) = held("$1\r\nv\r\n");
        d.read_reply(&key("a"), 1, r);
        let now = std::time::Instant::now();
        d.expire_held(now + std::time::Duration::from_secs(29));
        assert!(w_rx.try_recv().is_err() && r_rx.try_recv().is_err());
        d.expire_held(now + std::time::Duration::from_secs(31));
        let reply = w_rx.try_recv().unwrap();
        assert!(reply.starts_with(b"-ERR walrus: this write was not journaled within 30000 ms"));
        assert!(r_rx
            .try_recv()
            .unwrap()
            .starts_with(b"-ERR walrus: a write this read depends on"));
        assert_eq!(d.snapshot().2, 0, "no held bytes left");
        // The write may have run: its key is shown only once it is durable.
        let (r, mut r_rx) = held("$1\r\nv\r\n");
        d.read_reply(&key("a"), 1, r);
        assert!(r_rx.try_recv().is_err());
        d.set_durable(150);
        assert_eq!(&r_rx.try_recv().unwrap()[..], b"$1\r\nv\r\n");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_waiting_for_room_is_refused_past_the_bound() {
        let d = Durability::new(1 << 20, 1 << 20).with_max_hold(std::time::Duration::from_secs(30));
        d.attach("p", 0, true, true, 0);
        let mark = d.begin_write(key("a")).unwrap();
        d.settle_batch(2 << 20, 1, Vec::new(), vec![mark]);
        let refused = d.write_room().await.unwrap_err();
        assert!(refused.starts_with(b"-MISCONF walrus: no room for writes within 30000 ms"));
    }

    #[test]
    fn a_valkey_ahead_of_the_journal_at_attach_makes_every_read_wait() {
        // Even when it is another process than before: its new epoch must not drop the mark.
        let d = Durability::new(1 << 20, 1 << 20);
        d.attach("p", 100, true, true, 0);
        d.detach();
        d.attach("q", 100, true, false, 150);
        let (r, mut r_rx) = held("$1\r\nv\r\n");
        assert!(d.read_reply(&key("a"), 2, r).is_none());
        assert!(
            r_rx.try_recv().is_err(),
            "held until the journal covers 150"
        );
        d.set_durable(150);
        assert_eq!(&r_rx.try_recv().unwrap()[..], b"$1\r\nv\r\n");
    }

    #[test]
    fn another_process_continuing_the_history_fails_what_the_dead_one_held() {
        // Valkey process p ran a write at 150; the journal ends at 100 when p dies. Process
        // q loaded an RDB ending at 100 and continues the same history: its own writes reach
        // offset 150, which must not release p's reply (that write is gone).
        let d = Durability::new(1 << 20, 1 << 20);
        d.attach("p", 100, true, true, 0);
        let mut w_rx = held_write(&d, "a", 150, 1);
        d.detach();
        d.attach("p", 100, true, false, 0);
        assert!(
            w_rx.try_recv().is_err(),
            "the same process re-attaching keeps it"
        );
        d.detach();
        d.attach("q", 100, true, false, 0);
        assert!(w_rx
            .try_recv()
            .unwrap()
            .starts_with(b"-ERR walrus: Valkey's replication history changed"));
        assert_eq!(d.attached(None), Some((2, "q".to_string())));
    }

    #[test]
    fn a_failed_journal_turns_held_replies_into_errors() {
        let d = Durability::new(1 << 20, 1 << 20);
        d.attach("p", 0, true, true, 0);
        let mut w_rx = held_write(&d, "a", 10, 1);
        d.fail("fsync failed");
        assert!(w_rx.try_recv().unwrap().starts_with(b"-MISCONF"));
        assert!(d
            .begin_write(key("a"))
            .unwrap_err()
            .starts_with(b"-MISCONF"));
        // The failed write ran in Valkey: reading its key fails; other keys read fine.
        let (r, mut r_rx) = held("$1\r\nv\r\n");
        d.read_reply(&key("a"), 1, r);
        assert!(r_rx.try_recv().unwrap().starts_with(b"-MISCONF"));
        let (clean, mut clean_rx) = held("$1\r\nc\r\n");
        d.read_reply(&key("b"), 1, clean);
        assert_eq!(&clean_rx.try_recv().unwrap()[..], b"$1\r\nc\r\n");
    }

    #[test]
    fn an_offset_from_another_history_is_never_acknowledged() {
        let d = Durability::new(1 << 20, 1 << 20);
        d.attach("p", 5000, true, true, 0);
        let mark = d.begin_write(key("a")).unwrap();
        let (w, mut w_rx) = held("+OK\r\n");
        // A restarted Valkey counts from 0 again: 42 is below where this history began.
        d.settle_batch(42, 1, vec![w], vec![mark]);
        assert!(w_rx
            .try_recv()
            .unwrap()
            .starts_with(b"-ERR walrus: Valkey's replication history changed"));
    }

    #[test]
    fn a_new_history_from_offset_zero_is_told_apart_by_its_epoch() {
        let d = Durability::new(1 << 20, 1 << 20);
        d.attach("p", 0, true, true, 0);
        let old = d.epoch();
        let mark = d.begin_write(key("a")).unwrap();
        let (w, mut w_rx) = held("+OK\r\n");
        // A held read of the dirty key, and a held write: both must fail, not be released,
        // when Valkey is lost and restored.
        d.settle_batch(40, old, vec![w], vec![mark]);
        let (r, mut r_rx) = held("$1\r\nv\r\n");
        d.read_reply(&key("a"), old, r);
        d.begin_restore();
        assert!(w_rx
            .try_recv()
            .unwrap()
            .starts_with(b"-ERR walrus: Valkey's replication history changed"));
        assert!(r_rx
            .try_recv()
            .unwrap()
            .starts_with(b"-ERR walrus: Valkey's replication history changed"));
        // While restoring: reads and writes get Valkey's -LOADING.
        assert!(d.admit_read().unwrap_err().starts_with(b"-LOADING"));
        assert!(d
            .begin_write(key("b"))
            .unwrap_err()
            .starts_with(b"-LOADING"));
        let (r, mut r_rx) = held("$-1\r\n");
        d.read_reply(&key("a"), d.epoch(), r);
        assert!(r_rx.try_recv().unwrap().starts_with(b"-LOADING"));
        // Attached again, from offset 0 of a new history: a batch that ran on a connection
        // of the old epoch is refused even though its offset (10) looks covered.
        d.attach("p", 0, true, true, 0);
        d.set_durable(100);
        let mark = d.begin_write(key("b")).unwrap();
        let (w, mut w_rx) = held("+OK\r\n");
        d.settle_batch(10, old, vec![w], vec![mark]);
        assert!(w_rx
            .try_recv()
            .unwrap()
            .starts_with(b"-ERR walrus: Valkey's replication history changed"));
        let (r, mut r_rx) = held("$1\r\nv\r\n");
        d.read_reply(&key("c"), old, r);
        assert!(r_rx.try_recv().unwrap().starts_with(b"-LOADING"));
        // The current epoch works as before.
        let mark = d.begin_write(key("b")).unwrap();
        let (w, mut w_rx) = held("+OK\r\n");
        d.settle_batch(10, d.epoch(), vec![w], vec![mark]);
        assert_eq!(&w_rx.try_recv().unwrap()[..], b"+OK\r\n");
    }

    #[test]
    fn reads_held_behind_a_lost_write_get_an_error() {
        let d = Durability::new(1 << 20, 1 << 20);
        d.attach("p", 0, true, true, 0);
        let e = d.epoch();
        let mark = d.begin_write(key("a")).unwrap();
        let (r, mut r_rx) = held("$1\r\nv\r\n");
        d.read_reply(&key("a"), e, r);
        assert!(r_rx.try_recv().is_err(), "held while the write is pending");
        d.abandon_batch(Vec::new(), vec![mark], Bytes::new(), None);
        assert!(r_rx.try_recv().unwrap().starts_with(b"-ERR"));
        assert_eq!(d.snapshot().2, 0);
    }
}
