//! Restore: bring Valkey back from the current checkpoint and the journal after it, after
//! any restart of walrus, of Valkey, or of both.
//!
//! - [`decide`]: what to do with the Valkey the replica link finds, as one table.
//! - [`primary`]: walrus as Valkey's primary for the length of a restore, sending it the
//!   chain ([`crate::datadir::chain`]) without published messages
//!   ([`crate::datadir::messages`]); [`listener`]: the port it listens on.
//! - [`in_place`]: a cluster node restored through a second server.
//! - [`rewind`]: a running walrus's Valkey rewound to a point in time.
//!
//! What is done with a data directory as files (checked, verified, backed up, cut, exported)
//! is [`crate::datadir`]'s.
//!
//! A restore verifies everything before it touches Valkey: the checkpoint's size and CRC-64
//! against the manifest, the whole chain of journal entries (CRCs, offsets with no hole),
//! and that this Valkey can take them ([`compatible`]: it reads the checkpoint's RDB format
//! and runs the commands of every server whose writes they hold; a downgrade cannot). A
//! failure names the file, the entry or both versions, and leaves Valkey as it was. While a
//! restore runs, clients get `-LOADING` (see [`crate::durability`]).

pub mod decide;
pub mod in_place;
pub mod listener;
pub mod primary;
pub mod rewind;

use crate::checkpoint::manifest::Checkpoint;
use crate::checkpoint::rates::LearnedRates;
use crate::checkpoint::store::{Store, StoreError};
use crate::datadir::chain::{self, ChainEnd, ChainError};
use crate::datadir::DataDirError;
use crate::journal::Journal;
use crate::upstream::client::{Conn, UpstreamError};
use crate::upstream::server::{rdb_format, ServerVersion};
use crate::upstream::Upstream;
use crate::valkey::handshake::Position;
use crate::valkey::rdb;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often progress is logged.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Journal(#[from] crate::journal::JournalError),
    #[error("{0}")]
    Chain(#[from] ChainError),
    #[error("restore failed: {0}")]
    Load(#[from] primary::LoadError),
    #[error("restore: {0}")]
    Other(String),
    /// Nothing will change until a person acts: a request that cannot work as given, or a
    /// data directory whose parts do not prove what it holds. The text says what to do.
    #[error("{0}")]
    Refused(String),
    /// This Valkey cannot take what walrus holds (a downgrade); nothing was sent.
    #[error("{0}")]
    Unloadable(String),
}

impl From<DataDirError> for RestoreError {
    fn from(e: DataDirError) -> RestoreError {
        match e {
            DataDirError::Refused(why) => RestoreError::Refused(why),
            DataDirError::Failed(why) => RestoreError::Other(why),
            DataDirError::Store(e) => RestoreError::Store(e),
            DataDirError::Journal(e) => RestoreError::Journal(e),
            DataDirError::Chain(e) => RestoreError::Chain(e),
        }
    }
}

/// Bytes sent so far out of the total, for the progress log and metrics.
pub struct Progress {
    sent: AtomicU64,
    total: u64,
}

impl Progress {
    fn add(&self, n: u64) {
        let sent = self.sent.fetch_add(n, Ordering::Relaxed) + n;
        crate::metrics::RESTORE_SENT_BYTES.set(sent as i64);
    }
}

/// What the data directory stores: its current checkpoint and the journal chain after it,
/// verified.
#[derive(Debug, Clone)]
pub struct StoredChain {
    pub checkpoint: Checkpoint,
    /// The checkpoint's RDB format, read from its header.
    pub rdb_version: u16,
    pub end: ChainEnd,
    /// The journal's next LSN when the chain was walked: while it is unchanged (and the
    /// checkpoint too), the verification still holds.
    next_lsn: u64,
}

impl StoredChain {
    pub fn history(&self) -> decide::StoredHistory {
        decide::StoredHistory {
            ids: self.end.ids.clone(),
            end: self.end.offset,
        }
    }
}

/// Reads and checks what walrus holds (blocking): the checkpoint's file against the
/// manifest, and every journal entry of its chain. `None`: no checkpoint yet (which
/// [`crate::datadir::parts::check`] allows only where the journal holds nothing).
pub fn stored_chain(store: &Store, journal: &Journal) -> Result<Option<StoredChain>, RestoreError> {
    let Some(cp) = store.current()? else {
        return Ok(None);
    };
    let next_lsn = journal.status().next_lsn;
    // Two independent reads, each bound by its checksum: one core each.
    let (verified, end) = std::thread::scope(|s| {
        let rdb = s.spawn(|| store.verify(&cp));
        let end = chain::walk(journal, &cp, |_| Ok(()));
        (rdb.join().expect("checkpoint verification panicked"), end)
    });
    let rdb_version = verified?;
    let end = end?;
    Ok(Some(StoredChain {
        checkpoint: cp,
        rdb_version,
        end,
        next_lsn,
    }))
}

/// The Valkey a restore would load: its version and RDB format. A Valkey left as a replica
/// of walrus by an interrupted restore may refuse `FUNCTION DUMP` (`-MASTERDOWN`, with
/// `replica-serve-stale-data no`): it is made a primary first, as the restore would anyway.
async fn target(up: &Upstream) -> Result<(ServerVersion, u16), UpstreamError> {
    let mut conn = Conn::control(up).await?;
    let version = ServerVersion::query(&mut conn).await?;
    let format = match rdb_format(&mut conn).await {
        Err(UpstreamError::Refused(e)) if e.starts_with(b"-MASTERDOWN") => {
            conn.call(["REPLICAOF", "NO", "ONE"]).await?;
            rdb_format(&mut conn).await?
        }
        r => r?,
    };
    Ok((version, format))
}

/// Whether a server `version`, writing RDB `format`, can take what walrus holds: load the
/// checkpoint's format, and run every command the servers that fed it and the journal after
/// it may have written (an older Valkey would refuse them as a replica and drop those
/// writes). The error says why not and the ways out.
fn compatible(stored: &StoredChain, version: &ServerVersion, format: u16) -> Result<(), String> {
    let cp = &stored.checkpoint;
    let holds = format!(
        "walrus's checkpoint is RDB format {}{}{}",
        stored.rdb_version,
        cp.written_by
            .as_ref()
            .map_or(String::new(), |w| format!(" written by {w}")),
        cp.newest_server.as_ref().map_or(String::new(), |n| format!(
            ", and its journal holds writes of {n}"
        ))
    );
    let lacks = if !rdb::loads(format, stored.rdb_version) {
        format!("cannot load that format (it reads RDB formats up to {format})")
    } else if let Some(s) = cp.servers().find(|s| !version.runs_all_of(s)) {
        format!("may lack commands of {s}")
    } else {
        return Ok(());
    };
    let needed = cp
        .servers()
        .last()
        .map_or("the server that wrote them".into(), |s| s.to_string());
    Err(format!(
        "{holds}; {version} {lacks}: refusing to restore, since the load would fail or drop \
         acknowledged writes. Run walrus with {needed} or a later version \
         (upstream.valkey_server in managed mode), or export the data with `walrus journal \
         export-aof` and load that into such a server; to start over from Valkey's data \
         instead, move walrus's data directory aside"
    ))
}

/// Loads Valkey with what walrus holds. Returns where the replica link continues: the
/// checkpoint's id (Valkey keeps it as `replid2`) at the journal's end. `verified`: what a
/// verification found earlier (at start-up); reused, rather than read again, when neither
/// the journal nor the checkpoint changed since.
pub async fn run(
    up: &Upstream,
    store: &Store,
    journal: &Arc<Journal>,
    timeout: Duration,
    verified: Option<StoredChain>,
    rates: &LearnedRates,
    finish: primary::Finish,
) -> Result<(Position, StoredChain), RestoreError> {
    let started = Instant::now();
    // Entries appended before Valkey was lost must be on disk before they are read back.
    // (A journal that failed holds what became durable before it did: that is restored.)
    match journal.settled().await {
        Ok(_) | Err(crate::journal::JournalError::Failed(_)) => {}
        Err(e) => return Err(RestoreError::Other(format!("the journal: {e}"))),
    }
    let unchanged = verified.filter(|h| {
        h.next_lsn == journal.status().next_lsn && store.recorded().as_ref() == Some(&h.checkpoint)
    });
    let stored = match unchanged {
        Some(h) => h,
        None => {
            let (s, j) = (store.clone(), journal.clone());
            tokio::task::spawn_blocking(move || stored_chain(&s, &j))
                .await
                .map_err(|e| RestoreError::Other(e.to_string()))??
                .ok_or_else(|| RestoreError::Other("no checkpoint to restore from".into()))?
        }
    };
    let source = primary::Source::Open(journal.clone());
    load(up, store, source, stored, timeout, rates, finish, started).await
}

/// Loads Valkey with `stored` (verified), its checkpoint from `store` and the stream after
/// it from `source`, as [`run`] says.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn load(
    up: &Upstream,
    store: &Store,
    source: primary::Source,
    stored: StoredChain,
    timeout: Duration,
    rates: &LearnedRates,
    finish: primary::Finish,
    started: Instant,
) -> Result<(Position, StoredChain), RestoreError> {
    let (version, format) = target(up).await.map_err(primary::LoadError::from)?;
    compatible(&stored, &version, format).map_err(RestoreError::Unloadable)?;
    let cp = &stored.checkpoint;
    let total = cp.size + stored.end.bytes;
    tracing::info!(
        checkpoint = %store.path_of(cp).display(),
        rdb_bytes = cp.size,
        replid = %cp.replid,
        offset = cp.offset,
        journal_entries = stored.end.entries,
        journal_bytes = stored.end.bytes,
        end = stored.end.offset,
        "restore: loading Valkey from the checkpoint and the journal after it"
    );
    crate::metrics::RESTORE_IN_PROGRESS.set(1);
    crate::supervisor::status(&format!(
        "restoring Valkey: loading {total} bytes from the checkpoint and journal"
    ));
    crate::metrics::RESTORE_TOTAL_BYTES.set(total as i64);
    crate::metrics::RESTORE_SENT_BYTES.set(0);
    let progress = Progress {
        sent: AtomicU64::new(0),
        total,
    };
    // The future borrows the checkpoint and the chain: scoped, so they can be returned.
    let result = {
        let loading = primary::load(primary::Load {
            up,
            store,
            cp,
            journal: source,
            end: &stored.end,
            timeout,
            progress: &progress,
            finish,
        });
        tokio::pin!(loading);
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                r = &mut loading => break r,
                _ = tick.tick() => {
                    let sent = progress.sent.load(Ordering::Relaxed);
                    crate::supervisor::status(&format!(
                        "restoring Valkey: {:.1}% of {} bytes sent",
                        100.0 * sent as f64 / progress.total.max(1) as f64,
                        progress.total
                    ));
                    tracing::info!(
                        sent_bytes = sent,
                        total_bytes = progress.total,
                        "restore: {:.1}% sent",
                        100.0 * sent as f64 / progress.total.max(1) as f64
                    );
                }
            }
        }
    };
    crate::metrics::RESTORE_IN_PROGRESS.set(0);
    if let Some(p) = result? {
        learn(rates, cp.size, &p, acks_when_loaded(&version));
    }
    let secs = started.elapsed().as_secs_f64();
    crate::metrics::RESTORES.inc();
    crate::metrics::RESTORE_LAST_DURATION.set(secs);
    crate::supervisor::status("restore done: Valkey holds the checkpoint and journal again");
    tracing::info!(
        bytes = total,
        seconds = format!("{secs:.3}"),
        mb_per_s = format!("{:.1}", total as f64 / 1e6 / secs.max(1e-9)),
        "restore: Valkey acknowledged the journal's end and is a primary again"
    );
    let position = Position {
        replid: stored.checkpoint.replid.clone(),
        offset: stored.end.offset,
    };
    Ok((position, stored))
}

/// Whether the server sends a `REPLCONF ACK` right after loading its primary's RDB, which
/// ends the RDB phase of a restore: Valkey from 8.0 (`replicationSendAck` at the end of the
/// load became unconditional then).
fn acks_when_loaded(v: &ServerVersion) -> bool {
    v.valkey && v.major >= 8
}

/// Records a load's phases as restore rates. Only the load is timed, not the verification
/// before it (a checksummed read of the same bytes on two threads, at start-up outside this
/// function: 0.69 s of a 6.83 s restart of 1 GB here, docs/benchmarks.md, "Restore"), so an estimate
/// from learned rates leaves out about a tenth of a restart; the slowest of the recent
/// restores counts, which covers some of it.
///
/// `rdb_timed`: the server acknowledges as soon as its RDB is loaded ([`acks_when_loaded`]);
/// an older one only at its next once-a-second cron, which for a small RDB would teach a
/// rate many times too slow, kept for the process's life as the slowest.
fn learn(rates: &LearnedRates, rdb_bytes: u64, p: &primary::Phases, rdb_timed: bool) {
    let rdb = rdb_timed && rates.learn_rdb(rdb_bytes, p.rdb.as_secs_f64());
    let journal = rates.learn_journal(p.journal_bytes, p.journal.as_secs_f64());
    tracing::info!(
        rdb_seconds = format!("{:.3}", p.rdb.as_secs_f64()),
        journal_bytes = p.journal_bytes,
        journal_seconds = format!("{:.3}", p.journal.as_secs_f64()),
        rdb_rate_learned = rdb,
        journal_rate_learned = journal,
        "restore: phases timed (a phase too small to measure teaches no rate)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(rdb_version: u16, written_by: &str, newest: Option<&str>) -> StoredChain {
        StoredChain {
            checkpoint: Checkpoint {
                file: "c.rdb".into(),
                replid: "a".repeat(40),
                offset: 1,
                size: 1,
                crc64: 0,
                from_lsn: 1,
                rdb_version: Some(rdb_version),
                written_by: Some(written_by.into()),
                newest_server: newest.map(Into::into),
                time_ms: None,
            },
            rdb_version,
            end: ChainEnd {
                ids: vec!["a".repeat(40)],
                offset: 1,
                entries: 0,
                bytes: 0,
            },
            next_lsn: 1,
        }
    }

    fn v(s: &str) -> ServerVersion {
        s.parse().unwrap()
    }

    #[test]
    fn a_restore_takes_only_what_the_target_server_can_run() {
        // Same server, or an upgrade: fine.
        let h = stored(11, "Valkey 8.1.8", None);
        assert_eq!(compatible(&h, &v("Valkey 8.1.8"), 11), Ok(()));
        assert_eq!(compatible(&h, &v("Valkey 9.1.2"), 80), Ok(()));
        // A downgrade below the format, naming both and the ways out.
        let h = stored(80, "Valkey 9.1.2", None);
        let why = compatible(&h, &v("Valkey 8.1.8"), 11).unwrap_err();
        for part in [
            "RDB format 80 written by Valkey 9.1.2",
            "Valkey 8.1.8 cannot load that format (it reads RDB formats up to 11)",
            "Run walrus with Valkey 9.1.2 or a later version",
            "export-aof",
            "data directory aside",
        ] {
            assert!(why.contains(part), "{part:?} missing: {why}");
        }
        // The same format, but 9.1's commands in the journal: 9.0 would drop them.
        let why = compatible(&h, &v("Valkey 9.0.0"), 80).unwrap_err();
        assert!(
            why.contains("Valkey 9.0.0 may lack commands of Valkey 9.1.2"),
            "{why}"
        );
        // Upgraded under walrus after the checkpoint: the journal holds the newer one's.
        let h = stored(11, "Valkey 8.1.8", Some("Valkey 9.1.2"));
        let why = compatible(&h, &v("Valkey 8.1.8"), 11).unwrap_err();
        assert!(
            why.contains("its journal holds writes of Valkey 9.1.2")
                && why.contains("may lack commands of Valkey 9.1.2"),
            "{why}"
        );
        assert_eq!(compatible(&h, &v("Valkey 9.1.0"), 80), Ok(()));
        // A manifest of an older walrus names no server: the format decides.
        let mut h = stored(11, "x", None);
        h.checkpoint.written_by = None;
        assert_eq!(compatible(&h, &v("Valkey 8.0.0"), 11), Ok(()));
        assert!(compatible(&h, &v("Redis 7.0.15"), 10).is_err());
    }
}
