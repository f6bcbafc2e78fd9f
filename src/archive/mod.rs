//! The archive: checkpoints and the journal copied continuously to object storage (S3 or any
//! S3-compatible store, or a mounted directory), so that the loss of this node's disk loses
//! at most the last `archive.max_lag_ms` of acknowledged writes (nothing with
//! `durability.ack = "archive"`), and a new node starts from it.
//!
//! - [`store`]: the objects' store (S3 through `object_store`, [`s3`]; or a directory,
//!   [`dir`]).
//! - [`object`]: what the objects are called and the journal objects' format: each names its
//!   timeline, replication id, offset and LSN ranges, and carries a CRC.
//! - [`manifest`]: the one object replaced, conditionally: the writer and the restore points;
//!   [`owner`]: two walruses never write one archive; [`identity`]: the data directory's
//!   (its `data_dir_id`).
//! - [`upload`]: the uploader task, which reads the journal by the chain's rule ([`read`])
//!   and merges small objects ([`merge`]); [`timeline`]: a timeline's objects read back;
//!   [`retention`]: restore points kept by count and age, and what only the others needed.
//! - [`status`]: how far behind the archive is, for `/status`, the metrics and the gate
//!   (`archive.enforce_max_lag`'s `-MISCONF`, `durability.ack = "archive"`).
//! - [`fetch`]: a data directory made from a restore point (`walrus archive restore`, a
//!   bootstrap), and the restore drill `walrus archive verify`.
//!
//! The archive never slows the path that acknowledges writes: the uploader reads what the
//! journal made durable already. With the default `durability.ack = "local"`, a walrus that
//! cannot reach its archive serves on, says so (`/status`, the log, `walrus_archive_*`), and
//! catches up once it can; with `archive.enforce_max_lag`, writes get `-MISCONF` while the
//! archive is more than `archive.max_lag_ms` behind.

pub mod ask;
mod dir;
pub mod fetch;
pub mod identity;
pub mod manifest;
mod merge;
pub mod object;
pub mod owner;
mod point;
mod read;
pub mod retention;
mod s3;
pub mod status;
pub mod store;
pub mod timeline;
pub mod upload;

use crate::checkpoint::store::Store as LocalStore;
use crate::checkpoint::Pin;
use crate::config::{Ack, Config};
use crate::durability::Durability;
use crate::journal::Journal;
use crate::task::own_thread::OwnThread;
use status::ArchiveStatus;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why the archive cannot be used, or an upload or a restore from it failed.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// `[archive]` cannot work as given: a person must change it.
    #[error("{0}")]
    Config(String),
    /// A request to the store failed (unreachable, refused, slow): it may succeed later.
    #[error("archive store: {0}")]
    Store(String),
    /// Something on this node failed (reading the journal or a checkpoint, a local file).
    #[error("{0}")]
    Local(String),
    /// Another walrus writes the archive.
    #[error("{0}")]
    Owner(String),
    /// An object is not what its name or the manifest says.
    #[error("archive damaged: {0}")]
    Corrupt(String),
    /// An object's or the manifest's text is not what walrus writes; the caller names the
    /// object ([`ArchiveError::Corrupt`]).
    #[error("{0}")]
    Malformed(String),
}

/// One object of a listing, its key relative to the archive's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub size: u64,
    /// When the store says it was written (seconds since the epoch).
    pub modified: i64,
}

/// The version of a conditionally written object, to replace it only if unchanged: the
/// store's ETag, or a directory's CRC-64 of the contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version(String);

impl Version {
    fn of(contents: &[u8]) -> Version {
        Version(format!("{:016x}", crc64(contents)))
    }
}

/// A failed file operation on a directory store, naming the file.
fn io(what: &str, path: &Path, e: std::io::Error) -> ArchiveError {
    ArchiveError::Store(format!("{what} {}: {e}", path.display()))
}

/// The CRC-64 that checks an object's contents (and versions a directory store's).
fn crc64(bytes: &[u8]) -> u64 {
    let mut d = crc64fast::Digest::new();
    d.write(bytes);
    d.sum64()
}

/// The archive's tasks, running.
pub struct Archive {
    pub status: Arc<ArchiveStatus>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Where the uploader runs: taking the journal's entries, encoding objects and sending
    /// them cost CPU in proportion to the bytes written, and the proxy's workers must not
    /// wait behind it.
    thread: OwnThread,
    /// Keeps its newest entries in memory for the uploader ([`crate::journal::recent`]) until
    /// the archive stops.
    journal: Arc<Journal>,
}

impl Archive {
    /// Stops the uploader (before the journal closes); an upload in flight is abandoned,
    /// and the next start finds the archive's end again.
    pub async fn stop(self) {
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        // A file being written to a directory store is finished (not left as a temporary
        // file), and a journal read lets go of the journal before it closes.
        self.thread.stop().await;
        self.journal.keep_recent(0);
    }
}

/// Starts archiving: checks that the archive is this walrus's to write (a refusal names the
/// walrus that writes it; an unreachable store is not a refusal: walrus starts, and the
/// uploader keeps trying), then starts the uploader and the lag clock.
pub async fn start(
    config: &Config,
    journal: Arc<Journal>,
    local: LocalStore,
    pin: Pin,
    durability: Arc<Durability>,
    checkpoint: tokio::sync::mpsc::Sender<crate::checkpoint::Request>,
) -> Result<Archive, ArchiveError> {
    let a = &config.archive;
    let thread = OwnThread::start("walrus-archive")
        .await
        .map_err(|e| ArchiveError::Local(format!("starting the archive's thread: {e}")))?;
    let store = store::Store::open(&a.url, a)?;
    let data_dir = config.data.dir.clone();
    let (dir, id) = (data_dir.clone(), journal.data_dir_id());
    let identity = tokio::task::spawn_blocking(move || identity::of(&dir, &id))
        .await
        .map_err(|e| ArchiveError::Local(e.to_string()))??;
    let timeout = Duration::from_millis(a.request_timeout_ms);
    // On the archive's thread, as every request to the store: the connections it opens
    // are driven there.
    let claim = {
        let (store, identity, data_dir) = (store.clone(), identity.clone(), data_dir.clone());
        thread.handle().spawn(async move {
            tokio::time::timeout(timeout, owner::claim(&store, &identity, &data_dir)).await
        })
    };
    let claimed = claim
        .await
        .map_err(|e| ArchiveError::Local(format!("the archive's first claim failed: {e}")))?;
    match claimed {
        Ok(Err(e @ (ArchiveError::Owner(_) | ArchiveError::Corrupt(_)))) => return Err(e),
        Ok(Err(e)) => tracing::warn!(
            "the archive cannot be reached now ({e}); serving, and uploading once it can"
        ),
        Err(_) => {
            tracing::warn!(url = %a.url, "the archive did not answer within archive.request_timeout_ms; serving, and uploading once it can")
        }
        Ok(Ok(_)) => {
            tracing::info!(url = %a.url, identity = %identity.id, "archiving checkpoints and the journal")
        }
    }
    let max_lag = Duration::from_millis(a.max_lag_ms);
    let status = Arc::new(ArchiveStatus::new(a.url.clone(), max_lag));
    let ack = match config.durability.ack {
        Ack::Local => "local",
        Ack::Archive => "archive",
    };
    crate::metrics::register_archive(&a.url, ack);
    let s = status.clone();
    crate::metrics::on_scrape(move || s.publish_metrics());
    let mut tasks = vec![tokio::spawn(clock(journal.durable(), status.clone()))];
    if a.enforce_max_lag {
        tasks.push(tokio::spawn(bound(status.clone(), durability, max_lag)));
    }
    journal.keep_recent(config.archive_memory_bytes());
    let uploader = upload::Uploader {
        checkpoint: Some(ask::Asker::new(checkpoint)),
        store,
        journal: journal.clone(),
        local,
        pin,
        data_dir,
        identity,
        settings: upload::Settings {
            max_lag,
            object_bytes: config.archive_object_bytes(),
            merge_objects: a.merge_objects,
            checkpoint_after_bytes: config.archive_checkpoint_after_bytes(),
            checkpoint_interval: Duration::from_millis(a.checkpoint_interval_ms),
            keep_restore_points: a.keep_restore_points,
            keep_for: Duration::from_millis(a.keep_for_ms),
            max_backoff: Duration::from_millis(a.max_backoff_ms),
            owner_check_interval: Duration::from_millis(a.owner_check_interval_ms),
            ack_archive: config.durability.ack == Ack::Archive,
        },
        status: status.clone(),
    };
    tasks.push(thread.handle().spawn(uploader.run()));
    Ok(Archive {
        status,
        tasks,
        thread,
        journal,
    })
}

/// Notes when the journal's durable position moves, for the archive's lag.
async fn clock(
    mut durable: tokio::sync::watch::Receiver<crate::journal::Durable>,
    status: Arc<ArchiveStatus>,
) {
    loop {
        let d = *durable.borrow_and_update();
        status.durable(d, Instant::now());
        if durable.changed().await.is_err() {
            return;
        }
    }
}

/// `archive.enforce_max_lag`: writes are refused while the archive lags past `max_lag`.
async fn bound(status: Arc<ArchiveStatus>, gate: Arc<Durability>, max_lag: Duration) {
    let mut tick = tokio::time::interval((max_lag / 8).max(Duration::from_millis(5)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refusing = false;
    loop {
        tick.tick().await;
        let lag = status.lag(Instant::now());
        let over = lag > max_lag;
        if over == refusing {
            continue;
        }
        refusing = over;
        if over {
            let why = format!(
                "writes are refused: the archive is {:.1} s behind the journal, past archive.max_lag_ms ({} ms){}",
                lag.as_secs_f64(),
                max_lag.as_millis(),
                status.error().map(|e| format!(": {e}")).unwrap_or_default()
            );
            tracing::warn!("{why}");
            gate.block_writes_archive(Some(&why));
        } else {
            tracing::info!("the archive caught up: writes are accepted again");
            gate.block_writes_archive(None);
        }
    }
}

#[cfg(test)]
mod tests;
