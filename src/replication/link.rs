//! The replica link: attach to Valkey, journal its replication stream, acknowledge what is
//! durable, and re-attach after any break.
//!
//! 1. Connect with walrus's own credentials, look at Valkey (`INFO`) and decide what to do
//!    with it ([`crate::restore::decide`]): continue its stream, restore it first, start a
//!    new history, or refuse. Then run the [handshake](crate::valkey::handshake), continuing from
//!    the journal's end (`PSYNC <replid> <offset+1>`) or asking for a full resync.
//! 2. `+FULLRESYNC`: store the RDB durably under `<data>/checkpoints/` and record it as the
//!    checkpoint (it covers every write up to its offset). `+CONTINUE`: the stream goes on
//!    right after the journal's end.
//! 3. Cut the stream into entries on command boundaries ([`super::stream`]) and append each
//!    to the journal, whose offsets are therefore Valkey's replication offsets, byte for byte.
//! 4. Follow the durable offset into the [durability gate](crate::durability)
//!    ([`super::follow`]), and tell Valkey `REPLCONF ACK <received> FACK <durable>` (so `WAIT` counts walrus once it has a write
//!    and `WAITAOF` once it is on disk), after every durable advance, every second (Valkey
//!    drops a replica that stays silent for `repl-timeout`), and when Valkey asks
//!    (`GETACK`).
//!
//! The durable offset handed to the gate only ever comes from entries of the current
//! replication history: after a full resynchronization under a new replication id (Valkey
//! restarted or failed over), the journal's older entries belong to another offset space.

pub use super::error::LinkError;

use super::ack::{acknowledge, Received};
use super::follow::{follow, Covered};
use super::stream::StreamFramer;
use crate::checkpoint::attached::{Attached, HistoryStart};
use crate::checkpoint::pace::{Pace, Pacer};
use crate::checkpoint::rates::LearnedRates;
use crate::checkpoint::rdb_file;
use crate::checkpoint::store::Store;
use crate::config::OnConflict;
use crate::durability::Durability;
use crate::journal::{Entry, Journal, JournalError};
use crate::resp::{write, Limits};
use crate::restore::decide::{decide, Decision, StoredHistory};
use crate::restore::in_place::{self, RestoreMethod};
use crate::restore::primary::Finish;
use crate::restore::{self, RestoreError, StoredChain};
use crate::task::backoff::Backoff;
use crate::task::AbortOnDrop;
use crate::upstream::client::{Conn, UpstreamError};
use crate::upstream::Upstream;
use crate::valkey::handshake::{ack, handshake, Purpose, SyncStart};
use crate::valkey::view::ValkeyView;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::{watch, Notify};

pub struct LinkConfig {
    /// Where checkpoints (full-resync RDBs among them) are stored and recorded.
    pub store: Store,
    /// Largest RDB accepted.
    pub max_rdb_bytes: u64,
    /// Entry size the stream is cut at (a transaction may be larger).
    pub entry_bytes: usize,
    /// The journal's largest entry (`journal.max_entry_bytes`): a command or transaction
    /// larger than it is refused as soon as the stream shows it, not buffered whole.
    pub max_entry_bytes: u64,
    pub limits: Limits,
    /// Notified when a checkpoint releases ring segments.
    pub released: Arc<Notify>,
    /// How fast the journal may fill the ring while a checkpoint runs.
    pub pace: Pace,
    /// Told where each attachment's history began, for the checkpointer.
    pub attached: Arc<Attached>,
    /// Told how fast each restore loaded, for the checkpointer's restore estimate.
    pub rates: Arc<LearnedRates>,
    pub on_conflict: OnConflict,
    /// How long Valkey may take for each step of a restore.
    pub restore_timeout: Duration,
    /// How a restore reaches Valkey (a cluster node refuses to be a replica).
    pub restore_method: RestoreMethod,
    /// `durability.ack = "archive"`: the archive's position, which releases replies.
    pub archived: Option<tokio::sync::watch::Receiver<crate::journal::Durable>>,
    /// In-place rewinds asked for (`walrus restore --until ... --confirm`): the link runs
    /// them, since it owns Valkey's attachment.
    pub rewinds: Option<tokio::sync::mpsc::Receiver<Rewind>>,
}

/// A request to rewind Valkey in place ([`crate::restore::rewind::in_place`]), answered with
/// what was done or why not.
pub struct Rewind {
    pub until: crate::datadir::pitr::Until,
    /// Where the present is kept (absolute, new or empty).
    pub way_back: std::path::PathBuf,
    pub backups: Arc<crate::datadir::backup::Backups>,
    pub reply: tokio::sync::oneshot::Sender<Result<String, RestoreError>>,
}

/// What the link knows between attachments.
struct LinkState {
    /// What the checkpoint and journal hold; `None` before the first checkpoint.
    stored: Option<StoredHistory>,
    /// The verification done at start-up, for a restore that follows at once.
    verified: Option<StoredChain>,
    /// First LSN of the current replication history: durable reports before it are offsets
    /// of another history. The journal's end (where a restart continues) is in this history.
    history_lsn: u64,
    attached_once: bool,
    /// The stream held an entry too large for the journal: the next attach asks for a full
    /// resync of the same history, whose RDB covers it.
    full_resync: bool,
}

/// Runs the link until `stop`. `stored`: what the checkpoint and journal hold at start.
/// Returns an error if the first attachment is refused (decision (c)): walrus then does not
/// start. Later refusals keep clients on `-LOADING` and are retried.
pub async fn run(
    up: Upstream,
    journal: Arc<Journal>,
    durability: Arc<Durability>,
    mut cfg: LinkConfig,
    stored: Option<StoredChain>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), LinkError> {
    let mut rewinds = cfg.rewinds.take();
    let mut state = LinkState {
        stored: stored.as_ref().map(|h| h.history()),
        verified: stored,
        history_lsn: 0,
        attached_once: false,
        full_resync: false,
    };
    let mut backoff = Backoff::default();
    loop {
        if journal.durable().borrow().failed {
            // Nothing can become durable any more; the gate already refuses writes. Staying
            // detached also makes Valkey refuse writes (min-replicas-to-write).
            durability.fail(&journal.failure());
            tracing::error!("journal failed: the replica link stays down");
            return Ok(());
        }
        let rewind = async {
            match rewinds.as_mut() {
                Some(r) => r.recv().await,
                None => std::future::pending().await,
            }
        };
        let attached = tokio::select! {
            r = attach(&up, &journal, &durability, &cfg, &mut state) => Ok(r),
            Some(r) = rewind => Err(r),
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        durability.detach();
        let attached = match attached {
            Ok(r) => r,
            Err(rewind) => {
                rewind_in_place(&up, &journal, &durability, &cfg, &mut state, rewind).await;
                continue;
            }
        };
        match attached {
            Err(LinkError::Journal(e @ JournalError::EntryTooLarge { .. })) => {
                // One transaction or script whose effects exceed an entry: the journal is
                // fine, and a full resync's RDB (which holds those effects) covers it.
                tracing::warn!("{e}: taking a full resync so that a checkpoint covers it");
                state.full_resync = true;
            }
            Err(LinkError::Journal(e)) => {
                // The journal cannot take the stream: nothing more can become durable.
                durability.fail(&e.to_string());
                tracing::error!("journal failed, the replica link stops: {e}");
                return Ok(());
            }
            Err(e @ LinkError::Conflict(_)) if !state.attached_once => return Err(e),
            Err(LinkError::Conflict(why)) => {
                durability.begin_restore();
                tracing::error!("{why}; clients get -LOADING until this is resolved");
            }
            Err(e) => {
                tracing::warn!(
                    "replica link to Valkey broke: {e}; re-attaching in {:?}",
                    backoff.delay()
                )
            }
            Ok(()) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.advance()) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
    }
}

/// Rewinds Valkey in place, detached and with clients on `-LOADING`, once everything
/// journaled is durable (the way back holds all of it). Rewound, the link continues from the
/// cut with a full resynchronization: its checkpoint, under the id Valkey took when promoted,
/// starts the new history, and the journal's entries after the cut (before that checkpoint's
/// first LSN) are never read again. A rewind that fails leaves what walrus holds as it was:
/// the next attachment finds Valkey behind it and restores the present.
async fn rewind_in_place(
    up: &Upstream,
    journal: &Journal,
    durability: &Durability,
    cfg: &LinkConfig,
    state: &mut LinkState,
    r: Rewind,
) {
    durability.begin_restore();
    let rewound = async {
        journal
            .settled()
            .await
            .map_err(|e| RestoreError::Other(format!("the journal: {e}")))?;
        restore::rewind::in_place(
            up,
            &r.backups,
            &r.until,
            r.way_back,
            cfg.restore_timeout,
            &cfg.rates,
        )
        .await
    }
    .await;
    let reply = rewound.map(|(rewound, stored)| {
        tracing::info!("{}", rewound.to_string().trim_end().replace('\n', "; "));
        state.stored = Some(stored.history());
        state.verified = None;
        state.full_resync = true;
        rewound.to_string()
    });
    if let Err(e) = &reply {
        tracing::error!("rewind in place failed: {e}");
    }
    if let Err(e) = restore::rewind::close_clients(up).await {
        tracing::warn!("cannot close the proxy's connections from before the rewind: {e}");
    }
    let _ = r.reply.send(reply);
}

/// How the handshake of one attachment ended.
struct Synced {
    /// The connection, now Valkey's replica link.
    conn: Conn,
    /// Valkey as it was when the decision was made.
    view: ValkeyView,
    replid: String,
    /// The offset the stream continues after.
    offset: u64,
    /// A stored RDB covers `offset` (a full resync's, or the checkpoint a restore loaded).
    covered: bool,
    /// A replication history starts here: earlier entries hold offsets of another one.
    new_history: bool,
    /// A full resync: Valkey must list the replica online before writes are admitted.
    full: bool,
}

/// One attachment: synchronize, open the gate, then journal the stream until something
/// breaks.
async fn attach(
    up: &Upstream,
    journal: &Arc<Journal>,
    durability: &Arc<Durability>,
    cfg: &LinkConfig,
    state: &mut LinkState,
) -> Result<(), LinkError> {
    let Synced {
        mut conn,
        view,
        replid,
        offset,
        covered,
        new_history,
        full,
    } = synchronize(up, journal, durability, cfg, state).await?;
    ack(&mut conn, offset).await?;
    if full {
        wait_online(up, &mut conn, offset, cfg.restore_timeout).await?;
    }
    if new_history {
        state.history_lsn = journal.status().next_lsn;
    }
    // Valkey may have run writes after the journal's end (walrus was down): until the
    // stream that brings them is durable, nothing they wrote may be shown.
    let valkey_offset = if full { 0 } else { view.offset };
    let epoch = durability.attach(&view.run_id, offset, covered, new_history, valkey_offset);
    // Everything journaled before this attachment is in Valkey (restored, continued, or
    // replaced by a recorded RDB): a checkpoint of it covers the journal even before any
    // of its stream is journaled.
    cfg.attached.began(HistoryStart {
        epoch,
        replid: replid.clone(),
        offset,
        first_lsn: journal.status().next_lsn,
    });
    state.attached_once = true;
    state.verified = None;
    tracing::info!(%replid, offset, "replica link attached; journaling Valkey's replication stream");

    let parts = conn.into_parts();
    let (mut rd, wr) = parts.stream.into_split();
    let mut buf = parts.buf;
    let getack = Arc::new(Notify::new());
    let received = Arc::new(Received::new(offset));
    let covered = Covered::new(state.history_lsn, if covered { offset } else { 0 });
    let _stop_follower = AbortOnDrop(tokio::spawn(follow(
        Arc::downgrade(journal),
        durability.clone(),
        covered,
        cfg.archived.clone(),
    )));
    let _stop_acker = AbortOnDrop(tokio::spawn(acknowledge(
        wr,
        Arc::downgrade(journal),
        covered,
        received.clone(),
        getack.clone(),
    )));
    let repl_id: [u8; 40] = replid
        .as_bytes()
        .try_into()
        .expect("replication ids are 40 characters");
    let mut framer = StreamFramer::new(offset, cfg.limits, cfg.entry_bytes, cfg.max_entry_bytes);
    // The stream shows Valkey's death as its end, but only to a link that reads it, and the
    // link stops reading while the ring is full: the watch notices a restarted Valkey then.
    let replaced = replaced(up, durability, &view.run_id);
    tokio::pin!(replaced);
    let mut pacer = cfg.pace.pacer();
    loop {
        while let Some(entry) = framer.next_entry(&mut buf)? {
            let offset_end = entry.offset_end;
            let asked = entry.getack;
            received.check_next(offset_end - entry.payload.len() as u64, offset_end);
            let entry = Entry {
                repl_id,
                repl_offset_end: offset_end,
                payload: entry.payload,
            };
            append(journal, entry, &mut pacer, &cfg.released, replaced.as_mut()).await?;
            received.appended(offset_end);
            if asked {
                getack.notify_one();
            }
            if let Some(h) = state.stored.as_mut() {
                h.end = offset_end;
            }
        }
        crate::net::room_to_read(&mut buf, crate::net::read_chunk::BULK, 0);
        tokio::select! {
            n = rd.read_buf(&mut buf) => if n? == 0 {
                return Err(UpstreamError::Closed.into());
            },
            e = &mut replaced => return Err(e),
        }
    }
}

/// The decision (restoring Valkey if that is what it says) and the handshake: a full
/// resync's RDB stored and recorded as the checkpoint, or the stream continued.
async fn synchronize(
    up: &Upstream,
    journal: &Arc<Journal>,
    durability: &Arc<Durability>,
    cfg: &LinkConfig,
    state: &mut LinkState,
) -> Result<Synced, LinkError> {
    let mut conn = Conn::control(up).await?;
    let mut view = ValkeyView::query(&mut conn).await?;
    let decision = decide(&view, state.stored.as_ref(), cfg.on_conflict);
    tracing::info!(
        ?decision,
        "{}; {}",
        view.describe(),
        state
            .stored
            .as_ref()
            .map_or("walrus holds no checkpoint yet".into(), |h| h.describe())
    );
    let mut restored = false;
    let decision_continue = decision != Decision::NewHistory;
    let from = match decision {
        Decision::Continue(_) if std::mem::take(&mut state.full_resync) => None,
        Decision::Continue(p) => Some(p),
        Decision::NewHistory => None,
        Decision::Refuse(why) => return Err(LinkError::Conflict(why)),
        Decision::Restore => {
            durability.begin_restore();
            drop(conn);
            let (store, timeout, verified) =
                (&cfg.store, cfg.restore_timeout, state.verified.take());
            let result = match &cfg.restore_method {
                RestoreMethod::Replica => {
                    restore::run(
                        up,
                        store,
                        journal,
                        timeout,
                        verified,
                        &cfg.rates,
                        Finish::Promote,
                    )
                    .await
                }
                RestoreMethod::InPlace(how) => {
                    in_place::run(how, up, store, journal, timeout, verified, &cfg.rates).await
                }
                RestoreMethod::Refuse(why) => return Err(LinkError::Conflict(why.clone())),
            };
            let (position, stored) = match result {
                // A downgrade: like a conflict, nothing to retry until someone acts.
                Err(RestoreError::Unloadable(why)) => return Err(LinkError::Conflict(why)),
                r => r?,
            };
            state.stored = Some(stored.history());
            conn = Conn::control(up).await?;
            if matches!(cfg.restore_method, RestoreMethod::InPlace(_)) {
                // Another process now: the one the link must watch for a restart.
                view = ValkeyView::query(&mut conn).await?;
            }
            restored = true;
            Some(position)
        }
    };
    crate::metrics::set_valkey_info(
        if view.version.valkey {
            "valkey"
        } else {
            "redis"
        },
        &view.version.number(),
    );
    let synced = match handshake(&mut conn, &view.version, Purpose::Link, from.as_ref()).await? {
        SyncStart::Full { replid, offset } => {
            // A new history takes whatever id Valkey answers with (Valkey picks a new one
            // when its first replica creates the backlog). Otherwise the answer must come
            // from the Valkey the decision was made for (one restarted in between has
            // another id), and a restore must end in a partial resync: decide again.
            if decision_continue && (restored || replid != view.replid) {
                return Err(LinkError::Raced(format!(
                        "Valkey answered +FULLRESYNC {replid} {offset} where {} was expected; deciding again",
                        if restored { "+CONTINUE after the restore" } else { "its history" }
                    )));
            }
            let dest = cfg.store.reserve(&replid, offset).await?;
            let stored = rdb_file::receive(&mut conn, &dest, cfg.max_rdb_bytes).await?;
            let from_lsn = journal.settled().await?;
            let store = cfg.store.clone();
            let (r, s) = (replid.clone(), stored.clone());
            let written_by = view.version.to_string();
            tokio::task::spawn_blocking(move || {
                store.record_or_discard(&s, &written_by, &r, offset, from_lsn)
            })
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))??;
            tracing::info!(bytes = stored.bytes, path = %stored.path.display(), offset, "full resync: RDB stored durably and recorded as the checkpoint");
            let new_history = state
                .stored
                .as_ref()
                .is_none_or(|h| !h.ids.contains(&replid));
            state.stored = Some(StoredHistory {
                ids: vec![replid.clone()],
                end: offset,
            });
            Synced {
                conn,
                view,
                replid,
                offset,
                covered: true,
                new_history,
                full: true,
            }
        }
        SyncStart::Continue { replid } => {
            let offset = from
                .as_ref()
                .expect("+CONTINUE answers a PSYNC with a position")
                .offset;
            if restored {
                tracing::info!(offset, %replid, "restore: Valkey continued with a partial resync (+CONTINUE), no second full sync");
            } else {
                tracing::info!(
                    offset,
                    "partial resync: the stream continues after the journal's end"
                );
            }
            let stored = state.stored.as_mut().expect("continuing a stored history");
            if !stored.ids.contains(&replid) {
                stored.ids.push(replid.clone());
            }
            // Before anything of this Valkey is journaled: a restore must not take its
            // commands to an older one.
            let (store, version) = (cfg.store.clone(), view.version.clone());
            tokio::task::spawn_blocking(move || store.note_server(&version))
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))??;
            Synced {
                conn,
                view,
                replid,
                offset,
                covered: restored,
                new_history: restored,
                full: false,
            }
        }
    };
    Ok(synced)
}

/// Resolves once Valkey at `up` is another process than `run_id`
/// ([`crate::valkey::process::replaced`]), and at once when a connection doubts it.
async fn replaced(up: &Upstream, durability: &Durability, run_id: &str) -> LinkError {
    let now = crate::valkey::process::replaced(up, run_id, || durability.doubted()).await;
    LinkError::Raced(format!(
        "Valkey restarted (process {run_id} is gone, {now} answers); attaching to it"
    ))
}

/// Appends an entry at the pace a running checkpoint allows; when the ring is full, waits
/// for a checkpoint to release segments (meanwhile the stream stays in Valkey's replica
/// buffer, and the gate's pending-bytes bound stops new writes), or for Valkey to be
/// `replaced`: a restore then needs no room in the ring, and is what lets a checkpoint run
/// again. The ticket is not awaited: durability is observed through the durable watch.
async fn append(
    journal: &Journal,
    entry: Entry,
    pacer: &mut Pacer,
    released: &Notify,
    mut replaced: std::pin::Pin<&mut impl std::future::Future<Output = LinkError>>,
) -> Result<(), LinkError> {
    tokio::select! {
        waited = pacer.wait(entry.payload.len() as u64, || journal.status().free_bytes) => {
            crate::metrics::CHECKPOINT_PACED_SECONDS.inc_by(waited.as_secs_f64());
        }
        e = replaced.as_mut() => return Err(e),
    }
    loop {
        let notified = released.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match journal.append(entry.clone()).await {
            Err(JournalError::RingFull { .. }) => {
                tracing::warn!("journal ring full: waiting for a checkpoint to release segments");
                tokio::select! {
                    _ = notified => {}
                    e = replaced.as_mut() => return Err(e),
                }
            }
            r => {
                r?;
                crate::metrics::JOURNAL_ENTRIES.inc();
                crate::metrics::JOURNAL_ENTRY_BYTES.inc_by(entry.payload.len() as u64);
                return Ok(());
            }
        }
    }
}

/// After a full sync, waits until Valkey lists walrus as an online replica. A diskless
/// primary puts its replica online only once it has reaped the child that sent the RDB (at
/// its next cron tick, or when an ACK arrives); until then `min-replicas-to-write` makes it
/// refuse every write with `-NOREPLICAS`, so the gate must not open yet. Each ACK asks
/// Valkey to check on the child again; ROLE, on a control connection, shows the result.
async fn wait_online(
    up: &Upstream,
    link: &mut Conn,
    offset: u64,
    timeout: Duration,
) -> Result<(), LinkError> {
    const RECHECK: Duration = Duration::from_millis(5);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut control = Conn::control(up).await?;
    loop {
        let role = control.call_raw(&write::command(["ROLE"])).await?;
        if crate::valkey::role::parse_role(&role).is_some_and(|(_, replicas)| replicas > 0) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(LinkError::Raced(format!(
                "Valkey did not put walrus online as its replica within {timeout:?} of the full sync"
            )));
        }
        tokio::time::sleep(RECHECK).await;
        ack(link, offset).await?;
    }
}
