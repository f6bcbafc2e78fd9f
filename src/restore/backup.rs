//! Backups: the current checkpoint and the journal after it, copied into a new data
//! directory that `walrus serve --data-dir` restores from and `walrus verify` checks.
//!
//! The copy is not of files but of the chain ([`chain::walk`]): the checkpoint's RDB, byte
//! for byte (its CRC checked again in the copy), and a new journal holding the stream after
//! the checkpoint's offset, up to the durable end when the copy starts, as new entries from
//! LSN 1 (the copy's checkpoint manifest says `from_lsn = 1`). So the copy is consistent
//! while walrus writes on (only durable entries are read, and only up to where the walk
//! began), holds nothing a restore does not need, and may have another ring geometry than
//! the original: the same copy, offline, is how a ring is resized ([`offline`]).
//!
//! Live ([`Backups::take`], `POST /backup`): a checkpoint first (which keeps the journal to
//! copy short), then the checkpointer's pin ([`crate::checkpoint::Pin`]) held while
//! copying, so that no checkpoint releases the segments being read; a checkpoint that runs
//! meanwhile records its RDB but releases nothing until the copy is done. The RDB is opened
//! before anything else is read: a checkpoint recorded meanwhile deletes its name, and the
//! open file stays readable.

use super::chain::{self, ChainError};
use crate::checkpoint::store::{Checkpoint, Store, CHECKPOINT_FILE};
use crate::checkpoint::{CheckpointError, Pin, Request};
use crate::journal::manifest::{fsync_dir, replace_file, Manifest};
use crate::journal::{Entry, IoBackendChoice, Journal, JournalConfig, JournalError};
use std::path::{Path, PathBuf};

/// What a backup copied.
#[derive(Debug, Clone)]
pub struct Summary {
    pub to: PathBuf,
    pub checkpoint: Checkpoint,
    /// Journal entries and stream bytes after the checkpoint, and where the stream ends.
    pub entries: u64,
    pub stream_bytes: u64,
    pub end_offset: u64,
    pub segments: u32,
    pub segment_size_bytes: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "backup written to {}", self.to.display())?;
        writeln!(
            f,
            "checkpoint: {} ({} bytes of RDB, offset {})",
            self.checkpoint.file, self.checkpoint.size, self.checkpoint.offset
        )?;
        writeln!(
            f,
            "journal: {} entries, {} bytes of stream, offsets {}..{}, in a ring of {} segments of {} bytes",
            self.entries,
            self.stream_bytes,
            self.checkpoint.offset,
            self.end_offset,
            self.segments,
            self.segment_size_bytes
        )
    }
}

/// Live backups of a running walrus.
pub struct Backups {
    /// Weak: the journal must close at shutdown; the endpoint that holds this lives on.
    pub journal: std::sync::Weak<Journal>,
    pub store: Store,
    pub checkpoint: tokio::sync::mpsc::Sender<Request>,
    pub pin: Pin,
    /// One backup at a time: a second one would only double the reads and the pin's time.
    pub running: tokio::sync::Mutex<()>,
}

impl Backups {
    /// Takes a checkpoint, then copies it and the journal after it into `to` (absolute, new
    /// or empty).
    pub async fn take(&self, to: PathBuf) -> Result<Summary, String> {
        let _one = self.running.try_lock().map_err(|_| {
            "another backup is running; wait for it to finish (one at a time)".to_string()
        })?;
        if !to.is_absolute() {
            return Err(format!(
                "{} is not an absolute path (walrus resolves nothing against its working directory)",
                to.display()
            ));
        }
        // Inside the live directories the copy would be taken for walrus's own files (an
        // RDB the store deletes, a journal inside the journal).
        let journal_dir = self
            .journal
            .upgrade()
            .and_then(|j| j.segment_paths().first()?.parent().map(Path::to_path_buf));
        if let Some(live) = [Some(self.store.dir().to_path_buf()), journal_dir]
            .into_iter()
            .flatten()
            .find(|live| to.starts_with(live))
        {
            return Err(format!(
                "{} is inside walrus's own {}: back up elsewhere (e.g. a backups/ directory \
                 beside journal/ and checkpoints/)",
                to.display(),
                live.display()
            ));
        }
        prepare(&to)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.checkpoint
            .send(tx)
            .await
            .map_err(|_| "the checkpointer is not running".to_string())?;
        match rx.await {
            Ok(Ok(_)) => {}
            // Nothing written since the recorded checkpoint: it is the fresh one.
            Ok(Err(CheckpointError::NotNow(why))) => {
                tracing::info!("backup: no new checkpoint ({why}); copying the recorded one")
            }
            Ok(Err(e)) => return Err(format!("the checkpoint before the backup failed: {e}")),
            Err(_) => return Err("the checkpointer stopped".into()),
        }
        let pinned = self.pin.clone().read_owned().await;
        let journal = self
            .journal
            .upgrade()
            .ok_or("walrus is shutting down: the journal is closed")?;
        let store = self.store.clone();
        let runtime = tokio::runtime::Handle::current();
        let geometry = (journal.status().segment_bytes, journal.status().segments);
        let copied =
            tokio::task::spawn_blocking(move || copy(&journal, &store, &to, geometry, &runtime))
                .await
                .map_err(|e| format!("the backup task failed: {e}"))?;
        drop(pinned);
        copied
    }
}

/// Refuses a `to` that holds anything; creates it if missing.
fn prepare(to: &Path) -> Result<(), String> {
    match std::fs::read_dir(to) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(format!(
                    "{} is not empty: a backup goes into a new or empty directory",
                    to.display()
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(to).map_err(|e| format!("cannot create {}: {e}", to.display()))
        }
        Err(e) => Err(format!("cannot read {}: {e}", to.display())),
    }
}

/// Offline: copies a stopped walrus's data directory `from` into `to` with a ring of
/// `segments` x `segment_size_bytes` (None: the same as `from`'s). Opening the journal
/// takes its lock: a running walrus is refused.
pub fn offline(
    from: &Path,
    to: &Path,
    geometry: (Option<u64>, Option<u32>),
) -> Result<Summary, String> {
    let (journal_dir, cp_dir) = super::verify::data_dirs(from);
    let m = Manifest::load(&journal_dir)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no journal in {}", journal_dir.display()))?;
    prepare(to)?;
    let cfg = JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::for_geometry(m.segment_size_bytes, m.segments)
    };
    let (journal, _) = Journal::open(&journal_dir, &cfg)
        .map_err(|e| format!("cannot open the journal (is walrus still running?): {e}"))?;
    let store = Store::read_only(&cp_dir).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let geometry = (
        geometry.0.unwrap_or(m.segment_size_bytes),
        geometry.1.unwrap_or(m.segments),
    );
    let copied = copy(&journal, &store, to, geometry, runtime.handle());
    journal
        .close()
        .map_err(|e| format!("closing the journal: {e}"))?;
    copied
}

/// The copy (blocking). On failure what it wrote is removed: a half-written backup must
/// not be taken for one (its checkpoint manifest, written last, would be missing, and a
/// directory without one is what a walrus that never attached leaves).
fn copy(
    journal: &Journal,
    store: &Store,
    to: &Path,
    geometry: (u64, u32),
    runtime: &tokio::runtime::Handle,
) -> Result<Summary, String> {
    let copied = copy_into(journal, store, to, geometry, runtime);
    if copied.is_err() {
        for part in ["journal", "checkpoints"] {
            let _ = std::fs::remove_dir_all(to.join(part));
        }
    }
    copied
}

/// RDB, then the chain into a new journal, then the manifest that names the RDB, each
/// synced.
fn copy_into(
    journal: &Journal,
    store: &Store,
    to: &Path,
    (segment_size_bytes, segments): (u64, u32),
    runtime: &tokio::runtime::Handle,
) -> Result<Summary, String> {
    let (cp, mut rdb) = open_recorded(store)?;
    let cp_dir = to.join("checkpoints");
    std::fs::create_dir_all(&cp_dir)
        .map_err(|e| format!("cannot create {}: {e}", cp_dir.display()))?;
    let copy_path = cp_dir.join(&cp.file);
    let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", copy_path.display());
    let mut out = std::fs::File::create(&copy_path).map_err(|e| io("creating", e))?;
    std::io::copy(&mut rdb, &mut out).map_err(|e| io("writing", e))?;
    out.sync_all().map_err(|e| io("fsync of", e))?;
    // The copy is checked as a restore checks it: size, CRC-64, format.
    let copied_store = Store::read_only(&cp_dir).map_err(|e| e.to_string())?;
    copied_store.verify(&cp).map_err(|e| e.to_string())?;

    let cfg = JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::for_geometry(segment_size_bytes, segments)
    };
    cfg.validate().map_err(|e| e.to_string())?;
    let (copy, _) = Journal::open(&to.join("journal"), &cfg)
        .map_err(|e| format!("cannot create the backup's journal: {e}"))?;
    let mut failure = None;
    let walked = chain::walk(journal, &cp, |slice| {
        let entry = Entry {
            repl_id: slice.repl_id,
            repl_offset_end: slice.end,
            payload: slice.bytes,
        };
        runtime.block_on(copy.append(entry)).map(drop).map_err(|e| {
            let why = match e {
                JournalError::RingFull { .. } => format!(
                    "the backup's ring ({segments} segments of {segment_size_bytes} bytes) \
                         cannot hold the journal after the checkpoint: give it a larger ring \
                         ({e})"
                ),
                e => format!("writing the backup's journal: {e}"),
            };
            failure = Some(why.clone());
            ChainError::Journal(JournalError::InvalidArgument(why))
        })
    });
    let closed = copy.close();
    if let Some(why) = failure {
        return Err(why);
    }
    let end = walked.map_err(|e| e.to_string())?;
    let durable = closed.map_err(|e| format!("closing the backup's journal: {e}"))?;
    if durable.lsn != end.entries {
        return Err(format!(
            "the backup's journal holds {} entries durably, {} were written",
            durable.lsn, end.entries
        ));
    }
    let record = Checkpoint {
        from_lsn: 1,
        ..cp.clone()
    };
    replace_file(&cp_dir, CHECKPOINT_FILE, record.render().as_bytes())
        .map_err(|e| e.to_string())?;
    fsync_dir(to).map_err(|e| e.to_string())?;
    Ok(Summary {
        to: to.to_path_buf(),
        checkpoint: record,
        entries: end.entries,
        stream_bytes: end.bytes,
        end_offset: end.offset,
        segments,
        segment_size_bytes,
    })
}

/// The recorded checkpoint and its RDB, open. A checkpoint recorded between reading the
/// record and opening its file deletes the file: then the newer record is read again.
fn open_recorded(store: &Store) -> Result<(Checkpoint, std::fs::File), String> {
    // Each retry follows a new checkpoint; more than a few in a row means something else.
    const ATTEMPTS: usize = 5;
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        let cp = store
            .recorded()
            .ok_or("no checkpoint recorded yet: walrus records its first one when it first attaches to Valkey")?;
        match std::fs::File::open(store.path_of(&cp)) {
            Ok(f) => return Ok((cp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                last = format!("{}: {e}", store.path_of(&cp).display())
            }
            Err(e) => return Err(format!("opening {}: {e}", store.path_of(&cp).display())),
        }
    }
    Err(format!(
        "the checkpoint changed {ATTEMPTS} times while the backup opened it ({last})"
    ))
}
