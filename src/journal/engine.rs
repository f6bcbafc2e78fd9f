//! The journal handle: open (initialize, recover), append, durability watch, replay,
//! release. This is the API the durable write path drives.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use tokio::sync::{watch, Notify};

use super::batcher::{read_tail, Batcher, BatcherInit};
use super::config::JournalConfig;
use super::error::{Corruption, JournalError};
use super::format::{RecordKey, REPL_ID_BYTES};
use super::io::{start_writer, BackendInfo};
use super::manifest::{hex_encode, Checkpoint, Manifest};
use super::reader::{EntryIter, ReplayFrom};
use super::recovery::{scan, LogEnd, ScanLimits, ScanReport, ScanStart, Scanner, Tail};
use super::ring::{init_missing_segments, missing_segments, segment_path, FileRing, Geometry};
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
    /// Writes submitted since open, and those done as a direct blocking call (queue depth 1).
    pub writes_total: u64,
    pub writes_inline: u64,
}

/// A journal open for writing.
pub struct Journal {
    shared: Arc<WriterState>,
    dir: PathBuf,
    geo: Geometry,
    cfg: JournalConfig,
    manifest: Arc<Mutex<Manifest>>,
    thread: Option<JoinHandle<()>>,
    backend: BackendInfo,
    /// Exclusive flock on `dir/LOCK`, held while open: one writer per journal.
    _lock: std::fs::File,
}

const LOCK_FILE: &str = "LOCK";

/// Takes an exclusive, non-blocking flock on `dir/LOCK` (released when the file closes,
/// including when the process dies).
fn lock_dir(dir: &Path) -> Result<std::fs::File, JournalError> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(dir)
        .map_err(|e| JournalError::io(format!("creating {}", dir.display()), e))?;
    let path = dir.join(LOCK_FILE);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| JournalError::io(format!("opening {}", path.display()), e))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(JournalError::io(
            format!(
                "journal {} is open in another process (flock on {})",
                dir.display(),
                path.display()
            ),
            e,
        ));
    }
    Ok(f)
}

/// How recovery reads this journal's records: its key, epochs and look-ahead.
pub fn scan_limits(m: &Manifest, cfg: &JournalConfig) -> ScanLimits {
    let (key, keyed_from_epoch, unkeyed_below_pos) = m.record_keys();
    ScanLimits {
        max_epoch: m.epoch,
        lookahead_bytes: cfg.lookahead_bytes(),
        key,
        keyed_from_epoch,
        unkeyed_below_pos,
        resumed_at_pos: m.resumed_at_pos,
    }
}

fn new_key() -> Result<RecordKey, JournalError> {
    RecordKey::random().map_err(|e| JournalError::io("drawing the journal's record key", e))
}

/// Where recovery starts: the checkpoint.
pub fn scan_start(cp: &Checkpoint) -> Result<ScanStart, JournalError> {
    Ok(ScanStart {
        pos: cp.start_pos,
        lsn: cp.start_lsn,
        repl_id: cp.prev_repl_id()?,
        repl_offset: cp.prev_repl_offset,
        epoch: cp.prev_epoch,
    })
}

/// Loads the manifest and checks it against the configured geometry.
pub fn load_manifest(dir: &Path, cfg: &JournalConfig) -> Result<Option<Manifest>, JournalError> {
    let Some(m) = Manifest::load(dir)? else {
        return Ok(None);
    };
    if m.segment_size_bytes != cfg.segment_size_bytes || m.segments != cfg.segments {
        return Err(JournalError::Layout(format!(
            "journal in {} has segment_size_bytes = {} and segments = {}, but the configuration says {} and {}; \
             resizing an existing journal is not supported",
            dir.display(),
            m.segment_size_bytes,
            m.segments,
            cfg.segment_size_bytes,
            cfg.segments
        )));
    }
    Ok(Some(m))
}

/// Creates the manifest (if missing) and zero-fills missing segments, reporting progress.
pub fn initialize(
    dir: &Path,
    cfg: &JournalConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(Manifest, u32), JournalError> {
    cfg.validate().map_err(JournalError::Config)?;
    std::fs::create_dir_all(dir)
        .map_err(|e| JournalError::io(format!("creating {}", dir.display()), e))?;
    let geo = Geometry {
        segment_size_bytes: cfg.segment_size_bytes,
        segments: cfg.segments,
    };
    let existing = load_manifest(dir, cfg)?;
    if existing.is_none() {
        let missing = missing_segments(dir, geo)?;
        if missing.len() != geo.segments as usize {
            // Segments exist but no MANIFEST: an initialization was interrupted (the
            // MANIFEST is written last), or the directory holds something else. The journal
            // writes no record before its MANIFEST exists, so an interrupted init left only
            // zero-filled segments: finish it. Anything else is not guessed at.
            if let Some(path) = first_written_segment(dir, geo, &missing)? {
                return Err(JournalError::Layout(format!(
                    "{} holds segment files but no MANIFEST, and {} is not zero-filled (not an interrupted initialization); refusing to guess their state",
                    dir.display(),
                    path.display()
                )));
            }
            tracing::info!(
                dir = %dir.display(),
                "finishing an interrupted journal initialization (no MANIFEST, zero-filled segments)"
            );
        }
    }
    let created = init_missing_segments(dir, geo, progress)?;
    let m = match existing {
        Some(m) => m,
        None => {
            let m = Manifest::new(cfg.segment_size_bytes, cfg.segments, new_key()?);
            m.store(dir)?;
            m
        }
    };
    Ok((m, created))
}

/// The first present segment holding a byte other than zero, if any.
fn first_written_segment(
    dir: &Path,
    geo: Geometry,
    missing: &[u32],
) -> Result<Option<std::path::PathBuf>, JournalError> {
    use std::io::Read;
    let mut chunk = vec![0u8; 1 << 20];
    for i in (0..geo.segments).filter(|i| !missing.contains(i)) {
        let path = segment_path(dir, i);
        let io = |e| JournalError::io(format!("reading {}", path.display()), e);
        let mut f = std::fs::File::open(&path).map_err(io)?;
        loop {
            let n = f.read(&mut chunk).map_err(io)?;
            if n == 0 {
                break;
            }
            if chunk[..n].iter().any(|&b| b != 0) {
                return Ok(Some(path));
            }
        }
    }
    Ok(None)
}

/// Scans a journal without opening it for writing (verify, inspect).
pub fn scan_dir(dir: &Path, cfg: &JournalConfig) -> Result<(Manifest, ScanReport), JournalError> {
    let m = Manifest::load(dir)?.ok_or_else(|| {
        JournalError::Layout(format!(
            "no MANIFEST in {}: not a journal directory",
            dir.display()
        ))
    })?;
    let geo = Geometry {
        segment_size_bytes: m.segment_size_bytes,
        segments: m.segments,
    };
    if !missing_segments(dir, geo)?.is_empty() {
        return Err(JournalError::Layout(format!(
            "{} is missing segment files",
            dir.display()
        )));
    }
    let report = scan(
        FileRing::open(dir, geo)?,
        geo,
        scan_start(&m.checkpoint)?,
        scan_limits(&m, cfg),
    )?;
    Ok((m, report))
}

/// Overwrites `[from, to)` with zeros and syncs, so that records left after a cut can
/// never be taken as evidence or continuation later.
fn zero_range(dir: &Path, geo: Geometry, from: u64, to: u64) -> Result<(), JournalError> {
    use std::os::unix::fs::FileExt;
    let zeros = vec![0u8; 1 << 20];
    let mut p = from;
    while p < to {
        let seg_end = geo.seg_end(p).min(to);
        let path = segment_path(dir, geo.seg_index(p));
        let zeroing = |e| JournalError::io(format!("zeroing {}", path.display()), e);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| JournalError::io(format!("opening {}", path.display()), e))?;
        while p < seg_end {
            let n = (seg_end - p).min(zeros.len() as u64);
            f.write_all_at(&zeros[..n as usize], geo.seg_off(p))
                .map_err(zeroing)?;
            p += n;
        }
        f.sync_data().map_err(zeroing)?;
    }
    Ok(())
}

/// Calls made from inside the writer: progress logging for segment initialization.
fn log_progress() -> impl FnMut(u64, u64) {
    let mut last_decile = None;
    move |done, total| {
        if total == 0 {
            return;
        }
        let decile = done * 10 / total;
        if last_decile != Some(decile) {
            last_decile = Some(decile);
            tracing::info!(
                done_bytes = done,
                total_bytes = total,
                "initializing journal segments: {}%",
                decile * 10
            );
        }
    }
}

impl Journal {
    /// Opens (creating and initializing as needed) and recovers the journal in `dir`.
    /// Blocking: call it before serving, or from `spawn_blocking`.
    pub fn open(dir: &Path, cfg: &JournalConfig) -> Result<(Journal, Recovered), JournalError> {
        Journal::open_with(dir, cfg, OpenOptions::default())
    }

    pub fn open_with(
        dir: &Path,
        cfg: &JournalConfig,
        opts: OpenOptions,
    ) -> Result<(Journal, Recovered), JournalError> {
        cfg.validate().map_err(JournalError::Config)?;
        let lock = lock_dir(dir)?;
        let geo = Geometry {
            segment_size_bytes: cfg.segment_size_bytes,
            segments: cfg.segments,
        };
        // A MANIFEST is written only once every segment exists: a segment missing now was
        // deleted, with the entries in it. Re-creating it blank would hide the loss.
        if !opts.accept_data_loss && load_manifest(dir, cfg)?.is_some() {
            let missing = missing_segments(dir, geo)?;
            if !missing.is_empty() {
                return Err(JournalError::Layout(format!(
                    "{} lacks segment files its MANIFEST says exist ({}): they were deleted, with their entries. \
                     `walrus journal repair --dir {} --accept-data-loss` re-creates them and cuts the log at the gap; \
                     a Valkey that still runs then gives walrus the rest back (docs/failure-modes.md)",
                    dir.display(),
                    missing
                        .iter()
                        .map(|i| segment_path(dir, *i).display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    dir.display()
                )));
            }
        }
        let (mut manifest, created) = initialize(dir, cfg, &mut log_progress())?;
        let checkpoint = manifest.checkpoint.clone();
        let mut ring = FileRing::open(dir, geo)?;
        let report = scan(
            &mut ring,
            geo,
            scan_start(&checkpoint)?,
            scan_limits(&manifest, cfg),
        )?;
        let mut cut_corruption = None;
        match &report.tail {
            Tail::Corrupt(c) if !opts.accept_data_loss => {
                return Err(JournalError::Corrupt(c.clone()))
            }
            Tail::Corrupt(c) => {
                tracing::warn!(corruption = %c, "accepting data loss: cutting the journal at the corruption");
                let (from, to) = report.repair_range(geo);
                zero_range(dir, geo, from, to)?;
                cut_corruption = Some(c.clone());
            }
            Tail::End { .. } => {}
        }
        manifest.epoch = manifest
            .epoch
            .checked_add(1)
            .ok_or_else(|| JournalError::Manifest("epoch counter exhausted".into()))?;
        manifest.resume_at(report.end.end_pos);
        // A journal made before record keys: its records stay readable, new ones are keyed.
        manifest.upgrade(new_key)?;
        manifest.store(dir)?;
        let end = report.end;
        let starts = report
            .segments
            .iter()
            .filter_map(|s| s.first_entry_start)
            .collect();
        let tail = read_tail(&mut ring, geo, end.end_pos)
            .map_err(|e| JournalError::io("reading the journal's last block", e))?;
        let batcher = Batcher::new(BatcherInit {
            geo,
            epoch: manifest.epoch,
            key: manifest.record_keys().0,
            next_lsn: end.next_lsn,
            end_pos: end.end_pos,
            tail,
            head_pos: checkpoint.start_pos,
            last_repl_id: end.last_repl_id,
            last_repl_offset: end.last_repl_offset,
            last_epoch: end.last_epoch,
            starts,
            write_buffers: cfg.write_buffers as usize,
            max_write_bytes: cfg.max_write_bytes as usize,
            max_entry_bytes: cfg.max_entry(),
        });
        let durable = Durable {
            lsn: end.last_lsn(),
            repl_offset: end.last_repl_offset,
            failed: false,
        };
        let (durable_tx, _) = watch::channel(durable);
        let shared = Arc::new(WriterState {
            batcher: Mutex::new(batcher),
            wake_writer: Notify::new(),
            buffers_freed: Notify::new(),
            durable_tx,
            durable_lsn: AtomicU64::new(durable.lsn),
            writes_total: AtomicU64::new(0),
            writes_inline: AtomicU64::new(0),
        });
        let (backend, thread) = start_writer(dir, geo, cfg, shared.clone())?;
        tracing::info!(
            dir = %dir.display(),
            backend = %backend,
            segment_size_bytes = geo.segment_size_bytes,
            segments = geo.segments,
            epoch = manifest.epoch,
            last_lsn = end.last_lsn(),
            last_repl_offset = end.last_repl_offset,
            entries = report.entries,
            "journal open"
        );
        let recovered = Recovered {
            end,
            entries: report.entries,
            checkpoint,
            tail: report.tail.clone(),
            cut_corruption,
            segments_initialized: created,
            backend,
            epoch: manifest.epoch,
        };
        let journal = Journal {
            shared,
            dir: dir.to_path_buf(),
            geo,
            cfg: cfg.clone(),
            manifest: Arc::new(Mutex::new(manifest)),
            thread: Some(thread),
            backend,
            _lock: lock,
        };
        Ok((journal, recovered))
    }

    pub fn backend(&self) -> BackendInfo {
        self.backend
    }

    /// Appends without waiting. Errors immediately with RingFull (release segments first),
    /// Busy (every write buffer is queued), EntryTooLarge, Failed or Closed.
    pub fn try_append(&self, entry: &Entry) -> Result<Ticket, JournalError> {
        let hint = self.shared.durable_lsn.load(Ordering::Acquire);
        let placed = self.shared.lock().append(
            &entry.repl_id,
            entry.repl_offset_end,
            &entry.payload,
            hint,
        )?;
        self.shared.wake_writer.notify_one();
        Ok(Ticket {
            lsn: placed.lsn,
            shared: self.shared.clone(),
        })
    }

    /// Appends, waiting for a free write buffer when all are queued (Busy). RingFull and
    /// the other errors are returned immediately.
    pub async fn append(&self, entry: Entry) -> Result<Ticket, JournalError> {
        loop {
            let notified = self.shared.buffers_freed.notified();
            tokio::pin!(notified);
            // Register before trying, so a buffer freed in between is not missed.
            notified.as_mut().enable();
            match self.try_append(&entry) {
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
            writes_total: self.shared.writes_total.load(Ordering::Relaxed),
            writes_inline: self.shared.writes_inline.load(Ordering::Relaxed),
        }
    }

    /// Entries up to this LSN were released (the manifest's checkpoint pointer).
    pub fn released_through(&self) -> u64 {
        self.manifest
            .lock()
            .expect("manifest mutex poisoned")
            .checkpoint
            .released_through_lsn
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
            scan_start(&m.checkpoint)?,
            scan_limits(&m, &self.cfg),
        );
        Ok(EntryIter::new(scanner, from, upto))
    }

    /// The replication id at the end of durable entry `lsn`: read from the entry, or from
    /// the checkpoint when `lsn` is the last entry released (releasing everything moves the
    /// checkpoint to the end of the log). None when it is neither retained nor the last
    /// released one. Blocking (reads the segment files).
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
        // Only after the manifest is durable may the old segments be overwritten.
        self.shared.lock().set_head(m.checkpoint.start_pos);
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
        // Drain and join: dropping must not lose queued entries silently.
        self.shutdown();
    }
}
