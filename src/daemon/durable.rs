//! The durable half of `walrus serve`: the journal and checkpoint store under the data dir,
//! verified at start; the replica link that feeds the journal (and restores Valkey first
//! when it comes up empty); the checkpointer; the disk watcher; and their shutdown, in the
//! order that lets held replies drain.

use super::Fatal;
use crate::checkpoint::{self, store::Store, CheckpointConfig};
use crate::config::Config;
use crate::durability::Durability;
use crate::journal::Journal;
use crate::replication::link::{self, LinkConfig};
use crate::restore::in_place::{InPlace, RestoreMethod};
use crate::upstream::managed::ManagedValkey;
use crate::upstream::Upstream;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The journal and the replica link that feeds it.
pub(super) struct Durable {
    pub(super) durability: Arc<Durability>,
    pub(super) journal: Arc<Journal>,
    pub(super) link: tokio::task::JoinHandle<Result<(), crate::replication::link::LinkError>>,
    checkpointer: tokio::task::JoinHandle<()>,
    watcher: tokio::task::JoinHandle<()>,
    pub(super) checkpoint_requests: tokio::sync::mpsc::Sender<checkpoint::Request>,
    /// In-place rewinds, which the link runs.
    pub(super) rewinds: tokio::sync::mpsc::Sender<link::Rewind>,
    pub(super) store: Store,
    /// Held by a backup while it copies ([`checkpoint::Pin`]).
    pub(super) pin: checkpoint::Pin,
    /// The archive's uploader, when `[archive]` is set.
    pub(super) archive: Option<crate::archive::Archive>,
    /// Set from a failed checkpoint until one succeeds ([`CheckpointConfig::failing`]).
    pub(super) checkpoint_failing: Arc<std::sync::atomic::AtomicBool>,
    pub(super) checkpoint_in_progress: Arc<checkpoint::InProgress>,
}

impl Durable {
    /// Stops the link, then closes the journal (what was appended is written out).
    pub(super) async fn stop(self) {
        if let Some(a) = self.archive {
            a.stop().await;
        }
        self.checkpointer.abort();
        let _ = self.checkpointer.await;
        self.watcher.abort();
        let _ = self.watcher.await;
        self.link.abort();
        let _ = self.link.await;
        match Arc::try_unwrap(self.journal) {
            Ok(j) => match tokio::task::spawn_blocking(move || j.close()).await {
                Ok(Ok(d)) => tracing::info!(lsn = d.lsn, offset = d.repl_offset, "journal closed"),
                Ok(Err(e)) => tracing::error!("closing the journal: {e}"),
                Err(e) => tracing::error!("closing the journal: {e}"),
            },
            Err(_) => tracing::warn!(
                "journal still in use at shutdown; its writer stops with the process"
            ),
        }
    }
}

/// Opens (initializing if needed, recovering always) the journal and the checkpoint store
/// under the data dir, verifies what they hold, and starts the replica link (which restores
/// Valkey first when it comes up empty) and the checkpointer.
pub(super) async fn start_durability(
    config: &Config,
    up: &Upstream,
    stop: watch::Receiver<bool>,
    managed: Option<&ManagedValkey>,
) -> Result<Durable, Fatal> {
    let dir = config.data.dir.join("journal");
    let cp_dir = config.data.dir.join("checkpoints");
    let (journal_dir, checkpoint_dir) = (dir.clone(), cp_dir.clone());
    if config.archive.bootstrap {
        bootstrap(config).await?;
    }
    crate::archive::fetch::refuse_partial(&config.data.dir)?;
    let cfg = config.journal.clone();
    crate::supervisor::status("starting: opening and verifying the journal and checkpoint");
    let ring_bytes = config.journal.segment_size_bytes * u64::from(config.journal.segments);
    let low_watermark = config.disk.low_watermark;
    let (journal, recovered, store, stored) = tokio::task::spawn_blocking(move || {
        // What the data directory holds is decided before anything in it is opened, and
        // again with the journal's entries once it is (datadir::parts).
        crate::datadir::parts::check(&dir, &cp_dir, None)?;
        crate::journal::manifest::create_dir_durably(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        // Before the ring is allocated: an oversized one is refused, not written first.
        crate::disk::check_ring_fits(&dir, ring_bytes, low_watermark)?;
        let (journal, recovered) = Journal::open(&dir, &cfg)?;
        let entries = (journal.status().next_lsn - 1).saturating_sub(journal.released_through());
        crate::datadir::parts::check(&dir, &cp_dir, Some(entries))?;
        let store = Store::open(&cp_dir, &journal.data_dir_id())?;
        let stored = crate::restore::stored_chain(&store, &journal)?;
        Ok::<_, Fatal>((journal, recovered, store, stored))
    })
    .await??;
    // The checkpoint recorded before this start is the last one taken until the next: the
    // gauge, and the alert and the dashboard's age read from it, must not say "none" (or
    // "failing") just because walrus restarted.
    if let Some(cp) = store.recorded() {
        let written = store
            .written_at()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        if let Some(t) = written {
            crate::metrics::CHECKPOINT_LAST_SUCCESS.set(t.as_secs_f64());
            crate::metrics::CHECKPOINT_LAST_SIZE.set(cp.size as i64);
        }
    }
    crate::metrics::JOURNAL_INFO
        .with_label_values(&[
            match recovered.backend.kind {
                crate::journal::io::BackendKind::IoUring => "io_uring",
                crate::journal::io::BackendKind::Sync => "sync",
            },
            if recovered.backend.direct_io {
                "true"
            } else {
                "false"
            },
        ])
        .set(1);
    tracing::info!(
        backend = ?recovered.backend,
        entries = recovered.entries,
        next_lsn = recovered.end.next_lsn,
        offset = recovered.end.last_repl_offset,
        "journal open"
    );
    match &stored {
        Some(h) => tracing::info!(
            checkpoint = %h.checkpoint.file,
            offset = h.checkpoint.offset,
            journal_entries = h.end.entries,
            end = h.end.offset,
            "checkpoint and journal verified"
        ),
        None => tracing::info!("no checkpoint yet: the first attach starts a new history"),
    }
    let durability = Arc::new(
        Durability::new(config.max_pending_bytes(), config.durability.max_held_bytes)
            .with_max_hold(Duration::from_millis(config.durability.max_hold_ms)),
    );
    let d = durability.clone();
    tokio::spawn(async move { d.bound_holds().await });
    if let Some(m) = managed {
        // The managed child comes back empty: nothing may read it until it is restored.
        let d = durability.clone();
        m.on_death(Arc::new(move || d.begin_restore()));
    }
    let headroom = config.ring_headroom_bytes();
    if headroom < config.max_pending_bytes() {
        // Writes admitted before the ring's mark is seen may then fill the ring: they wait
        // for a checkpoint instead of being refused up front.
        tracing::warn!(
            headroom,
            max_pending_bytes = config.max_pending_bytes(),
            "the ring's room above disk.high_watermark is smaller than durability.max_pending_bytes"
        );
    }
    let journal = Arc::new(journal);
    let released = Arc::new(tokio::sync::Notify::new());
    // `walrus checkpoint` callers beyond these wait: one checkpoint at a time serves them.
    let (checkpoint_requests, requests) = tokio::sync::mpsc::channel(4);
    let checkpoint_failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attached = Arc::new(checkpoint::attached::Attached::default());
    // Measured by restores (the link's), planned with by checkpoints.
    let rates = Arc::new(checkpoint::rates::LearnedRates::new());
    let pin = checkpoint::Pin::default();
    let pace = checkpoint::pace::Pace::default();
    let checkpoint_in_progress = Arc::new(checkpoint::InProgress::default());
    let checkpointer = tokio::spawn(checkpoint::run(
        up.clone(),
        journal.clone(),
        durability.clone(),
        CheckpointConfig {
            store: store.clone(),
            max_rdb_bytes: config.durability.max_rdb_bytes,
            policy: checkpoint::trigger::Policy {
                ring_fill_trigger: config.ring_fill_trigger(),
                max_restore_seconds: config.checkpoint.max_restore_seconds,
            },
            rates: rates.clone(),
            room: crate::disk::Room {
                dir: checkpoint_dir.clone(),
                high_watermark: config.disk.high_watermark,
            },
            failing: checkpoint_failing.clone(),
            attached: attached.clone(),
            pin: pin.clone(),
            pace: pace.clone(),
            in_progress: checkpoint_in_progress.clone(),
        },
        released.clone(),
        requests,
    ));
    let watcher = tokio::spawn(crate::disk::watch::run(
        crate::disk::watch::WatchConfig {
            high_watermark: config.disk.high_watermark,
            low_watermark: config.disk.low_watermark,
            ring_marks: config.ring_watermarks(),
            interval: Duration::from_millis(config.disk.check_interval_ms),
            segments: journal.segment_paths(),
            segment_bytes: config.journal.segment_size_bytes,
            checkpoint_failing: checkpoint_failing.clone(),
            journal_dir,
            checkpoint_dir,
        },
        journal.clone(),
        durability.clone(),
        released.clone(),
        stop.clone(),
    ));
    let archive = if config.archive.enabled() {
        Some(
            crate::archive::start(
                config,
                journal.clone(),
                store.clone(),
                pin.clone(),
                durability.clone(),
                checkpoint_requests.clone(),
            )
            .await?,
        )
    } else {
        None
    };
    let (rewind_requests, rewinds) = tokio::sync::mpsc::channel(1);
    let link_cfg = LinkConfig {
        store: store.clone(),
        released,
        pace,
        attached,
        rates,
        max_rdb_bytes: config.durability.max_rdb_bytes,
        // Half a write buffer: a busy stream becomes entries that fill group commits whole,
        // two to a write, rather than one entry fragmented across writes; at least 64 KiB
        // so that small buffers do not cut the stream into many tiny entries.
        entry_bytes: (config.journal.max_write_bytes as usize / 2).max(64 << 10),
        max_entry_bytes: config.journal.max_entry(),
        // The stream is Valkey's, not a client's reply: the journal's own entry limit bounds
        // it (past it the link takes a full resync), not the proxy's reply limits.
        limits: crate::resp::Limits::default(),
        on_conflict: config.restore.on_conflict,
        restore_timeout: Duration::from_millis(config.restore.timeout_ms),
        restore_method: restore_method(config, managed)?,
        archived: match (&archive, config.durability.ack) {
            (Some(a), crate::config::Ack::Archive) => Some(a.status.archived()),
            _ => None,
        },
        rewinds: Some(rewinds),
    };
    let link = tokio::spawn(link::run(
        up.clone(),
        journal.clone(),
        durability.clone(),
        link_cfg,
        stored,
        stop,
    ));
    Ok(Durable {
        durability,
        journal,
        link,
        checkpointer,
        watcher,
        checkpoint_requests,
        rewinds: rewind_requests,
        store,
        pin,
        archive,
        checkpoint_failing,
        checkpoint_in_progress,
    })
}

/// `archive.bootstrap`: a data directory that holds nothing is made from the archive's
/// latest restore point first (a new node replacing a lost one). An archive without one
/// starts walrus empty; one that cannot be reached stops it (exit 1, to be retried): it
/// must not start empty beside an archive it cannot see.
async fn bootstrap(config: &Config) -> Result<(), Fatal> {
    use crate::archive::fetch;
    let dir = &config.data.dir;
    if !fetch::holds_nothing(dir) {
        tracing::info!(dir = %dir.display(), "archive.bootstrap: the data directory holds data already; starting from it");
        return Ok(());
    }
    crate::supervisor::status("starting: restoring the data directory from the archive");
    let store = crate::archive::store::Store::open(&config.archive.url, &config.archive)?;
    let Some(plan) = fetch::latest(&store).await? else {
        tracing::info!(url = %config.archive.url, "archive.bootstrap: the archive has no restore point yet; starting empty");
        return Ok(());
    };
    tracing::info!(url = %config.archive.url, timeline = plan.point.timeline, offset = plan.point.offset, objects = plan.cover.objects.len(), "archive.bootstrap: restoring the data directory from the archive's latest restore point");
    let geometry = (config.journal.segment_size_bytes, config.journal.segments);
    let restored = fetch::restore(&store, plan, dir, geometry).await?;
    tracing::info!(
        "archive.bootstrap: done: {}",
        restored.to_string().trim_end().replace('\n', "; ")
    );
    Ok(())
}

/// How a restore reaches Valkey: as walrus's replica, unless Valkey is a cluster node, which
/// refuses to be one ([`crate::restore::in_place`]).
fn restore_method(
    config: &Config,
    managed: Option<&ManagedValkey>,
) -> Result<RestoreMethod, Fatal> {
    if !config.cluster.enabled {
        return Ok(RestoreMethod::Replica);
    }
    Ok(match managed {
        Some(m) => RestoreMethod::InPlace(InPlace {
            binary: crate::upstream::binary::find(&config.upstream.valkey_server)?,
            extra_args: config.upstream.extra_args.clone(),
            dir: config.data.dir.join("valkey-restore"),
            socket: config.socket_path(crate::config::RESTORE_SOCKET)?,
            reloader: m.reloader(),
        }),
        None => RestoreMethod::Refuse(format!(
            "Valkey is an external cluster node, which refuses REPLICAOF, and walrus cannot restart it from a restored RDB as it does a managed one: stop walrus, write walrus's data out with `walrus journal export-aof --data-dir {}`, start Valkey from that AOF with its nodes.conf, and start walrus with restore.on_conflict = \"valkey-wins\" once (docs/cluster.md, \"Valkey Cluster\")",
            config.data.dir.display()
        )),
    })
}
