//! Opening a journal: the directory lock, first initialization (crash-safe: a directory
//! an interrupted init left is finished), recovery from the checkpoint, the repair that
//! cuts at corruption when allowed, the epoch bump, and the writer's start.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Notify};

use super::batcher::{read_tail, Batcher, BatcherInit};
use super::compact;
use super::config::JournalConfig;
use super::engine::{Journal, OpenOptions, Recovered};
use super::error::JournalError;
use super::format::{RecordKey, BLOCK_BYTES};
use super::io::start_writer;
use super::lock::{Access, DirLock};
use super::manifest::{create_dir_durably, fsync_dir, DataDirId, Manifest};
use super::recovery::{key_seals_the_ring, scan, ScanLimits, ScanReport, ScanStart, Tail};
use super::ring::{init_segments, missing_segments, segment_path, FileRing, Geometry, RingRead};
use super::writer::{Durable, WriterState};

fn create_dir(dir: &Path) -> Result<(), JournalError> {
    create_dir_durably(dir).map_err(|e| JournalError::io(format!("creating {}", dir.display()), e))
}

fn new_key() -> Result<RecordKey, JournalError> {
    RecordKey::random().map_err(|e| JournalError::io("drawing the journal's record key", e))
}

fn new_id() -> Result<DataDirId, JournalError> {
    DataDirId::random().map_err(|e| JournalError::io("drawing the data directory's identity", e))
}

/// Loads the manifest and checks it against the configured geometry.
pub fn load_manifest(dir: &Path, cfg: &JournalConfig) -> Result<Option<Manifest>, JournalError> {
    let Some(m) = Manifest::load(dir)? else {
        return Ok(None);
    };
    if m.segment_size_bytes != cfg.segment_size_bytes || m.segments != cfg.segments {
        return Err(JournalError::Layout(format!(
            "journal in {} has segment_size_bytes = {} and segments = {}, but the configuration says {} and {}: \
             set journal.segment_size_bytes and journal.segments to the journal's, or resize the ring as \
             docs/operations.md says (\"Resizing the ring\"); an existing ring is never resized in place",
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
    initialize_with(dir, cfg, false, progress)
}

/// [`initialize`], the segments made `sparse` ([`OpenOptions::sparse`]).
fn initialize_with(
    dir: &Path,
    cfg: &JournalConfig,
    sparse: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(Manifest, u32), JournalError> {
    cfg.validate()?;
    create_dir(dir)?;
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
    let created = init_segments(dir, geo, sparse, progress)?;
    let m = match existing {
        Some(m) => m,
        None => {
            let mut m = Manifest::new(cfg.segment_size_bytes, cfg.segments, new_key()?);
            m.data_dir_id = Some(new_id()?);
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
    if m.compact_end_pos.is_some() {
        compact::check_files(dir, geo)?;
    } else if !missing_segments(dir, geo)?.is_empty() {
        return Err(JournalError::Layout(format!(
            "{} is missing segment files",
            dir.display()
        )));
    }
    let report = scan(
        FileRing::open(dir, geo)?,
        geo,
        ScanStart::at(&m.checkpoint)?,
        ScanLimits::of(&m, cfg.lookahead_bytes()),
    )?;
    check_key(dir, FileRing::open(dir, geo)?, geo, &m, &report)?;
    compact::check_end(dir, &m, report.end.end_pos)?;
    Ok((m, report))
}

/// Cuts the closed journal in `dir` to its log, a compact ring ([`compact`]). Returns the
/// bytes its segment files keep.
pub fn cut(dir: &Path) -> Result<u64, JournalError> {
    let _lock = DirLock::take(dir, Access::Exclusive)?;
    let (mut m, report) = scan_dir(dir, &JournalConfig::default())?;
    if m.checkpoint.start_pos != 0 {
        return Err(JournalError::Layout(format!(
            "{}: only a journal that released nothing is cut (its log starts at position {})",
            dir.display(),
            m.checkpoint.start_pos
        )));
    }
    let geo = Geometry {
        segment_size_bytes: m.segment_size_bytes,
        segments: m.segments,
    };
    let end = report.end.end_pos;
    let keep = end.next_multiple_of(BLOCK_BYTES as u64);
    for i in 0..geo.segments {
        let start = u64::from(i) * geo.segment_size_bytes;
        let len = keep.saturating_sub(start).min(geo.segment_size_bytes);
        let path = segment_path(dir, i);
        let io = |e| JournalError::io(format!("cutting {}", path.display()), e);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io)?;
        f.set_len(len).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    fsync_dir(dir)?;
    m.compact_end_pos = Some(end);
    m.store(dir)?;
    Ok(keep)
}

/// Refuses a manifest whose key seals none of its ring's records ([`key_seals_the_ring`]),
/// asked when a scan accepted no record although the manifest says entries were written
/// (released, or the log's start moved past them).
fn check_key(
    dir: &Path,
    ring: impl RingRead,
    geo: Geometry,
    m: &Manifest,
    report: &ScanReport,
) -> Result<(), JournalError> {
    let written = m.checkpoint.written_through();
    if report.records > 0 || written == 0 || key_seals_the_ring(ring, geo, ScanLimits::of(m, 0))? {
        return Ok(());
    }
    Err(JournalError::Manifest(format!(
        "{}: its record key seals none of the records in the journal's segments, although it says \
         entries through LSN {written} were written: it is another journal's manifest (copied in \
         from another data directory?), and recovery would read this journal as empty. Put back \
         this journal's own MANIFEST (from a backup, or from the copy it was made from)",
        dir.join(super::manifest::MANIFEST_FILE).display()
    )))
}

/// Iterates a journal's entries from `from` to the end of its log, without opening it for
/// writing (no lock, no epoch bump: `walrus verify` reads a backup copy as it is). The same
/// scanner as recovery and [`Journal::replay`], so the same validity rules.
pub fn replay_dir(
    dir: &Path,
    cfg: &JournalConfig,
    from: super::reader::ReplayFrom,
) -> Result<super::reader::EntryIter<FileRing>, JournalError> {
    let (m, report) = scan_dir(dir, cfg)?;
    let geo = Geometry {
        segment_size_bytes: m.segment_size_bytes,
        segments: m.segments,
    };
    let scanner = super::recovery::Scanner::new(
        FileRing::open(dir, geo)?,
        geo,
        ScanStart::at(&m.checkpoint)?,
        ScanLimits::of(&m, cfg.lookahead_bytes()),
    );
    Ok(super::reader::EntryIter::new(
        scanner,
        from,
        report.end.last_lsn(),
    ))
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
        cfg.validate()?;
        create_dir(dir)?;
        let lock = DirLock::take(dir, Access::Exclusive)?;
        let geo = Geometry {
            segment_size_bytes: cfg.segment_size_bytes,
            segments: cfg.segments,
        };
        let existing = load_manifest(dir, cfg)?;
        if existing
            .as_ref()
            .is_some_and(|m| m.compact_end_pos.is_some())
        {
            // A backup's compact ring: what it holds is proven before it is filled out.
            scan_dir(dir, cfg)?;
            compact::fill_out(dir, geo, opts.sparse)?;
        } else if !opts.accept_data_loss && existing.is_some() {
            // A MANIFEST is written only once every segment exists: a segment missing now
            // was deleted, with the entries in it. Re-creating it blank would hide the loss.
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
        let (mut manifest, created) = initialize_with(dir, cfg, opts.sparse, &mut log_progress())?;
        if manifest.compact_end_pos.take().is_some() {
            tracing::info!(dir = %dir.display(), "a backup's compact journal filled out to its whole ring");
        }
        let checkpoint = manifest.checkpoint.clone();
        let mut ring = FileRing::open(dir, geo)?;
        let report = scan(
            &mut ring,
            geo,
            ScanStart::at(&checkpoint)?,
            ScanLimits::of(&manifest, cfg.lookahead_bytes()),
        )?;
        check_key(dir, &mut ring, geo, &manifest, &report)?;
        let mut cut_corruption = None;
        match &report.tail {
            Tail::Corrupt(c) if !opts.accept_data_loss => {
                return Err(JournalError::Corrupt(c.clone()))
            }
            Tail::Corrupt(c) => {
                tracing::warn!(corruption = %c, "accepting data loss: cutting the journal at the corruption");
                crate::fault::fail_point!("journal::repair::found");
                let (from, to) = report.repair_range(geo);
                zero_range(dir, geo, from, to)?;
                crate::fault::fail_point!("journal::repair::cut");
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
        // One made before data directories had an identity gets one; the checkpoints'
        // manifest takes it too, once the two are found to agree (`crate::datadir::parts`).
        if manifest.data_dir_id.is_none() {
            manifest.data_dir_id = Some(new_id()?);
        }
        manifest.store(dir)?;
        crate::fault::fail_point!("journal::repair::stored", cut_corruption.is_some());
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
            room_wanted: std::sync::atomic::AtomicBool::new(false),
            room_wanted_notify: Notify::new(),
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
            released_through: AtomicU64::new(manifest.checkpoint.released_through_lsn),
            manifest: Arc::new(Mutex::new(manifest)),
            thread: Some(thread),
            backend,
            _lock: lock,
        };
        Ok((journal, recovered))
    }
}
