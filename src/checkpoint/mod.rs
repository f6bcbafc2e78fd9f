//! Checkpoints: an RDB of the whole dataset, taken by a fresh full synchronization and stored
//! durably, covers every journal entry before it, so the ring can recycle those segments.
//!
//! When the ring's room or the restore budget requires one, or the ring reaches its fill
//! trigger, or `walrus checkpoint` asks ([`trigger`]), walrus opens a second replica
//! connection, asks for a full resynchronization (`PSYNC ? -1`), stores the RDB under
//! `<data>/checkpoints/` ([`rdb_file`]: temp file, fsync, rename, directory fsync), records it in the
//! checkpoint manifest ([`store`], [`manifest`]), and only then releases the journal through the last
//! entry that was durable *before* it asked: the RDB was cut later, at a higher offset of the
//! same replication history (or of the one the link began right after that entry:
//! [`attached`]), so it contains all of those entries' effects. Older checkpoint
//! files are deleted once the new one is recorded; the newest one, plus the journal after
//! it, is what a restore needs.
//!
//! The journal never releases an entry a restore from the recorded checkpoint could need
//! (`from_lsn` and after); an RDB whose history differs from the journal's last durable
//! entry, or that arrived after Valkey was lost, is discarded.

pub mod attached;
pub mod manifest;
pub mod pace;
mod plan;
pub mod rates;
pub mod rdb_file;
pub mod store;
pub mod trigger;

use crate::durability::{Durability, LinkState};
use crate::journal::Journal;
use crate::upstream::client::{Conn, UpstreamError};
use crate::upstream::info;
use crate::upstream::server::ServerVersion;
use crate::upstream::Upstream;
use crate::valkey::handshake::{handshake, Purpose, SyncStart};
use std::sync::Arc;
use std::time::Duration;
use store::Store;
use tokio::sync::{mpsc, oneshot, Notify};

const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

pub struct CheckpointConfig {
    pub store: Store,
    pub max_rdb_bytes: u64,
    /// When checkpoints are due ([`trigger`]).
    pub policy: trigger::Policy,
    /// What this process's restores measured, for the restore estimate.
    pub rates: Arc<rates::LearnedRates>,
    /// The room a new RDB needs on disk.
    pub room: crate::disk::Room,
    /// Set from a failed checkpoint until one succeeds: a full ring then refuses writes
    /// ([`crate::disk`]).
    pub failing: Arc<std::sync::atomic::AtomicBool>,
    /// Where the history the link follows began ([`attached`]).
    pub attached: Arc<attached::Attached>,
    /// Backups in progress ([`Pin`]).
    pub pin: Pin,
    /// The replica link's pace while a checkpoint runs.
    pub pace: pace::Pace,
    /// Whether one runs now, and since when (`INFO persistence`).
    pub in_progress: Arc<InProgress>,
}

/// Since when the checkpoint running now runs, for those who report it (`INFO
/// persistence`'s `rdb_bgsave_in_progress`); set by the checkpointer only.
#[derive(Debug, Default)]
pub struct InProgress(std::sync::atomic::AtomicU64);

impl InProgress {
    /// The Unix time (seconds) the running checkpoint started at; `None`: none runs.
    pub fn since(&self) -> Option<u64> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    /// A checkpoint starts; it runs until the returned guard is dropped (however it ends).
    fn begin(&self) -> Running<'_> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs().max(1));
        self.0.store(now, std::sync::atomic::Ordering::Relaxed);
        Running(self)
    }
}

struct Running<'a>(&'a InProgress);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        (self.0).0.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Held (read) by a backup while it copies the journal: no entry is released meanwhile, so
/// no segment it reads is recycled. The checkpointer takes it (write) around each release;
/// a release waits for the copy to finish, and the ring may fill meanwhile (writes then wait,
/// as for any checkpoint; docs/operations.md).
pub type Pin = Arc<tokio::sync::RwLock<()>>;

/// A request for a checkpoint now (`walrus checkpoint`); answered with a summary or why not.
pub type Request = oneshot::Sender<Result<String, CheckpointError>>;

/// Why no checkpoint was taken.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A manifest's text is not what walrus writes; the caller names the file.
    #[error("{0}")]
    Malformed(String),
    /// There is nothing to take one of yet: not a failure of checkpoints.
    #[error("{0}")]
    NotNow(&'static str),
    #[error("{0}")]
    Valkey(#[from] crate::upstream::client::UpstreamError),
    #[error("{0}")]
    NoRoom(#[from] crate::disk::DiskError),
    #[error("{0}")]
    Store(#[from] store::StoreError),
    /// Valkey's history changed while the RDB was taken: it proves nothing about the journal.
    #[error("checkpoint at {replid}:{offset} does not cover journal entry {lsn} at {covered_replid}:{covered_offset}")]
    Uncovered {
        replid: String,
        offset: u64,
        lsn: u64,
        covered_replid: String,
        covered_offset: u64,
    },
    #[error("cannot read the last durable entry")]
    NoDurableEntry,
    #[error("checkpoint task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl CheckpointError {
    fn is_valkey_unreachable(&self) -> bool {
        use crate::upstream::client::UpstreamError;
        matches!(
            self,
            CheckpointError::Valkey(
                UpstreamError::Connect { .. } | UpstreamError::ConnectTimeout(_)
            )
        )
    }
}

/// Takes checkpoints whenever one is due ([`trigger`]) or requested, and releases the
/// journal entries no restore can need any more; `released` is notified after each release
/// (the replica link waits on it when the ring is full).
pub async fn run(
    up: Upstream,
    journal: Arc<Journal>,
    durability: Arc<Durability>,
    cfg: CheckpointConfig,
    released: Arc<Notify>,
    mut requests: mpsc::Receiver<Request>,
) {
    let mut durable = journal.durable();
    // The last failure logged: a checkpoint that keeps failing the same way (no room) is
    // retried every second, and logged once until the reason changes.
    let mut last_failure = String::new();
    // Valkey's used memory when the last RDB was taken here: the next one's size is
    // estimated from it.
    let mut last_sizes: Option<Sizes> = None;
    let mut planner = plan::Planner::new(cfg.policy, cfg.rates.clone());
    loop {
        if release_unneeded(&journal, &cfg.store, &cfg.pin).await {
            released.notify_waiters();
        }
        let now = std::time::Instant::now();
        if planner.wants_used_memory(now) && durability.status() == LinkState::Attached {
            let memory = match Conn::control(&up).await {
                Ok(mut conn) => used_memory(&mut conn).await.ok(),
                Err(_) => None,
            };
            planner.used_memory(now, memory);
        }
        let (reason, asked) = match planner.due(&journal, &cfg.store, now) {
            // A request waiting meanwhile is answered by this checkpoint, which starts
            // after it was made.
            Some(reason) => (reason, requests.try_recv().ok()),
            None => tokio::select! {
                r = durable.changed() => if r.is_err() { return } else { continue },
                // The link waits for room: `due` sees it next time round.
                _ = journal.room_wanted() => continue,
                r = requests.recv() => match r {
                    Some(tx) => (trigger::Reason::Request, Some(tx)),
                    None => std::future::pending().await,
                },
            },
        };
        let (epoch, before) = match possible(&journal, &durability) {
            Ok(p) => p,
            Err(why) => {
                // Not a failure of checkpoints: there is nothing to take one of yet.
                if let Some(tx) = asked {
                    let _ = tx.send(Err(why));
                }
                tokio::time::sleep(RETRY_AFTER_FAILURE).await;
                continue;
            }
        };
        reason.kind().count();
        // A retry after a failure is not logged again: the failure was.
        if last_failure.is_empty() {
            tracing::info!("checkpoint started: {reason}");
        }
        let started = std::time::Instant::now();
        let expected =
            planner.checkpoint_seconds(cfg.store.recorded_extent().map_or(0, |c| c.size));
        let pacing = cfg.pace.begin(expected);
        let running = cfg.in_progress.begin();
        let result = take(
            &up,
            &journal,
            epoch,
            before,
            &durability,
            &cfg,
            &mut last_sizes,
        )
        .await;
        drop((pacing, running));
        match &result {
            Ok(summary) => {
                tracing::info!("{summary}");
                crate::metrics::CHECKPOINTS.inc();
                let seconds = started.elapsed().as_secs_f64();
                planner.took(seconds);
                crate::metrics::CHECKPOINT_LAST_DURATION.set(seconds);
                crate::metrics::CHECKPOINT_LAST_SUCCESS.set(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64()),
                );
                if let Some(s) = last_sizes {
                    crate::metrics::CHECKPOINT_LAST_SIZE.set(s.rdb_bytes as i64);
                }
                cfg.failing
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                last_failure.clear();
                released.notify_waiters();
            }
            Err(e) => {
                crate::metrics::CHECKPOINT_FAILURES.inc();
                // A Valkey that cannot be reached (restarting, being restored) is not
                // checkpoints failing: writes fail or wait on it anyway, and the retry after
                // it is back succeeds. Counted as failing, a full ring refused writes for
                // that second after every Valkey restart.
                if !e.is_valkey_unreachable() && same_valkey(&up, &durability, epoch).await {
                    cfg.failing
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                // Once per kind of failure: the text after its first ':' carries figures
                // that change on every retry.
                let text = e.to_string();
                let kind = text.split(':').next().unwrap_or(&text);
                if kind != last_failure {
                    tracing::warn!("checkpoint failed: {e}");
                    last_failure = kind.to_string();
                }
            }
        }
        let failed = result.is_err();
        if let Some(tx) = asked {
            let _ = tx.send(result);
        }
        if failed {
            tokio::time::sleep(RETRY_AFTER_FAILURE).await;
        }
    }
}

/// Whether the Valkey process a checkpoint of `epoch` was taken of is still the one walrus
/// follows, and answers: a checkpoint cut short by Valkey's death (a connection closed in the
/// middle of its RDB, before the supervisor or the link noticed) is no sign that checkpoints
/// fail, and the retry after the restore succeeds.
async fn same_valkey(up: &Upstream, durability: &Durability, epoch: u64) -> bool {
    let Some((now, run_id)) = durability.attached(None) else {
        return false;
    };
    if now != epoch {
        return false;
    }
    match Conn::control(up).await {
        Ok(mut conn) => crate::upstream::server::run_id(&mut conn)
            .await
            .is_ok_and(|answering| answering == run_id),
        Err(_) => false,
    }
}

/// Releases journal entries before the current checkpoint's `from_lsn`: a restore starts
/// there, so nothing before it is needed (they are in its RDB, or belong to a history it
/// replaced). Returns whether anything was released.
async fn release_unneeded(journal: &Arc<Journal>, store: &Store, pin: &Pin) -> bool {
    let _no_backup_copying = pin.write().await;
    let Some(from_lsn) = store.recorded_from_lsn() else {
        return false;
    };
    let upto = (from_lsn - 1).min(journal.durable().borrow().lsn);
    if upto <= journal.released_through() {
        return false;
    }
    match journal.release_through(upto).await {
        Ok(released) => {
            check_retained(&released, from_lsn);
            true
        }
        Err(e) => {
            tracing::warn!("cannot release the journal through LSN {upto}: {e}");
            false
        }
    }
}

/// Checks what the journal retains after a release against the stored checkpoint's
/// `from_lsn`, the first entry a restore from it replays. Paired with
/// [`crate::datadir::parts`], which refuses at start-up a journal released through it: here
/// it is caught where the release happens, before a crash could make it a restore's gap.
fn check_retained(released: &crate::journal::manifest::Checkpoint, from_lsn: u64) {
    assert!(
        released.released_through_lsn < from_lsn && released.start_lsn <= from_lsn,
        "the journal released entries a restore from the stored checkpoint needs (from LSN \
         {from_lsn}): released through LSN {}, retained from LSN {}",
        released.released_through_lsn,
        released.start_lsn
    );
}

/// An RDB's size and Valkey's used memory when it was taken.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    rdb_bytes: u64,
    used_memory: u64,
}

/// Valkey's `used_memory`.
async fn used_memory(conn: &mut Conn) -> Result<u64, UpstreamError> {
    let text = info::section(conn, "memory").await?;
    info::number(&text, "memory", "used_memory")
}

/// How large the next RDB will be, and how that was judged: the last RDB grown with
/// Valkey's memory since; with none taken by this process, the larger of the recorded one's
/// size and Valkey's whole used memory (an RDB is rarely larger than that).
fn estimate(last: Option<Sizes>, recorded: Option<u64>, used_memory: u64) -> (u64, String) {
    match (last, recorded) {
        (Some(l), _) if l.used_memory > 0 => {
            let grown = (l.rdb_bytes as f64 * used_memory as f64 / l.used_memory as f64) as u64;
            let est = grown.max(l.rdb_bytes);
            (
                est,
                format!(
                    "the last RDB, {} bytes, scaled by Valkey's memory since",
                    l.rdb_bytes
                ),
            )
        }
        (_, Some(size)) if size >= used_memory => {
            (size, "the size of the current checkpoint".into())
        }
        _ => (used_memory, "Valkey's used_memory".into()),
    }
}

/// Whether a checkpoint can be taken now: the link attached and something durable to
/// release. Returns the history epoch and the durable position it would cover.
fn possible(
    journal: &Journal,
    durability: &Durability,
) -> Result<(u64, crate::journal::Durable), CheckpointError> {
    if durability.status() != LinkState::Attached {
        return Err(CheckpointError::NotNow("the replica link is not attached"));
    }
    let epoch = durability.epoch();
    let before = *journal.durable().borrow();
    if before.lsn == 0 || before.failed {
        return Err(CheckpointError::NotNow("nothing durable to release"));
    }
    Ok((epoch, before))
}

/// Takes a checkpoint covering `before` (durable in history `epoch`): a fresh full sync's
/// RDB, stored and recorded, then the journal released before it. Returns a summary for
/// the log.
async fn take(
    up: &Upstream,
    journal: &Arc<Journal>,
    epoch: u64,
    before: crate::journal::Durable,
    durability: &Durability,
    cfg: &CheckpointConfig,
    last_sizes: &mut Option<Sizes>,
) -> Result<String, CheckpointError> {
    let covered_replid = {
        let j = journal.clone();
        let lsn = before.lsn;
        let repl_id = tokio::task::spawn_blocking(move || j.repl_id_after(lsn).ok().flatten())
            .await?
            .ok_or(CheckpointError::NoDurableEntry)?;
        String::from_utf8_lossy(&repl_id).into_owned()
    };
    let mut conn = Conn::control(up).await?;
    // The new RDB is written next to the current one: check there is room before asking.
    let memory = used_memory(&mut conn).await?;
    let (need, how) = estimate(*last_sizes, cfg.store.recorded().map(|c| c.size), memory);
    // Off the proxy's threads, as every file-system call of a checkpoint: on a volume that
    // stopped answering a `statfs` waits with it.
    let room = cfg.room.clone();
    tokio::task::spawn_blocking(move || room.check(need, &how)).await??;
    let version = ServerVersion::query(&mut conn).await?;
    let SyncStart::Full { replid, offset } =
        handshake(&mut conn, &version, Purpose::Checkpoint, None).await?
    else {
        return Err(UpstreamError::Decode(
            "Valkey offered a partial resync to PSYNC ? -1".into(),
        ))?;
    };
    let dest = cfg.store.reserve(&replid, offset).await?;
    let stored = rdb_file::receive(&mut conn, &dest, cfg.max_rdb_bytes).await?;
    drop(conn);
    // The RDB's history is the last durable entry's, or one that began right after it
    // (nothing of it journaled yet: a full ring, after a restore).
    let follows = cfg
        .attached
        .follows(epoch, before.lsn, before.repl_offset)
        .is_some_and(|r| r == replid);
    let same_history = replid == covered_replid || follows;
    if !same_history || offset < before.repl_offset || durability.epoch() != epoch {
        // Valkey's history changed under us: this RDB proves nothing about the journal.
        let _ = tokio::fs::remove_file(&dest).await;
        return Err(CheckpointError::Uncovered {
            replid,
            offset,
            lsn: before.lsn,
            covered_replid,
            covered_offset: before.repl_offset,
        });
    }
    let store = cfg.store.clone();
    let current_from = store.recorded_from_lsn().unwrap_or(1);
    let from_lsn = (before.lsn + 1).max(current_from);
    let written_by = version.to_string();
    let recorded = tokio::task::spawn_blocking(move || {
        store.record_or_discard(&stored, &written_by, &replid, offset, from_lsn)
    })
    .await??;
    *last_sizes = Some(Sizes {
        rdb_bytes: recorded.size,
        used_memory: memory,
    });
    crate::fault::fail_point!("checkpoint::recorded");
    release_unneeded(journal, &cfg.store, &cfg.pin).await;
    crate::fault::fail_point!("checkpoint::journal_released");
    Ok(format!(
        "checkpoint taken: {} ({} bytes, offset {}); journal released through LSN {}",
        recorded.file,
        recorded.size,
        recorded.offset,
        journal.released_through()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Entry, JournalConfig};

    #[test]
    #[should_panic(
        expected = "the journal released entries a restore from the stored checkpoint needs (from LSN 4): released through LSN 3, retained from LSN 5"
    )]
    fn a_release_past_the_stored_checkpoint_is_caught() {
        let mut released = crate::journal::manifest::Checkpoint::initial();
        released.released_through_lsn = 3;
        released.start_lsn = 4;
        check_retained(&released, 4);
        released.start_lsn = 5;
        check_retained(&released, 4);
    }

    /// A backup holds the pin while it reads the journal: a checkpoint recorded meanwhile
    /// releases nothing until the copy is done, then it does.
    #[tokio::test]
    async fn no_release_while_a_backup_holds_the_pin() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = JournalConfig::small_for_tests(64 * 1024, 4);
        let (journal, _) = Journal::open(&tmp.path().join("journal"), &cfg).unwrap();
        let journal = Arc::new(journal);
        let a = "a".repeat(40);
        let mut last = None;
        for i in 1..=5u64 {
            let entry = Entry {
                repl_id: a.as_bytes().try_into().unwrap(),
                repl_offset_end: i * 10,
                payload: bytes::Bytes::from(vec![b'x'; 10]),
            };
            last = Some(journal.append(entry).await.unwrap());
        }
        last.unwrap().wait().await.unwrap();
        let store = store::tests::open(&tmp.path().join("checkpoints"));
        let rdb = store::tests::stored(&store, &a, 30, b"REDIS0011body");
        store
            .record_or_discard(&rdb, "Valkey 9.1.2", &a, 30, 4)
            .unwrap();
        let pin = Pin::default();
        let copying = pin.clone().read_owned().await;
        let release = release_unneeded(&journal, &store, &pin);
        tokio::pin!(release);
        // Proving that nothing happens needs a bound: a release that ignored the pin
        // finishes within milliseconds.
        let waited = tokio::time::timeout(Duration::from_secs(1), &mut release).await;
        assert!(waited.is_err(), "released while a backup copied");
        assert_eq!(journal.released_through(), 0);
        drop(copying);
        assert!(release.await);
        assert_eq!(journal.released_through(), 3);
    }
}
