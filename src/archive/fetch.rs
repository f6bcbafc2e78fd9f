//! A data directory from the archive: the latest restore point's RDB and the journal objects
//! after it, verified (the RDB's size and CRC-64, each object's CRC and its place in the
//! stream) and written as `walrus backup` writes one: the checkpoint, and a new journal
//! holding the stream after it from LSN 1. `walrus serve` then restores Valkey from it as
//! from any data directory, verifying it again before Valkey is touched.
//!
//! The copy is made in `<dir>/.archive-restore` and moved into place (`journal/`, then
//! `checkpoints/`) once complete and synced; a walrus never starts from a restore cut short
//! (`refuse_partial`), and the next restore removes what one left.
//!
//! With a point in time (`--until TIME | --until-offset N | --before-command CMD`), the
//! restore starts from the newest restore point the cut can be made after (its checkpoint at
//! or before the cut), and the stream after it stops at the cut: decided and applied by the
//! functions a local point-in-time restore uses ([`crate::datadir::pitr`]).
//!
//! Also here: `walrus archive list` (the restore points) and `walrus archive verify`, the
//! restore drill: a restore into a scratch directory, checked as `walrus verify` checks a
//! data directory, then removed.

use super::manifest::{Manifest, RestorePoint};
use super::object::JournalObject;
use super::store::Store;
use super::timeline::{self, Cover};
use super::ArchiveError;
use crate::checkpoint::manifest::{Checkpoint, CHECKPOINT_FILE};
use crate::checkpoint::store::Store as LocalStore;
use crate::datadir::backup;
use crate::datadir::chain::{self, ChainError};
use crate::datadir::pitr::{self, Cut, Until};
use crate::datadir::DataDirError;
use crate::journal::reader::ReplayEntry;
use crate::journal::JournalError;
use std::cell::RefCell;
use std::path::{Path, PathBuf};

/// Where a restore from the archive is staged inside the data directory.
pub const STAGING: &str = ".archive-restore";

/// A restore point, the journal objects that carry it forward, and where a point-in-time
/// restore cuts them (`None`: everything they hold).
#[derive(Debug, Clone)]
pub struct Plan {
    pub manifest: Manifest,
    pub point: RestorePoint,
    pub cover: Cover,
    pub cut: Option<Cut>,
}

impl Plan {
    /// The journal offset its restore point still waits for its timeline's objects to reach
    /// ([`RestorePoint::complete_at`]); `None` once it is whole.
    pub fn waiting_for(&self) -> Option<u64> {
        self.point.complete_at.filter(|at| self.cover.end < *at)
    }
}

/// What a restore from the archive wrote.
#[derive(Debug, Clone)]
pub struct Restored {
    pub plan: Plan,
    pub entries: u64,
    pub stream_bytes: u64,
    pub end_offset: u64,
}

impl std::fmt::Display for Restored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(cut) = &self.plan.cut {
            write!(f, "{cut}")?;
        }
        let p = &self.plan.point;
        writeln!(
            f,
            "restore point: timeline {}, offset {} of {} ({} bytes of RDB, recorded {})",
            p.timeline,
            p.offset,
            p.replid,
            p.size,
            p.recorded()
        )?;
        writeln!(
            f,
            "journal: {} objects, {} entries, {} bytes of stream, offsets {}..{}",
            self.plan.cover.objects.len(),
            self.entries,
            self.stream_bytes,
            p.offset,
            self.end_offset
        )
    }
}

/// The archive's restore points, oldest first (by timeline, then offset), each with the
/// objects that carry it forward.
pub async fn list(store: &Store) -> Result<Vec<Plan>, ArchiveError> {
    let Some((manifest, _)) = super::owner::read(store).await? else {
        return Ok(Vec::new());
    };
    let mut by_timeline = std::collections::BTreeMap::new();
    let mut out = Vec::new();
    for point in &manifest.restore_points {
        if let std::collections::btree_map::Entry::Vacant(e) = by_timeline.entry(point.timeline) {
            e.insert(timeline::objects(store, point.timeline).await?);
        }
        out.push(Plan {
            manifest: manifest.clone(),
            point: point.clone(),
            cover: timeline::cover(&by_timeline[&point.timeline], point.offset),
            cut: None,
        });
    }
    out.sort_by_key(|p| (p.point.timeline, p.point.offset, p.point.created));
    Ok(out)
}

/// The latest restore point whose journal reaches what its writer held when it recorded it
/// ([`Plan::waiting_for`]), or `None` for an archive without one. A newer one still waiting
/// for its journal is passed over for the one before it; an archive with no whole one is
/// refused, with how far the newest reaches.
pub async fn latest(store: &Store) -> Result<Option<Plan>, ArchiveError> {
    let plans = list(store).await?;
    let Some(newest) = plans.last() else {
        return Ok(None);
    };
    let refusal = newest.waiting_for().map(|at| {
        ArchiveError::Store(format!(
            "no restore point is whole yet: the newest (timeline {}, offset {}) has its journal \
             uploaded to offset {} of {at}, and its writer is still uploading it; retry once \
             `walrus archive list` shows it reaching {at}",
            newest.point.timeline, newest.point.offset, newest.cover.end
        ))
    });
    match plans.into_iter().rev().find(|p| p.waiting_for().is_none()) {
        Some(plan) => Ok(Some(plan)),
        None => Err(refusal.expect("the newest is waiting, or it would have been found")),
    }
}

/// The plan for a restore up to `until`: the latest restore point, all of it, for
/// [`Until::End`]; otherwise the newest restore point after which the cut can be made, tried
/// newest first (each try reads its journal objects once), and the cut.
pub async fn plan(store: &Store, until: &Until) -> Result<Plan, ArchiveError> {
    let none = || ArchiveError::Config(format!("{} has no restore point yet", store.url()));
    if *until == Until::End {
        return latest(store).await?.ok_or_else(none);
    }
    let plans = list(store).await?;
    if plans.is_empty() {
        return Err(none());
    }
    let mut refusals = Vec::new();
    for mut plan in plans.into_iter().rev() {
        // What the restore point alone shows to be after the cut is not read.
        let after = match until {
            Until::Offset(o) => plan.point.offset > *o,
            Until::Time(t) => plan.point.time_ms.is_some_and(|c| c > *t),
            Until::End | Until::BeforeCommand(_) => false,
        };
        if after {
            continue;
        }
        // A restore point still waiting for its journal: a cut in it could fall short of
        // what the one before it holds ([`latest`]).
        if let Some(at) = plan.waiting_for() {
            refusals.push(format!(
                "from timeline {} offset {}: its journal is uploaded to offset {} of {at}",
                plan.point.timeline, plan.point.offset, plan.cover.end
            ));
            continue;
        }
        let cp = checkpoint_of(&plan.point)?;
        let (store2, objects, until2) = (store.clone(), plan.cover.objects.clone(), until.clone());
        let runtime = tokio::runtime::Handle::current();
        let found = tokio::task::spawn_blocking(move || {
            let failure = RefCell::new(None);
            let found = pitr::find::find_cut(
                &cp,
                object_entries(&store2, &objects, &runtime, &failure),
                &until2,
            );
            match failure.into_inner() {
                Some(e) => Err(e),
                None => Ok(found),
            }
        })
        .await
        .map_err(|e| ArchiveError::Local(e.to_string()))??;
        match found {
            Ok(cut) => {
                plan.cut = Some(cut);
                return Ok(plan);
            }
            Err(DataDirError::Refused(why)) => refusals.push(format!(
                "from timeline {} offset {}: {why}",
                plan.point.timeline, plan.point.offset
            )),
            Err(e) => return Err(ArchiveError::Corrupt(e.to_string())),
        }
    }
    Err(ArchiveError::Config(format!(
        "{until}: no restore point of {} can be cut so{}",
        store.url(),
        if refusals.is_empty() {
            " (every one is after it)".to_string()
        } else {
            format!(":\n  {}", refusals.join("\n  "))
        }
    )))
}

/// Refuses to start from a data directory a restore from the archive was cut short in.
pub fn refuse_partial(data_dir: &Path) -> Result<(), ArchiveError> {
    if data_dir.join(STAGING).exists() {
        return Err(ArchiveError::Config(format!(
            "a restore from the archive into {} was cut short ({} is still there): run it again (`walrus archive restore --data-dir {}`, or start with archive.bootstrap), which removes what it left",
            data_dir.display(),
            data_dir.join(STAGING).display(),
            data_dir.display()
        )));
    }
    Ok(())
}

/// Whether `data_dir` holds nothing a walrus would start from (no journal, no checkpoint),
/// or only a restore from the archive that was cut short.
pub fn holds_nothing(data_dir: &Path) -> bool {
    let staged = data_dir.join(STAGING).exists();
    staged
        || !(data_dir
            .join("journal")
            .join(crate::journal::manifest::MANIFEST_FILE)
            .exists()
            || data_dir.join("checkpoints").join(CHECKPOINT_FILE).exists())
}

/// Writes the data directory `dir` (holding nothing yet, [`holds_nothing`]) from `plan`,
/// with a journal ring of `geometry` (segment size, segments), and notes whose archive it
/// came from, so that it may take the archive over.
pub async fn restore(
    store: &Store,
    plan: Plan,
    dir: &Path,
    geometry: (u64, u32),
) -> Result<Restored, ArchiveError> {
    if !holds_nothing(dir) {
        return Err(ArchiveError::Config(format!(
            "{} holds a journal or a checkpoint already: restore from the archive into a new or empty data directory",
            dir.display()
        )));
    }
    let staging = dir.join(STAGING);
    let local = |what: &str, p: &Path, e: std::io::Error| {
        ArchiveError::Local(format!("{what} {}: {e}", p.display()))
    };
    // Left by a restore cut short: what it moved into place goes too (it held nothing else).
    if staging.exists() {
        for sub in ["journal", "checkpoints"] {
            let p = dir.join(sub);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(|e| local("removing", &p, e))?;
            }
        }
        std::fs::remove_dir_all(&staging).map_err(|e| local("removing", &staging, e))?;
    }
    std::fs::create_dir_all(staging.join("checkpoints"))
        .map_err(|e| local("creating", &staging, e))?;
    let p = &plan.point;
    let cp = checkpoint_of(p)?;
    let rdb = staging.join("checkpoints").join(&cp.file);
    store.get_to_file(&p.key, &rdb).await?;
    let cp_dir = staging.join("checkpoints");
    let checked = {
        let (cp_dir, cp) = (cp_dir.clone(), cp.clone());
        tokio::task::spawn_blocking(move || LocalStore::read_only(&cp_dir)?.verify(&cp))
            .await
            .map_err(|e| ArchiveError::Local(e.to_string()))?
    };
    checked.map_err(|e| ArchiveError::Corrupt(format!("{}: {e}", p.key)))?;
    let copy = backup::copy::new_journal(&staging, geometry)
        .map_err(|e| ArchiveError::Local(e.to_string()))?;
    let runtime = tokio::runtime::Handle::current();
    let (store2, staging2, cp2, objects, cut) = (
        store.clone(),
        staging.clone(),
        cp.clone(),
        plan.cover.objects.clone(),
        plan.cut.clone(),
    );
    let written = tokio::task::spawn_blocking(move || {
        let chain = Chain {
            store: &store2,
            objects: &objects,
            cp: &cp2,
            cut: cut.as_ref(),
        };
        write_chain(chain, copy, &staging2, geometry, &runtime)
    })
    .await
    .map_err(|e| ArchiveError::Local(e.to_string()))??;
    // Journal first: a directory with a journal and no checkpoint is refused at start,
    // one with a checkpoint and no journal would not be. The staging directory goes last.
    for sub in ["journal", "checkpoints"] {
        std::fs::rename(staging.join(sub), dir.join(sub))
            .map_err(|e| local("moving into place", &dir.join(sub), e))?;
    }
    crate::journal::manifest::fsync_dir(dir).map_err(|e| ArchiveError::Local(e.to_string()))?;
    super::identity::note_restored(dir, &plan.manifest.writer.identity)?;
    std::fs::remove_dir_all(&staging).map_err(|e| local("removing", &staging, e))?;
    crate::journal::manifest::fsync_dir(dir).map_err(|e| ArchiveError::Local(e.to_string()))?;
    Ok(Restored {
        plan,
        entries: written.entries,
        stream_bytes: written.bytes,
        end_offset: written.offset,
    })
}

/// The checkpoint a restore point records, as the data directory made from it records it.
fn checkpoint_of(p: &RestorePoint) -> Result<Checkpoint, ArchiveError> {
    Ok(Checkpoint {
        file: format!("checkpoint-{}-{}.rdb", p.replid, p.offset),
        replid: p.replid.clone(),
        offset: p.offset,
        size: p.size,
        crc64: p
            .crc64()
            .map_err(|e| ArchiveError::Corrupt(e.to_string()))?,
        from_lsn: 1,
        rdb_version: p.rdb_version,
        written_by: p.written_by.clone(),
        newest_server: p.newest_server.clone(),
        time_ms: p.time_ms,
    })
}

/// The entries of `objects`, each object downloaded in its turn (blocking), numbered from
/// LSN 1: the walk checks the stream, not the LSNs of the journal the objects came from, and
/// a cut names entries by these numbers. A download or an object that does not decode ends
/// them with an error, its cause left in `failure`.
fn object_entries<'a>(
    store: &'a Store,
    objects: &'a [JournalObject],
    runtime: &'a tokio::runtime::Handle,
    failure: &'a RefCell<Option<ArchiveError>>,
) -> impl Iterator<Item = Result<ReplayEntry, JournalError>> + 'a {
    let mut lsn = 0u64;
    objects.iter().flat_map(move |o| {
        let got = runtime.block_on(store.get(&o.key())).and_then(|b| {
            let b = b.ok_or_else(|| ArchiveError::Corrupt(format!("{} is gone", o.key())))?;
            o.decode(b)
                .map_err(|why| ArchiveError::Corrupt(format!("{}: {why}", o.key())))
        });
        let items: Vec<Result<ReplayEntry, JournalError>> = match got {
            Ok(es) => es
                .into_iter()
                .map(|e| {
                    lsn += 1;
                    Ok(ReplayEntry {
                        lsn,
                        repl_id: o.replid,
                        repl_offset_end: e.end,
                        payload: e.payload,
                        time_ms: e.time_ms,
                    })
                })
                .collect(),
            Err(e) => {
                let text = e.to_string();
                *failure.borrow_mut() = Some(e);
                vec![Err(JournalError::InvalidArgument(text))]
            }
        };
        items
    })
}

/// What a restore writes after the checkpoint: the objects' stream, up to the cut if any.
struct Chain<'a> {
    store: &'a Store,
    objects: &'a [JournalObject],
    cp: &'a Checkpoint,
    cut: Option<&'a Cut>,
}

/// Downloads each object in turn and appends the stream after the checkpoint (up to the
/// cut) to `copy`, by the chain's rule; then records the checkpoint. Blocking.
fn write_chain(
    chain: Chain,
    copy: crate::journal::Journal,
    dir: &Path,
    geometry: (u64, u32),
    runtime: &tokio::runtime::Handle,
) -> Result<chain::ChainEnd, ArchiveError> {
    let failure = RefCell::new(None);
    let entries = object_entries(chain.store, chain.objects, runtime, &failure);
    let entries: Box<dyn Iterator<Item = _>> = match chain.cut {
        Some(c) => Box::new(pitr::through(entries, c.at)),
        None => Box::new(entries),
    };
    let cp = chain.cp;
    let id = copy.data_dir_id();
    let mut append_failed = None;
    let walked = chain::walk_entries(entries, cp, |slice| {
        backup::copy::append_slice(&copy, slice, runtime, geometry).map_err(|e| {
            let text = e.to_string();
            append_failed = Some(e);
            ChainError::Journal(JournalError::InvalidArgument(text))
        })
    });
    let closed = copy.close();
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    if let Some(e) = append_failed {
        return Err(ArchiveError::Local(e.to_string()));
    }
    let end = walked.map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
    if let Some(c) = chain.cut {
        c.reached(&end)
            .map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
    }
    backup::copy::record_copy(dir, cp, id, closed, end.entries)
        .map_err(|e| ArchiveError::Local(e.to_string()))?;
    Ok(end)
}

/// The restore drill: the latest restore point restored into a new directory under
/// `scratch`, checked as `walrus verify` checks a data directory, then removed.
pub async fn verify(
    store: &Store,
    scratch: &Path,
    geometry: (u64, u32),
) -> Result<(Restored, crate::datadir::verify::Verified), ArchiveError> {
    let plan = latest(store)
        .await?
        .ok_or_else(|| ArchiveError::Config(format!("{} has no restore point yet", store.url())))?;
    let dir: PathBuf = scratch.join(format!(".walrus-archive-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| ArchiveError::Local(format!("creating {}: {e}", dir.display())))?;
    let result = async {
        let restored = restore(store, plan, &dir, geometry).await?;
        let d = dir.clone();
        let verified =
            tokio::task::spawn_blocking(move || crate::datadir::verify::verify_data_dir(&d, None))
                .await
                .map_err(|e| ArchiveError::Local(e.to_string()))?
                .map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
        Ok((restored, verified))
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
