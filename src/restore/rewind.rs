//! A point-in-time restore in place ([`in_place`]): a running walrus keeps the present in a
//! new data directory (its way back), then loads its Valkey from that copy up to the cut, the
//! same cut ([`crate::datadir::backup::cut::plan`]) and the same load as any restore
//! ([`super::load`] with [`super::primary::Source::Dir`]). Into a new data directory, with
//! walrus stopped, is [`crate::datadir::backup::cut`]'s.
//!
//! The rewound Valkey does not go on with the history it was cut from as if the rest had not
//! happened: the restore promotes it, which gives it a new replication id (the old one kept
//! as its previous id, valid up to the cut), and the journal goes on under the new one.

use super::RestoreError;
use crate::checkpoint::store::Store;
use crate::datadir::backup::copy::Summary;
use crate::datadir::backup::cut::plan;
use crate::datadir::backup::Backups;
use crate::datadir::pitr::{Cut, Until};

/// What an in-place rewind did: where it cut, and the way back.
#[derive(Debug, Clone)]
pub struct Rewound {
    pub cut: Cut,
    /// The data directory holding the present (the checkpoint and the whole journal as they
    /// were before the rewind): `walrus serve --data-dir` on it, or `walrus restore
    /// --from-dir` from it, brings the present back.
    pub way_back: Summary,
}

impl std::fmt::Display for Rewound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let back = self.way_back.to.display();
        writeln!(f, "the present (before the rewind) kept in {back}:")?;
        self.way_back.write_contents(f)?;
        write!(f, "{}", self.cut)?;
        writeln!(
            f,
            "Valkey rewound to offset {} and promoted: a new history (replication id) goes on from there",
            self.cut.at.offset
        )?;
        writeln!(
            f,
            "the way back: stop walrus and start it with --data-dir {back}, or restore from it with `walrus restore --from-dir {back} --data-dir NEW`"
        )
    }
}

/// A running walrus's rewind in place, made while its replica link is detached and clients
/// get `-LOADING` (the link runs it: [`crate::replication::link`]): the recorded checkpoint
/// and the whole journal are copied into `way_back` (no checkpoint is taken first: it would
/// replace the one the cut starts from, and walrus keeps one); the cut is decided on that
/// copy, and Valkey is loaded from it up to the cut and promoted, which gives it a new
/// replication id. Returns what it held, for the link to continue from; the link then takes
/// a full resynchronization, whose checkpoint starts the new history in walrus's own data
/// directory.
pub async fn in_place(
    up: &crate::upstream::Upstream,
    backups: &Backups,
    until: &Until,
    way_back: std::path::PathBuf,
    timeout: std::time::Duration,
    rates: &crate::checkpoint::rates::LearnedRates,
) -> Result<(Rewound, super::StoredChain), RestoreError> {
    let started = std::time::Instant::now();
    let copy = backups.keep(way_back).await?;
    let dir = copy.to.clone();
    let (d, u) = (dir.clone(), until.clone());
    let checked = tokio::task::spawn_blocking(move || {
        let cut = plan(&d, &u)?;
        let (journal_dir, cp_dir) = crate::datadir::data_dirs(&d);
        let store = Store::read_only(&cp_dir)?;
        let rdb_version = store.verify(&cut.checkpoint)?;
        Ok::<_, RestoreError>((cut, journal_dir, store, rdb_version))
    })
    .await
    .map_err(|e| RestoreError::Other(e.to_string()))?;
    let (cut, journal_dir, store, rdb_version) = checked?;
    let stored = super::StoredChain {
        checkpoint: cut.checkpoint.clone(),
        rdb_version,
        end: crate::datadir::chain::ChainEnd {
            ids: cut.end.ids.clone(),
            offset: cut.at.offset,
            entries: cut.at.entries,
            bytes: cut.kept_bytes(),
        },
        next_lsn: 0,
    };
    tracing::info!(
        way_back = %dir.display(),
        offset = cut.at.offset,
        "rewind: the present kept; loading Valkey up to the cut"
    );
    let source = super::primary::Source::Dir {
        dir: journal_dir,
        at: cut.at,
    };
    let finish = super::primary::Finish::Promote;
    let (_, stored) =
        super::load(up, &store, source, stored, timeout, rates, finish, started).await?;
    Ok((
        Rewound {
            cut,
            way_back: copy,
        },
        stored,
    ))
}

/// Closes the proxy's connections to Valkey (its normal clients), after a rewind or one that
/// was refused: they belong to the history epoch before it (the gate answers their replies
/// `-LOADING`), and Valkey did not restart, which would have closed them. They open again
/// in the new epoch.
pub async fn close_clients(
    up: &crate::upstream::Upstream,
) -> Result<(), crate::upstream::client::UpstreamError> {
    crate::upstream::client::Conn::control(up)
        .await?
        .call(["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
        .await
        .map(drop)
}
