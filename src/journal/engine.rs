//! The journal handle: open (initialize, recover), append, durability watch, replay,
//! release. This is the API the durable write path drives.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use tokio::sync::watch;

use super::config::JournalConfig;
use super::error::{Corruption, JournalError};
use super::format::REPL_ID_BYTES;
use super::io::BackendInfo;
use super::manifest::{hex_encode, Checkpoint, DataDirId, Manifest};
use super::reader::{EntryIter, ReplayEntry, ReplayFrom};
use super::recovery::{LogEnd, ScanLimits, ScanStart, Scanner, Tail};
use super::ring::{FileRing, Geometry};
use super::writer::{Durable, WriterState};

/// One entry of the replication stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Valkey replication id (40 hex characters).
    pub repl_id: [u8; REPL_ID_BYTES],
    /// Replication offset at the end of this entry.
    pub repl_offset_end: u64,
    pub payload: Bytes,
}

/// Resolves when its entry is durable, or errors when the journal failed first.
pub struct Ticket {
    lsn: u64,
    shared: Arc<WriterState>,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("lsn", &self.lsn).finish()
    }
}

impl Ticket {
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    /// Waits until the entry is durable.
    pub async fn wait(self) -> Result<Durable, JournalError> {
        let lsn = self.lsn;
        let mut rx = self.shared.durable_tx.subscribe();
        let d = *rx
            .wait_for(|d| d.lsn >= lsn || d.failed)
            .await
            .map_err(|_| JournalError::Closed)?;
        if d.lsn >= lsn {
            Ok(d)
        } else {
            let why = self
                .shared
                .lock()
                .failed()
                .unwrap_or_else(|| Arc::from("unknown failure"));
            Err(JournalError::Failed(why))
        }
    }
}

/// Options of [`Journal::open_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// On mid-log corruption, cut the log at the first bad record instead of refusing to
    /// start. Entries after it are lost.
    pub accept_data_loss: bool,
    /// Segments this open creates or fills out are sparse (sized, not written): for a
    /// journal written once and then cut ([`super::compact`]), never for one that serves,
    /// which would allocate as it writes and could meet a full disk there.
    pub sparse: bool,
}

/// What open found.
#[derive(Debug, Clone)]
pub struct Recovered {
    /// End of the log: last LSN and replication id/offset, to continue PSYNC from.
    pub end: LogEnd,
    /// Entries retained (from the checkpoint to the end).
    pub entries: u64,
    pub checkpoint: Checkpoint,
    pub tail: Tail,
    /// Corruption that was cut because `accept_data_loss` was set.
    pub cut_corruption: Option<Corruption>,
    pub segments_initialized: u32,
    pub backend: BackendInfo,
    pub epoch: u32,
}

/// Positions for monitoring and `inspect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalStatus {
    pub next_lsn: u64,
    pub durable: Durable,
    pub write_pos: u64,
    pub head_pos: u64,
    /// Segments between the head and the write position (inclusive).
    pub used_segments: u64,
    pub segments: u32,
    pub segment_bytes: u64,
    /// Bytes that may still be appended before the ring is full (up to the head's segment,
    /// one lap on).
    pub free_bytes: u64,
    /// Writes submitted since open, and those done as a direct blocking call (queue depth 1).
    pub writes_total: u64,
    pub writes_inline: u64,
    /// The last append was refused because the ring is full.
    pub room_wanted: bool,
}

/// A journal open for writing.
pub struct Journal {
    pub(super) shared: Arc<WriterState>,
    pub(super) dir: PathBuf,
    pub(super) geo: Geometry,
    pub(super) cfg: JournalConfig,
    pub(super) manifest: Arc<Mutex<Manifest>>,
    /// The manifest's `released_through_lsn`, published once stored: readers on the
    /// proxy's threads (INFO, the checkpoint task) must not wait for the manifest's lock,
    /// which a release holds across its write and fsync (a disk that stopped answering
    /// holds it for as long).
    pub(super) released_through: AtomicU64,
    pub(super) thread: Option<JoinHandle<()>>,
    pub(super) backend: BackendInfo,
    /// The journal directory's lock, held while open: one writer per journal.
    pub(super) _lock: super::lock::DirLock,
}

impl Journal {
    pub fn backend(&self) -> BackendInfo {
        self.backend
    }

    /// Appends without waiting, stamped with the wall clock now. Errors immediately with
    /// RingFull (release segments first), Busy (every write buffer is queued), EntryTooLarge,
    /// Failed or Closed.
    pub fn try_append(&self, entry: &Entry) -> Result<Ticket, JournalError> {
        self.try_append_at(entry, crate::units::time::now_ms())
    }

    /// [`try_append`](Self::try_append), stamped with `time_ms` instead: a copy keeps the
    /// times its entries had (0: unknown). A stamp below the last of this run is raised to it.
    pub fn try_append_at(&self, entry: &Entry, time_ms: u64) -> Result<Ticket, JournalError> {
        let hint = self.shared.durable_lsn.load(Ordering::Acquire);
        let placed = {
            let mut b = self.shared.lock();
            let placed = b.append(
                &entry.repl_id,
                entry.repl_offset_end,
                &entry.payload,
                hint,
                time_ms,
            );
            if placed.is_ok() {
                b.keep_recent(&entry.payload);
            }
            placed
        };
        // Written only when it changes: no read-modify-write on every append.
        let full = matches!(placed, Err(JournalError::RingFull { .. }));
        if self.shared.room_wanted.load(Ordering::Acquire) != full {
            self.shared.room_wanted.store(full, Ordering::Release);
            if full {
                self.shared.room_wanted_notify.notify_one();
            }
        }
        let placed = placed?;
        self.shared.wake_writer.notify_one();
        Ok(Ticket {
            lsn: placed.lsn,
            shared: self.shared.clone(),
        })
    }

    /// Appends, waiting for a free write buffer when all are queued (Busy). RingFull and
    /// the other errors are returned immediately.
    pub async fn append(&self, entry: Entry) -> Result<Ticket, JournalError> {
        self.append_stamped(entry, crate::units::time::now_ms).await
    }

    /// [`append`](Self::append), stamped with `time_ms` (see
    /// [`try_append_at`](Self::try_append_at)).
    pub async fn append_at(&self, entry: Entry, time_ms: u64) -> Result<Ticket, JournalError> {
        self.append_stamped(entry, || time_ms).await
    }

    async fn append_stamped(
        &self,
        entry: Entry,
        time_ms: impl Fn() -> u64,
    ) -> Result<Ticket, JournalError> {
        loop {
            let notified = self.shared.buffers_freed.notified();
            tokio::pin!(notified);
            // Register before trying, so a buffer freed in between is not missed.
            notified.as_mut().enable();
            match self.try_append_at(&entry, time_ms()) {
                Err(JournalError::Busy) => notified.await,
                other => return other,
            }
        }
    }

    /// Fences the journal from outside the writer (its files were damaged under it): no
    /// further entry becomes durable, exactly as after a failed write.
    pub fn fail(&self, why: String) {
        self.shared.fail(why);
    }

    /// Why the journal failed, for clients and the log.
    pub fn failure(&self) -> String {
        // Also after a writer panic, which poisons the lock: that is a failure to report.
        let b = match self.shared.batcher.lock() {
            Ok(b) => b,
            Err(p) => p.into_inner(),
        };
        b.failed()
            .map_or_else(|| "the journal failed".to_string(), |w| w.to_string())
    }

    /// The segment files, in ring order.
    pub fn segment_paths(&self) -> Vec<PathBuf> {
        (0..self.geo.segments)
            .map(|i| super::ring::segment_path(&self.dir, i))
            .collect()
    }

    /// Resolves once an append is refused because the ring is full (or was, since the last
    /// call): a checkpoint must make room, whatever the ring's fill.
    pub async fn room_wanted(&self) {
        self.shared.room_wanted_notify.notified().await
    }

    /// Whether the last append was refused for room (cleared by the next that fits): an
    /// atomic, for a caller that asks often (a backup, between entries).
    pub fn wants_room(&self) -> bool {
        self.shared.room_wanted.load(Ordering::Acquire)
    }

    /// Waits until every entry appended so far is durable, and returns the LSN the next
    /// append gets. A checkpoint recorded from there (its `from_lsn`) is never ahead of the
    /// journal's durable end: otherwise a crash would drop the entries before it, and the
    /// next run's entries, numbered from the durable end, would fall below `from_lsn`, where
    /// a restore skips them.
    pub async fn settled(&self) -> Result<u64, JournalError> {
        let next = self.status().next_lsn;
        Ticket {
            lsn: next - 1,
            shared: self.shared.clone(),
        }
        .wait()
        .await?;
        Ok(next)
    }

    /// The durable position; changes as writes complete.
    pub fn durable(&self) -> watch::Receiver<Durable> {
        self.shared.durable_tx.subscribe()
    }

    pub fn status(&self) -> JournalStatus {
        let b = self.shared.lock();
        let durable = *self.shared.durable_tx.borrow();
        JournalStatus {
            next_lsn: b.next_lsn(),
            durable,
            write_pos: b.write_pos(),
            head_pos: b.head_pos(),
            used_segments: self.geo.seg_seq(b.write_pos()) - self.geo.seg_seq(b.head_pos()) + 1,
            segments: self.geo.segments,
            segment_bytes: self.geo.segment_size_bytes,
            free_bytes: self
                .geo
                .write_limit(b.head_pos())
                .saturating_sub(b.write_pos()),
            writes_total: self.shared.writes_total.load(Ordering::Relaxed),
            writes_inline: self.shared.writes_inline.load(Ordering::Relaxed),
            room_wanted: self.shared.room_wanted.load(Ordering::Acquire),
        }
    }

    /// The data directory's identity, as the journal's manifest records it (every journal
    /// open for writing has one).
    pub fn data_dir_id(&self) -> DataDirId {
        self.manifest
            .lock()
            .expect("manifest mutex poisoned")
            .data_dir_id
            .clone()
            .expect("set at every open for writing")
    }

    /// Entries up to this LSN were released (the manifest's checkpoint pointer).
    pub fn released_through(&self) -> u64 {
        self.released_through.load(Ordering::Acquire)
    }

    /// Iterates durable entries from `from` (replay). Reads the segment files directly.
    pub fn replay(&self, from: ReplayFrom) -> Result<EntryIter<FileRing>, JournalError> {
        let upto = self.shared.durable_tx.borrow().lsn;
        let m = self
            .manifest
            .lock()
            .expect("manifest mutex poisoned")
            .clone();
        let scanner = Scanner::new(
            FileRing::open(&self.dir, self.geo)?,
            self.geo,
            ScanStart::at(&m.checkpoint)?,
            ScanLimits::of(&m, self.cfg.lookahead_bytes()),
        );
        Ok(EntryIter::new(scanner, from, upto))
    }

    /// Iterates durable entries from `start`, a point an earlier replay reached
    /// ([`EntryIter::resume_point`]): reads only what follows it. `start` must not be behind
    /// the ring's head (released, maybe recycled): an error says so.
    pub fn replay_at(&self, start: ScanStart) -> Result<EntryIter<FileRing>, JournalError> {
        let upto = self.shared.durable_tx.borrow().lsn;
        let m = self
            .manifest
            .lock()
            .expect("manifest mutex poisoned")
            .clone();
        if start.lsn < m.checkpoint.start_lsn || start.pos < m.checkpoint.start_pos {
            return Err(JournalError::InvalidArgument(format!(
                "cannot replay from LSN {}: the journal was released through LSN {}",
                start.lsn, m.checkpoint.released_through_lsn
            )));
        }
        let scanner = Scanner::new(
            FileRing::open(&self.dir, self.geo)?,
            self.geo,
            start,
            ScanLimits::of(&m, self.cfg.lookahead_bytes()),
        );
        Ok(EntryIter::new(scanner, ReplayFrom::Lsn(start.lsn), upto))
    }

    /// Keeps up to `max_bytes` of the newest entries' payloads in memory for
    /// [`recent_from`](Self::recent_from) (0: none): [`super::recent`].
    pub fn keep_recent(&self, max_bytes: u64) {
        self.shared.lock().recent_mut().set_max_bytes(max_bytes);
    }

    /// Up to `max_entries` durable entries from `lsn` on, from memory, each with the point a
    /// replay resumes at after it ([`replay_at`](Self::replay_at)): what a replay of the ring
    /// would return. `None` when memory does not hold `lsn`.
    pub fn recent_from(
        &self,
        lsn: u64,
        max_entries: usize,
    ) -> Option<Vec<(ReplayEntry, ScanStart)>> {
        let upto = self.shared.durable_tx.borrow().lsn;
        self.shared.lock().recent().from(lsn, upto, max_entries)
    }

    /// The replication id at the end of durable entry `lsn`: that of the entries appended
    /// since the history last changed, the checkpoint's when `lsn` is the last entry released
    /// (releasing everything moves the checkpoint to the end of the log), or else read from
    /// the entry. None when it is neither retained nor the last released one. Blocking (may
    /// read the segment files: a scan from the checkpoint, which a checkpoint under load,
    /// asking for the last durable entry, must not wait for).
    pub fn repl_id_after(&self, lsn: u64) -> Result<Option<[u8; REPL_ID_BYTES]>, JournalError> {
        let cp = self
            .manifest
            .lock()
            .expect("manifest mutex poisoned")
            .checkpoint
            .clone();
        if lsn + 1 == cp.start_lsn {
            return cp.prev_repl_id().map(Some);
        }
        if lsn >= cp.start_lsn {
            if let Some(id) = self.shared.lock().repl_id_of(lsn) {
                return Ok(Some(id));
            }
        }
        match self.replay(ReplayFrom::Lsn(lsn))?.next().transpose()? {
            Some(e) if e.lsn == lsn => Ok(Some(e.repl_id)),
            _ => Ok(None),
        }
    }

    /// Releases entries up to and including `lsn` (after a checkpoint): the manifest's
    /// checkpoint pointer moves atomically, then whole segments before the first retained
    /// entry may be recycled. Blocking (fsync + rename); see `release_through`.
    pub fn release_through_blocking(&self, lsn: u64) -> Result<Checkpoint, JournalError> {
        let durable = self.shared.durable_lsn.load(Ordering::Acquire);
        if lsn > durable {
            return Err(JournalError::InvalidArgument(format!(
                "cannot release through LSN {lsn}: only LSN {durable} is durable"
            )));
        }
        let mut m = self.manifest.lock().expect("manifest mutex poisoned");
        if lsn < m.checkpoint.released_through_lsn {
            return Ok(m.checkpoint.clone());
        }
        let cand = self.shared.lock().checkpoint_candidate(lsn);
        let mut next = m.clone();
        next.checkpoint.released_through_lsn = lsn;
        if let Some(c) = cand.filter(|c| c.pos > m.checkpoint.start_pos) {
            next.checkpoint.start_pos = c.pos;
            next.checkpoint.start_lsn = c.lsn;
            next.checkpoint.prev_repl_id_hex = hex_encode(&c.prev_repl_id);
            next.checkpoint.prev_repl_offset = c.prev_repl_offset;
            next.checkpoint.prev_epoch = c.prev_epoch;
        }
        next.store(&self.dir)?;
        *m = next;
        self.released_through
            .store(m.checkpoint.released_through_lsn, Ordering::Release);
        // Only after the manifest is durable may the old segments be overwritten.
        self.shared
            .lock()
            .set_head(m.checkpoint.start_pos, m.checkpoint.start_lsn);
        Ok(m.checkpoint.clone())
    }

    /// Async wrapper of [`Journal::release_through_blocking`].
    pub async fn release_through(self: &Arc<Self>, lsn: u64) -> Result<Checkpoint, JournalError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.release_through_blocking(lsn))
            .await
            .map_err(|e| JournalError::InvalidArgument(format!("release task failed: {e}")))?
    }

    /// Stops accepting appends, writes everything queued, and waits for the writer thread.
    /// Blocking; from async code use `spawn_blocking`.
    pub fn close(mut self) -> Result<Durable, JournalError> {
        self.shutdown();
        let d = *self.shared.durable_tx.borrow();
        match self.shared.lock().failed() {
            Some(why) => Err(JournalError::Failed(why)),
            None => Ok(d),
        }
    }

    fn shutdown(&mut self) {
        self.shared.lock().close();
        self.shared.wake_writer.notify_one();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                self.shared
                    .lock()
                    .set_failed(Arc::from("journal writer thread panicked"));
                self.shared.durable_tx.send_modify(|d| d.failed = true);
            }
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // Drain and join: dropping must not lose queued entries silently. The last handle
        // can go on a runtime worker (a task that outlived the stop), and the join waits on
        // the disk: the worker's other tasks move to another thread meanwhile.
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(|| self.shutdown()),
            _ => self.shutdown(),
        }
    }
}
