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
//! Also here: `walrus archive list` (the restore points) and `walrus archive verify`, the
//! restore drill: a restore into a scratch directory, checked as `walrus verify` checks a
//! data directory, then removed.

use super::manifest::{Manifest, RestorePoint};
use super::object::JournalObject;
use super::store::Store;
use super::timeline::{self, Cover};
use super::ArchiveError;
use crate::checkpoint::store::{Checkpoint, Store as LocalStore, CHECKPOINT_FILE};
use crate::journal::reader::ReplayEntry;
use crate::journal::JournalError;
use crate::restore::backup;
use crate::restore::chain::{self, ChainError};
use std::path::{Path, PathBuf};

/// Where a restore from the archive is staged inside the data directory.
pub const STAGING: &str = ".archive-restore";

/// A restore point, and the journal objects that carry it forward.
#[derive(Debug, Clone)]
pub struct Plan {
    pub manifest: Manifest,
    pub point: RestorePoint,
    pub cover: Cover,
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

/// The archive's restore points, each with the objects that carry it forward.
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
        });
    }
    Ok(out)
}

/// The latest restore point, or `None` for an archive without one.
pub async fn latest(store: &Store) -> Result<Option<Plan>, ArchiveError> {
    let Some((manifest, _)) = super::owner::read(store).await? else {
        return Ok(None);
    };
    let Some(point) = manifest.latest().cloned() else {
        return Ok(None);
    };
    let objects = timeline::objects(store, point.timeline).await?;
    let cover = timeline::cover(&objects, point.offset);
    Ok(Some(Plan {
        manifest,
        point,
        cover,
    }))
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
    let cp = Checkpoint {
        file: format!("checkpoint-{}-{}.rdb", p.replid, p.offset),
        replid: p.replid.clone(),
        offset: p.offset,
        size: p.size,
        crc64: p.crc64().map_err(ArchiveError::Corrupt)?,
        from_lsn: 1,
        rdb_version: p.rdb_version,
        written_by: p.written_by.clone(),
        newest_server: p.newest_server.clone(),
    };
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
    let copy =
        backup::new_journal(&staging, geometry).map_err(|e| ArchiveError::Local(e.to_string()))?;
    let runtime = tokio::runtime::Handle::current();
    let (store2, staging2, cp2, objects) = (
        store.clone(),
        staging.clone(),
        cp.clone(),
        plan.cover.objects.clone(),
    );
    let written = tokio::task::spawn_blocking(move || {
        write_chain(&store2, &objects, &cp2, copy, &staging2, geometry, &runtime)
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

/// Downloads each object in turn and appends the stream after the checkpoint to `copy`, by
/// the chain's rule; then records the checkpoint. Blocking.
fn write_chain(
    store: &Store,
    objects: &[JournalObject],
    cp: &Checkpoint,
    copy: crate::journal::Journal,
    dir: &Path,
    geometry: (u64, u32),
    runtime: &tokio::runtime::Handle,
) -> Result<chain::ChainEnd, ArchiveError> {
    let mut failure: Option<ArchiveError> = None;
    let mut lsn = 0u64;
    let entries = objects.iter().flat_map(|o| {
        let got = runtime.block_on(store.get(&o.key())).and_then(|b| {
            let b = b.ok_or_else(|| ArchiveError::Corrupt(format!("{} is gone", o.key())))?;
            o.decode(b)
                .map_err(|why| ArchiveError::Corrupt(format!("{}: {why}", o.key())))
        });
        let items: Vec<Result<ReplayEntry, JournalError>> = match got {
            Ok(es) => es
                .into_iter()
                .map(|e| {
                    // LSNs of the new journal: the walk checks the stream, not the LSNs of
                    // the journal the objects came from.
                    lsn += 1;
                    Ok(ReplayEntry {
                        lsn,
                        repl_id: o.replid,
                        repl_offset_end: e.end,
                        payload: e.payload,
                    })
                })
                .collect(),
            Err(e) => {
                let text = e.to_string();
                failure = Some(e);
                vec![Err(JournalError::InvalidArgument(text))]
            }
        };
        items
    });
    let id = copy.data_dir_id();
    let mut append_failed = None;
    let walked = chain::walk_entries(entries, cp, |slice| {
        backup::append_slice(&copy, slice, runtime, geometry).map_err(|e| {
            let text = e.to_string();
            append_failed = Some(e);
            ChainError::Journal(JournalError::InvalidArgument(text))
        })
    });
    let closed = copy.close();
    if let Some(e) = failure {
        return Err(e);
    }
    if let Some(e) = append_failed {
        return Err(ArchiveError::Local(e.to_string()));
    }
    let end = walked.map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
    backup::record_copy(dir, cp, id, closed, end.entries)
        .map_err(|e| ArchiveError::Local(e.to_string()))?;
    Ok(end)
}

/// The restore drill: the latest restore point restored into a new directory under
/// `scratch`, checked as `walrus verify` checks a data directory, then removed.
pub async fn verify(
    store: &Store,
    scratch: &Path,
    geometry: (u64, u32),
) -> Result<(Restored, crate::restore::verify::Verified), ArchiveError> {
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
            tokio::task::spawn_blocking(move || crate::restore::verify::verify_data_dir(&d, None))
                .await
                .map_err(|e| ArchiveError::Local(e.to_string()))?
                .map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
        Ok((restored, verified))
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
