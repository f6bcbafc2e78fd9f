//! Restoring a cluster node in place. A Valkey in cluster mode refuses `REPLICAOF` ("not
//! allowed in cluster mode"), so walrus cannot be its primary for a restore as it is for a
//! plain Valkey. Instead:
//!
//! 1. walrus starts a second valkey-server, plain (not a cluster node), from the same
//!    binary and arguments, in `<data>/valkey-restore`, and restores it as usual
//!    ([`super::run`]), ending with `SAVE` while it is still walrus's replica
//!    ([`Finish::Save`]): its RDB records the checkpoint's replication id at the
//!    journal's end;
//! 2. the cluster node is restarted loading that RDB ([`Reloader::reload`]). Its directory
//!    keeps its `nodes.conf`, so it comes back as the same node (id, slots, epoch). A
//!    primary started from an RDB keeps the RDB's id as `replid2` within its offset, so the
//!    replica link continues the journal with `PSYNC` (decision (a) of [`super::decide`]).
//!
//! The node was restarted empty when its Valkey died; walrus answers `-LOADING` for it until
//! the link is attached again, and the rest of the cluster sees it up (its bus answers)
//! while the second server loads. During the reload its bus is down: one longer than
//! `cluster-node-timeout` has the others mark it failed (docs/cluster.md, "Valkey Cluster"). The
//! cost: the dataset is loaded twice and written to disk once more; the second server needs
//! the node's memory again while it runs.

use super::primary::Finish;
use super::{RestoreError, StoredChain};
use crate::checkpoint::rates::LearnedRates;
use crate::checkpoint::store::Store;
use crate::journal::Journal;
use crate::upstream::managed::{ManagedValkey, Reloader};
use crate::upstream::Upstream;
use crate::valkey::handshake::Position;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a restore reaches Valkey.
#[derive(Clone)]
pub enum RestoreMethod {
    /// Valkey becomes walrus's replica ([`super::run`]): a plain Valkey.
    Replica,
    /// A managed cluster node, restored in place ([`run`]).
    InPlace(InPlace),
    /// An external cluster node, which walrus cannot restart: the text says what to do.
    Refuse(String),
}

/// How to restore the managed cluster node.
#[derive(Clone)]
pub struct InPlace {
    /// The valkey-server binary and the arguments the node runs with, for the second server.
    pub binary: PathBuf,
    pub extra_args: Vec<String>,
    /// The second server's directory (emptied before and after).
    pub dir: PathBuf,
    /// The second server's Unix socket, beside the node's (no TCP port either: it holds the
    /// whole dataset while it loads).
    pub socket: PathBuf,
    pub reloader: Reloader,
}

/// Restores the cluster node behind `up` as the module doc says; returns, as
/// [`super::run`] does, where the link continues and what walrus holds.
pub async fn run(
    how: &InPlace,
    up: &Upstream,
    store: &Store,
    journal: &Arc<Journal>,
    timeout: Duration,
    verified: Option<StoredChain>,
    rates: &LearnedRates,
) -> Result<(Position, StoredChain), RestoreError> {
    let other = |e: String| RestoreError::Other(e);
    // Off the worker, as every file-system call while walrus serves (`task::off_worker`).
    let clear = || {
        let dir = how.dir.clone();
        crate::task::off_worker(move || std::fs::remove_dir_all(dir))
    };
    let _ = clear().await;
    let started = Instant::now();
    tracing::info!(dir = %how.dir.display(), "restore: Valkey is a cluster node, which refuses REPLICAOF; loading a second, plain valkey-server first, then restarting the node from its RDB");
    let second = ManagedValkey::start(
        how.binary.clone(),
        &how.dir,
        how.socket.clone(),
        how.extra_args.clone(),
        None,
    )
    .await
    .map_err(|e| other(format!("cannot start the second valkey-server: {e}")))?;
    let second_up = Upstream {
        address: second.address.clone(),
        process: Some(second.process()),
        ..up.clone()
    };
    let loaded = super::run(
        &second_up,
        store,
        journal,
        timeout,
        verified,
        rates,
        Finish::Save,
    )
    .await;
    second.stop().await;
    let (position, stored) = loaded?;
    // The node loads an RDB of the same dataset, without the journal: no longer than the
    // second server took, with margin for a busier machine.
    let took = started.elapsed();
    let rdb = how.dir.join("dump.rdb");
    tracing::info!(rdb = %rdb.display(), "restore: restarting the cluster node from the restored RDB (same nodes.conf: same node, slots and epoch)");
    how.reloader
        .reload(rdb, timeout + took * 2)
        .await
        .map_err(|e| {
            other(format!(
                "cannot restart the cluster node from its restored RDB: {e}"
            ))
        })?;
    let _ = clear().await;
    Ok((position, stored))
}
