//! A point-in-time restore of a data directory ([`super::pitr`] decides where it is cut):
//! `walrus restore --from-dir DIR --data-dir NEW` writes the checkpoint and the journal after
//! it up to the cut into a new data directory, as `walrus backup` writes one (each entry keeps
//! its time), which `walrus serve --data-dir NEW` then restores Valkey from. Nothing of `DIR`
//! is written: a stopped walrus's data directory, or a backup, perhaps on read-only media.
//!
//! The restored Valkey does not go on with the history it was cut from as if the rest had not
//! happened: a restore promotes it, which gives it a new replication id (the old one kept as
//! its previous id, valid up to the cut), and the journal goes on under the new one.
//!
//! In place ([`in_place`]): a running walrus keeps the present in a new data directory (its
//! way back), then loads its Valkey from that copy up to the cut, the same cut and the same
//! load as any restore ([`super::load`] with [`super::primary::Source::Dir`]).

use super::backup::{Read, Stopped, Summary};
use super::pitr::{self, Cut, Until};
use super::RestoreError;
use crate::checkpoint::store::Store;
use std::path::Path;

/// What a point-in-time restore into a new data directory wrote.
#[derive(Debug, Clone)]
pub struct Restored {
    pub cut: Cut,
    pub copy: Summary,
}

impl std::fmt::Display for Restored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.cut)?;
        let to = self.copy.to.display();
        writeln!(f, "data directory {to} written")?;
        self.copy.write_contents(f)?;
        writeln!(
            f,
            "start walrus with --data-dir {to} to restore Valkey from it"
        )
    }
}

/// Where `until` cuts what the data directory `from` holds (read only: blocking, it reads
/// the whole journal after the checkpoint once).
pub fn plan(from: &Path, until: &Until) -> Result<Cut, RestoreError> {
    let stopped = Stopped::of(from, (None, None))?;
    cut(&stopped, until)
}

fn cut(stopped: &Stopped, until: &Until) -> Result<Cut, RestoreError> {
    let store = Store::read_only(&stopped.cp_dir)?;
    let cp = store.recorded().ok_or_else(|| {
        RestoreError::Refused(format!(
            "{} records no checkpoint: there is nothing to restore from",
            stopped.cp_dir.display()
        ))
    })?;
    let entries = Read::Dir(&stopped.journal_dir).entries(cp.from_lsn)?;
    pitr::find_cut(&cp, entries, until)
}

/// Writes what the data directory `from` holds, up to where `until` cuts it, into the new
/// data directory `to`, with a ring of `geometry` (`from`'s where not given). Blocking.
pub fn into_new_dir(
    from: &Path,
    to: &Path,
    until: &Until,
    geometry: (Option<u64>, Option<u32>),
) -> Result<Restored, RestoreError> {
    let stopped = Stopped::of(from, geometry)?;
    let cut = cut(&stopped, until)?;
    let copy = stopped.copy(&Read::Dir(&stopped.journal_dir), to, Some(&cut))?;
    Ok(Restored { cut, copy })
}

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
    backups: &super::backup::Backups,
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
        let (journal_dir, cp_dir) = super::verify::data_dirs(&d);
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
        end: super::chain::ChainEnd {
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
