//! Checkpoints: an RDB of the whole dataset, taken by a fresh full synchronization and stored
//! durably, covers every journal entry before it, so the ring can recycle those segments.
//!
//! When the ring is half full, walrus opens a second replica connection, asks for a full
//! resynchronization (`PSYNC ? -1`), stores the RDB under `<data>/checkpoints/` (temp file,
//! fsync, rename, directory fsync), and releases the journal through the last entry that was
//! durable *before* it asked: the RDB was cut later, at a higher offset of the same
//! replication history, so it contains all of those entries' effects. Older checkpoint files
//! are then deleted; the newest one, plus the journal after it, is what a restore needs.

use crate::journal::{Journal, ReplayFrom};
use crate::replication::handshake::{handshake, SyncStart};
use crate::replication::rdb;
use crate::upstream::client::Conn;
use crate::upstream::Upstream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

pub struct CheckpointConfig {
    pub dir: PathBuf,
    pub max_rdb_bytes: u64,
    /// Take a checkpoint once this fraction of the ring's segments is in use.
    pub ring_fill_trigger: f64,
}

/// Takes checkpoints whenever the ring fills past the trigger; `released` is notified after
/// each release (the replica link waits on it when the ring is full).
pub async fn run(
    up: Upstream,
    journal: Arc<Journal>,
    cfg: CheckpointConfig,
    released: Arc<Notify>,
) {
    let mut durable = journal.durable();
    loop {
        let status = journal.status();
        if (status.used_segments as f64) < cfg.ring_fill_trigger * status.segments as f64 {
            if durable.changed().await.is_err() {
                return;
            }
            continue;
        }
        match take(&up, &journal, &cfg).await {
            Ok(()) => released.notify_waiters(),
            Err(e) => {
                tracing::warn!("checkpoint failed: {e}; retrying in {RETRY_AFTER_FAILURE:?}");
                tokio::time::sleep(RETRY_AFTER_FAILURE).await;
            }
        }
    }
}

async fn take(up: &Upstream, journal: &Arc<Journal>, cfg: &CheckpointConfig) -> Result<(), String> {
    let before = *journal.durable().borrow();
    if before.lsn == 0 || before.failed {
        return Err("nothing durable to release".into());
    }
    let covered_replid = {
        let j = journal.clone();
        let lsn = before.lsn;
        let entry =
            tokio::task::spawn_blocking(move || j.replay(ReplayFrom::Lsn(lsn)).ok()?.next()?.ok())
                .await
                .map_err(|e| e.to_string())?
                .ok_or("cannot read the last durable entry")?;
        String::from_utf8_lossy(&entry.repl_id).into_owned()
    };
    let mut conn = Conn::control(up).await.map_err(|e| e.to_string())?;
    let SyncStart::Full { replid, offset } = handshake(&mut conn, 0, None, true)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Err("Valkey offered a partial resync to PSYNC ? -1".into());
    };
    tokio::fs::create_dir_all(&cfg.dir)
        .await
        .map_err(|e| e.to_string())?;
    let dest = cfg.dir.join(format!("checkpoint-{replid}-{offset}.rdb"));
    let stored = rdb::receive(&mut conn, &dest, cfg.max_rdb_bytes)
        .await
        .map_err(|e| e.to_string())?;
    drop(conn);
    if replid != covered_replid || offset < before.repl_offset {
        // Valkey's history changed under us: this RDB does not prove anything about the journal.
        return Err(format!(
            "checkpoint at {replid}:{offset} does not cover journal entry {} at {covered_replid}:{}",
            before.lsn, before.repl_offset
        ));
    }
    journal
        .release_through(before.lsn)
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(
        rdb_bytes = stored.bytes,
        offset,
        released_through_lsn = before.lsn,
        "checkpoint taken; journal segments released"
    );
    remove_older(&cfg.dir, &dest).await;
    Ok(())
}

/// Deletes every stored RDB but `keep`.
async fn remove_older(dir: &Path, keep: &Path) {
    let Ok(mut entries) = tokio::fs::read_dir(dir).await else {
        return;
    };
    while let Ok(Some(e)) = entries.next_entry().await {
        let p = e.path();
        if p != keep && p.extension().is_some_and(|x| x == "rdb") {
            if let Err(err) = tokio::fs::remove_file(&p).await {
                tracing::warn!("cannot remove old checkpoint {}: {err}", p.display());
            }
        }
    }
}
