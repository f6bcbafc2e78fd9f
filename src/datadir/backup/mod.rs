//! Backups: the current checkpoint and the journal after it, copied into a new data
//! directory that `walrus serve --data-dir` restores from and `walrus verify` checks.
//!
//! The copy is not of files but of the chain ([`copy`]): the checkpoint's RDB, byte
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
//!
//! A backup is written into a staging directory beside its [`target`] (`.NAME.partial`) and
//! renamed into place once complete and synced: a backup cut short (walrus killed, the
//! disk full) is never found under the name asked for, so neither `walrus verify` nor
//! `walrus serve` can take half a backup for a whole one. The staging directory is locked
//! while it is written, so the next backup beside it, to any name, removes those that
//! backups cut short left. It gives up, releasing the pin,
//! when walrus stops or when the ring wants room (an append was refused for it): a backup
//! must not hold back the checkpoint that frees the ring, or writes would wait on it.

pub mod copy;
pub mod cut;
pub mod target;

use super::pitr::Cut;
use super::DataDirError;
use crate::checkpoint::store::Store;
use crate::checkpoint::{CheckpointError, Pin, Request};
use crate::journal::manifest::Manifest;
use crate::journal::{IoBackendChoice, Journal, JournalConfig};
use copy::{new_journal, Read, Summary};
use std::path::{Path, PathBuf};
use target::Target;

use DataDirError::{Failed, Refused};

/// Live backups of a running walrus.
pub struct Backups {
    /// Weak: the journal must close at shutdown; the endpoint that holds this lives on.
    pub journal: std::sync::Weak<Journal>,
    pub store: Store,
    pub checkpoint: tokio::sync::mpsc::Sender<Request>,
    pub pin: Pin,
    /// One backup at a time: a second one would only double the reads and the pin's time.
    pub running: tokio::sync::Mutex<()>,
    /// Set when walrus stops: a backup gives up rather than hold the shutdown.
    pub stop: tokio::sync::watch::Receiver<bool>,
    /// `disk.high_watermark`: a backup on the journal's or checkpoints' file system must
    /// leave it below, or walrus would refuse writes because of its own backup.
    pub high_watermark: f64,
}

impl Backups {
    /// Takes a checkpoint, then copies it and the journal after it into `to` (absolute, new
    /// or empty).
    pub async fn take(&self, to: PathBuf) -> Result<Summary, DataDirError> {
        self.copy(to, true).await
    }

    /// Copies the recorded checkpoint and the whole journal after it into `to`, taking no new
    /// checkpoint: what an in-place rewind starts from, and its way back
    /// (`crate::restore::rewind`). The journal must be settled, with no write coming.
    pub async fn keep(&self, to: PathBuf) -> Result<Summary, DataDirError> {
        self.copy(to, false).await
    }

    async fn copy(&self, to: PathBuf, checkpoint_first: bool) -> Result<Summary, DataDirError> {
        let _one = self.running.try_lock().map_err(|_| {
            Failed("another backup is running; wait for it to finish (one at a time)".into())
        })?;
        if !to.is_absolute() {
            return Err(Refused(format!(
                "{} is not an absolute path (walrus resolves nothing against its working directory)",
                to.display()
            )));
        }
        let journal = self.journal.upgrade().ok_or(Failed(
            "walrus is shutting down: the journal is closed".into(),
        ))?;
        let journal_dir = journal
            .segment_paths()
            .first()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        let live: Vec<PathBuf> = [Some(self.store.dir().to_path_buf()), journal_dir]
            .into_iter()
            .flatten()
            .collect();
        let status = journal.status();
        let geometry = (status.segment_bytes, status.segments);
        let journal_bytes = Read::Open(&journal)
            .used_bytes()
            .map_err(|e| Failed(e.to_string()))?;
        drop(journal);
        // Every step that touches a file system runs off the proxy's threads: a target (or
        // the data's volume) that stopped answering holds the backup, not every client.
        let target = {
            let live = live.clone();
            off_thread(move || Target::prepare(&to, &live)).await??
        };
        if checkpoint_first {
            if let Err(e) = self.checkpoint_first().await {
                return Err(abandon(target, e).await);
            }
        }
        let rdb = self.store.recorded().map_or(0, |cp| cp.size);
        let need = rdb + copy::journal_room(journal_bytes, geometry.0);
        let high = self.high_watermark;
        // On the data's file system the next checkpoint must still fit below the mark. The
        // copy's ring is made before the pin, and checkpoints need not wait for it.
        let (target, staged) = off_thread(move || {
            let staged = target
                .check_room(need, &live, Some((high, rdb)))
                .and_then(|()| new_journal(&target.staging, geometry));
            (target, staged)
        })
        .await?;
        let copy = match staged {
            Ok(copy) => copy,
            Err(e) => return Err(abandon(target, e).await),
        };
        if *self.stop.borrow() {
            let _ = off_thread(move || copy.close()).await;
            let why = Failed("the backup gave up: walrus is stopping".into());
            return Err(abandon(target, why).await);
        }
        let pinned = self.pin.clone().read_owned().await;
        let Some(journal) = self.journal.upgrade() else {
            let closed = Failed("walrus is shutting down: the journal is closed".into());
            return Err(abandon(target, closed).await);
        };
        let store = self.store.clone();
        let runtime = tokio::runtime::Handle::current();
        let stop = self.stop.clone();
        let copied = tokio::task::spawn_blocking(move || {
            let give_up = || {
                if *stop.borrow() {
                    Some("walrus is stopping".to_string())
                } else if journal.wants_room() {
                    Some("the journal's ring wants room, which only a checkpoint can free, and the backup held it back; retry when writes are quieter, or give the ring more segments".to_string())
                } else {
                    None
                }
            };
            target.write(
                &Read::Open(&journal),
                &store,
                copy,
                geometry,
                &runtime,
                &give_up,
                None,
            )
        })
        .await
        .map_err(|e| Failed(format!("the backup task failed: {e}")))?;
        drop(pinned);
        copied
    }

    /// A checkpoint before a backup, so that the copy holds little journal.
    async fn checkpoint_first(&self) -> Result<(), DataDirError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.checkpoint
            .send(tx)
            .await
            .map_err(|_| Failed("the checkpointer is not running".into()))?;
        match rx.await {
            Ok(Ok(_)) => Ok(()),
            // Nothing written since the recorded checkpoint: it is the fresh one.
            Ok(Err(CheckpointError::NotNow(why))) => {
                tracing::info!("backup: no new checkpoint ({why}); copying the recorded one");
                Ok(())
            }
            Ok(Err(e)) => Err(Failed(format!(
                "the checkpoint before the backup failed: {e}"
            ))),
            Err(_) => Err(Failed("the checkpointer stopped".into())),
        }
    }
}

/// Removes what a backup wrote (off the proxy's threads), and returns `why`.
async fn abandon(target: Target, why: DataDirError) -> DataDirError {
    off_thread(move || target.abandon(why))
        .await
        .unwrap_or_else(|failed| failed)
}

/// Runs blocking file-system work on tokio's blocking threads.
async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, DataDirError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failed(format!("the backup task failed: {e}")))
}

/// Offline: copies a stopped walrus's data directory `from` into `to` with a ring of
/// `segments` x `segment_size_bytes` (None: the same as `from`'s). Opening the journal
/// takes its lock: a running walrus is refused.
pub fn offline(
    from: &Path,
    to: &Path,
    geometry: (Option<u64>, Option<u32>),
) -> Result<Summary, DataDirError> {
    let stopped = Stopped::of(from, geometry)?;
    // The journal's lock first: against a running walrus nothing is touched, not even a
    // staging directory its own backup may be writing.
    let cfg = JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::for_geometry(
            stopped.manifest.segment_size_bytes,
            stopped.manifest.segments,
        )
    };
    let (journal, _) = Journal::open(&stopped.journal_dir, &cfg).map_err(|e| {
        Failed(format!(
            "cannot open the journal (is walrus still running?): {e}"
        ))
    })?;
    let copied = stopped.copy(&Read::Open(&journal), to, None);
    journal
        .close()
        .map_err(|e| Failed(format!("closing the journal: {e}")))?;
    copied
}

/// A data directory no walrus runs in (stopped, or a backup), checked as `serve` checks it,
/// to be copied.
pub(super) struct Stopped {
    pub journal_dir: PathBuf,
    pub cp_dir: PathBuf,
    pub manifest: Manifest,
    /// The copy's ring.
    pub geometry: (u64, u32),
}

impl Stopped {
    /// `from`'s parts, which must prove what it holds ([`super::parts::check`]); the
    /// copy's ring is `geometry` (`from`'s where not given).
    pub fn of(from: &Path, geometry: (Option<u64>, Option<u32>)) -> Result<Stopped, DataDirError> {
        let (journal_dir, cp_dir) = super::data_dirs(from);
        super::parts::check(&journal_dir, &cp_dir, None).map_err(|e| match e {
            Refused(why) => Refused(why),
            e => Failed(e.to_string()),
        })?;
        let manifest = Manifest::load(&journal_dir)
            .map_err(|e| Refused(e.to_string()))?
            .ok_or_else(|| Refused(format!("no journal in {}", journal_dir.display())))?;
        let geometry = (
            geometry.0.unwrap_or(manifest.segment_size_bytes),
            geometry.1.unwrap_or(manifest.segments),
        );
        Ok(Stopped {
            journal_dir,
            cp_dir,
            manifest,
            geometry,
        })
    }

    /// Copies the checkpoint and the journal after it, read through `read`, up to `cut`
    /// (all of it: `None`), into the new data directory `to` (blocking).
    pub fn copy(&self, read: &Read, to: &Path, cut: Option<&Cut>) -> Result<Summary, DataDirError> {
        let live = [self.journal_dir.clone(), self.cp_dir.clone()];
        let geometry = self.geometry;
        Target::prepare(to, &live).and_then(|target| {
            let opened = Store::read_only(&self.cp_dir)
                .map_err(|e| Failed(e.to_string()))
                .and_then(|store| {
                    let rdb = store.recorded().map_or(0, |cp| cp.size);
                    // walrus is stopped: the file system only has to hold the copy.
                    let journal = read.used_bytes().map_err(|e| Failed(e.to_string()))?;
                    target.check_room(
                        rdb + copy::journal_room(journal, geometry.0),
                        &live,
                        None,
                    )?;
                    let copy = new_journal(&target.staging, geometry)?;
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| Failed(format!("cannot start a runtime: {e}")))?;
                    Ok((store, copy, runtime))
                });
            match opened {
                Ok((store, copy, runtime)) => target.write(
                    read,
                    &store,
                    copy,
                    geometry,
                    runtime.handle(),
                    &|| None,
                    cut,
                ),
                Err(e) => Err(target.abandon(e)),
            }
        })
    }
}

#[cfg(test)]
mod tests;
