//! A point-in-time restore of a data directory, a copy cut where [`crate::datadir::pitr`] says:
//! `walrus restore --from-dir DIR --data-dir NEW` writes the checkpoint and the journal after
//! it up to the cut into a new data directory, as `walrus backup` writes one (each entry keeps
//! its time), which `walrus serve --data-dir NEW` then restores Valkey from. Nothing of `DIR`
//! is written: a stopped walrus's data directory, or a backup, perhaps on read-only media.
//!
//! The restored Valkey does not go on with the history it was cut from as if the rest had not
//! happened: a restore promotes it, which gives it a new replication id (the old one kept as
//! its previous id, valid up to the cut), and the journal goes on under the new one.
//!
//! A running walrus rewinds its Valkey in place from a copy of its own data directory, cut by
//! [`plan`] (`crate::restore::rewind`).

use super::copy::{Read, Summary};
use super::Stopped;
use crate::checkpoint::store::Store;
use crate::datadir::pitr::{Cut, Until};
use crate::datadir::DataDirError;
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
pub fn plan(from: &Path, until: &Until) -> Result<Cut, DataDirError> {
    let stopped = Stopped::of(from, (None, None))?;
    cut(&stopped, until)
}

fn cut(stopped: &Stopped, until: &Until) -> Result<Cut, DataDirError> {
    let store = Store::read_only(&stopped.cp_dir)?;
    let cp = store.recorded().ok_or_else(|| {
        DataDirError::Refused(format!(
            "{} records no checkpoint: there is nothing to restore from",
            stopped.cp_dir.display()
        ))
    })?;
    let entries = Read::Dir(&stopped.journal_dir).entries(cp.from_lsn)?;
    crate::datadir::pitr::find::find_cut(&cp, entries, until)
}

/// Writes what the data directory `from` holds, up to where `until` cuts it, into the new
/// data directory `to`, with a ring of `geometry` (`from`'s where not given). Blocking.
pub fn into_new_dir(
    from: &Path,
    to: &Path,
    until: &Until,
    geometry: (Option<u64>, Option<u32>),
) -> Result<Restored, DataDirError> {
    let stopped = Stopped::of(from, geometry)?;
    let cut = cut(&stopped, until)?;
    let copy = stopped.copy(&Read::Dir(&stopped.journal_dir), to, Some(&cut))?;
    Ok(Restored { cut, copy })
}
