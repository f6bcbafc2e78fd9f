//! The gate: one object that owns the durability state, admits writes and reads, holds
//! replies, and releases them as the journal's durable offset advances. The rule it
//! enforces is [the module's](super).

use super::dirty::{DirtyKeys, Scope};
use super::marks::{self, WriteMark};
use super::queue::{Held, HeldQueue};
use super::state::State;
use super::status::{LinkState, Refusal};
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use tokio::sync::Notify;

pub struct Durability {
    state: Mutex<State>,
    /// Writes pending right now, blocking ones included, published after every change under
    /// the lock. A read reply that finds zero skips the lock: a write marked later was sent
    /// to Valkey after that reply arrived, so the read cannot have seen it.
    pub(super) pending_writes: AtomicUsize,
    /// Blocking writes in flight, published likewise: a read about to be sent checks it
    /// without the lock (one marked later was sent after the read, which cannot see it).
    blocked_writes: AtomicUsize,
    /// The history epoch and whether a restore runs, published under the lock for the read
    /// path, which checks them without taking it.
    pub(super) epoch_now: AtomicU64,
    restoring: AtomicBool,
    /// Woken when writes may proceed again (room freed, status changed).
    pub(super) room: Notify,
    /// Where the writes stand, for held notices ([`super::notices`]): published with the
    /// pending-write count.
    pub(super) progress: tokio::sync::watch::Sender<Progress>,
    /// Raised when a connection reached another Valkey process than the one the link
    /// follows: the link checks at once instead of at its next probe.
    doubt: Notify,
    max_pending_bytes: u64,
    max_held_bytes: u64,
    /// How long any reply or write may wait ([`super::hold`]).
    pub(super) max_hold: std::time::Duration,
    /// Where unsettled marks go when dropped ([`marks`]), and its receiving end until the
    /// resolver takes it.
    pub(super) orphans: marks::Orphans,
    orphans_rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<marks::Orphan>>>,
}

/// How far the gate has come, for the notices that wait on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Progress {
    pub(super) epoch: u64,
    /// Every write up to this generation is settled ([`super::dirty::DirtyKeys::settled_through`]).
    pub(super) settled_through: u64,
    pub(super) failed: bool,
}

impl Durability {
    pub fn new(max_pending_bytes: u64, max_held_bytes: u64) -> Durability {
        // Unbounded because a mark is orphaned in `Drop`, which cannot wait, and an orphan
        // lost would leave its keys dirty for good. Bounded all the same: one per write in
        // flight, and writes in flight are bounded by `max_pending_bytes` and the pipelines.
        let (orphans, orphans_rx) = tokio::sync::mpsc::unbounded_channel();
        Durability {
            orphans,
            orphans_rx: Mutex::new(Some(orphans_rx)),
            state: Mutex::new(State {
                status: LinkState::Detached,
                durable_offset: 0,
                executed_offset: 0,
                history_start: 0,
                epoch: 0,
                run_id: String::new(),
                dirty: DirtyKeys::default(),
                held: HeldQueue::default(),
                blocked: None,
                archive_blocked: None,
            }),
            pending_writes: AtomicUsize::new(0),
            blocked_writes: AtomicUsize::new(0),
            epoch_now: AtomicU64::new(0),
            restoring: AtomicBool::new(false),
            room: Notify::new(),
            progress: tokio::sync::watch::Sender::new(Progress {
                epoch: 0,
                settled_through: 0,
                failed: false,
            }),
            doubt: Notify::new(),
            max_pending_bytes,
            max_held_bytes,
            max_hold: std::time::Duration::from_secs(30),
        }
    }

    /// Bounds every wait at `max_hold` ([`super::hold`]); 30 s unless set.
    pub fn with_max_hold(mut self, max_hold: std::time::Duration) -> Durability {
        self.max_hold = max_hold;
        self
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("durability state lock")
    }

    /// Publishes the pending-write count and the progress held notices wait on; call with
    /// the lock held, after marking or unmarking, a new epoch or a journal failure.
    fn publish(&self, s: &State) {
        let blocked = s.dirty.blocked_writes() as usize;
        self.blocked_writes.store(blocked, Ordering::SeqCst);
        self.pending_writes
            .store(s.dirty.pending_writes() + blocked, Ordering::SeqCst);
        let now = Progress {
            epoch: s.epoch,
            settled_through: s.dirty.settled_through(),
            failed: matches!(s.status, LinkState::Failed(_)),
        };
        self.progress
            .send_if_modified(|p| std::mem::replace(p, now) != now);
    }

    pub fn status(&self) -> LinkState {
        self.lock().status.clone()
    }

    /// What a write arriving now would be refused with (`None`: admitted), for `/status`:
    /// not counted as a refusal.
    pub fn write_refusal(&self) -> Option<Refusal> {
        self.lock().write_refusal()
    }

    /// Waits until a write may be sent: attached, and pending bytes and held memory under
    /// their bounds. Returns the refusal reply when writes are refused instead.
    pub async fn write_room(&self) -> Result<(), Refusal> {
        tokio::time::timeout(self.max_hold, self.room_or_refusal())
            .await
            .unwrap_or_else(|_| Err(Refusal::NoRoom(self.max_hold).count()))
    }

    async fn room_or_refusal(&self) -> Result<(), Refusal> {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let s = self.lock();
                s.admit_write()?;
                let pending = s.executed_offset.saturating_sub(s.durable_offset);
                if pending <= self.max_pending_bytes && s.held.bytes() <= self.max_held_bytes {
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
        (matches!(s.status, LinkState::Attached | LinkState::Failed(_))
            && Some(s.epoch) != not_epoch)
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
    pub fn admit_read(&self) -> Result<(), Refusal> {
        match self.lock().status {
            LinkState::Restoring => Err(Refusal::Loading),
            _ => Ok(()),
        }
    }

    /// Registers a blocking write about to be sent (BLPOP, BLMOVE, ...): it takes no
    /// generation, and reads that may see it read at an offset barrier ([`super::dirty`]).
    pub fn begin_blocked(&self, scope: Scope) -> Result<WriteMark, Refusal> {
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
    pub fn begin_write(&self, scope: Scope) -> Result<WriteMark, Refusal> {
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

    /// The orphaned marks, for [`super::resolve_orphans`] (once).
    pub fn take_orphans(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<marks::Orphan>> {
        self.orphans_rx.lock().expect("orphans lock").take()
    }

    /// A batch's offset is known: its write replies wait for it. `epoch`: the history epoch
    /// of the connection it ran on.
    pub fn settle_batch(&self, offset: u64, epoch: u64, replies: Vec<Held>, marks: Vec<WriteMark>) {
        let mut s = self.lock();
        if let LinkState::Failed(_) = s.status {
            let why = Refusal::of(&s.status).reply();
            s.unmark(marks);
            drop(s);
            replies.into_iter().for_each(|h| h.fail(&why));
            return;
        }
        if epoch != s.epoch || offset < s.history_start {
            // It ran on a Valkey whose history the journal does not follow.
            s.unmark(marks);
            let reads = s.ready_reads();
            self.publish(&s);
            drop(s);
            let why = Refusal::HistoryChanged.reply();
            replies.into_iter().for_each(|h| h.fail(&why));
            reads.into_iter().for_each(Held::release);
            return;
        }
        s.executed_offset = s.executed_offset.max(offset);
        if offset <= s.durable_offset {
            s.unmark(marks);
            let reads = s.ready_reads();
            self.publish(&s);
            drop(s);
            replies.into_iter().chain(reads).for_each(Held::release);
            return;
        }
        assert!(
            offset > s.durable_offset,
            "held a batch the journal already covers"
        );
        s.held.hold_batch(offset, replies, marks);
    }

    /// A batch whose ROLE never told its offset (its connection broke, ROLE failed). With
    /// `offset_hint` (Valkey's offset learned afterwards, from the process the batch ran on,
    /// of `epoch`), it settles there: its replies are real outcomes, released once the journal
    /// passes it, and its writes' keys stay dirty until then. Without one, its replies get
    /// `why`, reads held behind its writes get an error (never the value they might show),
    /// and the marks go to the orphan resolver, which keeps asking.
    pub fn abandon_batch(
        &self,
        replies: Vec<Held>,
        marks: Vec<WriteMark>,
        why: Bytes,
        offset_hint: Option<(u64, u64)>,
    ) {
        if let Some((offset, epoch)) = offset_hint {
            return self.settle_batch(offset, epoch, replies, marks);
        }
        replies.into_iter().for_each(|h| h.fail(&why));
        if marks.is_empty() {
            return;
        }
        // Reads wait on generations, which blocking writes do not take.
        let lost_from = marks
            .iter()
            .filter(|m| !m.blocked)
            .map(|m| m.generation)
            .min()
            .unwrap_or(u64::MAX);
        let failed = self.lock().take_reads_from(lost_from);
        let err = Refusal::LostWrite.reply();
        failed.into_iter().for_each(|h| h.fail(&err));
        // Dropped unsettled, outside the lock: they become orphans.
        drop(marks);
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
            held.fail(&Refusal::Loading.reply());
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
        if let LinkState::Failed(_) = s.status {
            // The write it would reveal can no longer become durable.
            let why = Refusal::of(&s.status).reply();
            drop(s);
            held.fail(&why);
            return None;
        }
        s.held.hold_read(generation, held);
        None
    }

    /// The journal's durable offset advanced.
    pub fn set_durable(&self, offset: u64) {
        let mut s = self.lock();
        if offset <= s.durable_offset {
            return;
        }
        s.durable_offset = offset;
        let mut out = Vec::new();
        for (replies, marks) in s.held.batches_through(offset) {
            s.unmark(marks);
            out.extend(replies);
        }
        out.extend(s.ready_reads());
        // Paired with `settle_batch`, which holds a batch only above the durable offset:
        // nothing at or below it stays held.
        assert!(
            s.held.first_batch_offset().is_none_or(|o| o > offset),
            "a batch at or below the durable offset is still held"
        );
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
    ///
    /// Returns the attachment's history epoch.
    pub fn attach(
        &self,
        run_id: &str,
        offset: u64,
        durable: bool,
        new_history: bool,
        valkey_offset: u64,
    ) -> u64 {
        let mut s = self.lock();
        if let LinkState::Failed(_) = s.status {
            // The journal was fenced (a damaged segment file, say): nothing reopens it.
            return s.epoch;
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
            s.held.hold_batch(valkey_offset, Vec::new(), vec![mark]);
            self.publish(&s);
        }
        s.status = LinkState::Attached;
        let epoch = s.epoch;
        self.restoring.store(false, Ordering::SeqCst);
        drop(s);
        let why = Refusal::HistoryChanged.reply();
        failed.into_iter().for_each(|h| h.fail(&why));
        if durable {
            self.set_durable(offset);
        }
        self.room.notify_waiters();
        epoch
    }

    /// Valkey lost its dataset (it died, or came back empty) and walrus is about to load it
    /// again: every command touching data gets `-LOADING` until [`attach`](Self::attach), and
    /// every held reply gets an error (what it would reveal ran on a Valkey that is gone).
    pub fn begin_restore(&self) {
        let mut s = self.lock();
        if let LinkState::Failed(_) = s.status {
            return;
        }
        let failed = self.new_epoch(&mut s);
        s.status = LinkState::Restoring;
        self.restoring.store(true, Ordering::SeqCst);
        drop(s);
        let why = Refusal::HistoryChanged.reply();
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
        if s.status == LinkState::Attached {
            s.status = LinkState::Detached;
        }
        drop(s);
        self.room.notify_waiters();
    }

    /// Refuses new writes with `-MISCONF <why>` (a disk watermark), or accepts them again
    /// (`None`). Writes already sent are not affected: the journal has room for them.
    pub fn block_writes(&self, why: Option<&str>) {
        self.lock().blocked = why.map(Refusal::disk);
        self.room.notify_waiters();
    }

    /// Refuses new writes with `-MISCONF <why>` while the archive lags past its bound, or
    /// accepts them again (`None`); independent of the disk's refusal.
    pub fn block_writes_archive(&self, why: Option<&str>) {
        self.lock().archive_blocked = why.map(Refusal::archive);
        self.room.notify_waiters();
    }

    /// The journal failed for good: every held reply gets an error, writes are refused.
    pub fn fail(&self, why: &str) {
        crate::metrics::JOURNAL_FAILED.set(1);
        let mut s = self.lock();
        s.status = LinkState::Failed(why.to_string());
        let err = Refusal::of(&s.status).reply();
        let out = s.take_held();
        self.publish(&s);
        drop(s);
        out.into_iter().for_each(|h| h.fail(&err));
        self.room.notify_waiters();
    }

    /// Sets the gate's gauges (a scrape hook: the hot path keeps none of them).
    pub fn publish_metrics(&self) {
        use crate::metrics as m;
        let s = self.lock();
        m::HELD_REPLIES.set(s.held.len() as i64);
        m::HELD_BYTES.set(s.held.bytes() as i64);
        m::DIRTY_KEYS.set(s.dirty.len() as i64);
        m::DURABLE_LAG.set(s.executed_offset.saturating_sub(s.durable_offset) as i64);
        m::REPLICA_LINK_UP.set(i64::from(s.status == LinkState::Attached));
    }

    /// For metrics and tests: (durable offset, executed offset, held bytes, dirty keys).
    pub fn snapshot(&self) -> (u64, u64, u64, usize) {
        let s = self.lock();
        (
            s.durable_offset,
            s.executed_offset,
            s.held.bytes(),
            s.dirty.len(),
        )
    }
}
