//! The checkpoint store: RDB files under `<data>/checkpoints/` and the manifest that names
//! the current one ([`super::manifest`]: the only authority on which RDB a restore starts
//! from), written with the data directory's identity. An RDB is stored under a name no file
//! has ([`Store::path_for`]), recorded by replacing the manifest, and the RDBs it no longer
//! names are deleted only then; each is verified (size, CRC-64, format) before every use.

use super::manifest::{Checkpoint, Extent, Recorded, CHECKPOINT_FILE};
use super::rdb_file::{self, StoredRdb};
use crate::journal::manifest::{create_dir_durably, replace_file, DataDirId};
use crate::upstream::server::ServerVersion;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Why the store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("checkpoint manifest {path}: {why}")]
    Manifest { path: PathBuf, why: String },
    #[error("checkpoint {path} fails verification: {why}")]
    Corrupt { path: PathBuf, why: String },
    #[error("checkpoint store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    /// The identity every manifest written carries (`None`: a store read as it is, from a
    /// manifest written before identities).
    data_dir_id: Option<DataDirId>,
    /// The manifest's record as last read or written, shared by every clone.
    recorded: Arc<Mutex<Option<Checkpoint>>>,
    /// When the recorded checkpoint's RDB was written, in ms since the Unix epoch (0:
    /// unknown): its `time_ms`, or, in a manifest written before those, its file's
    /// modification time, read when the store is opened. Kept in memory so that INFO and
    /// `/status`, on the proxy's threads, never stat a file: on a file system that stopped
    /// answering, a `stat` there would stop every client with it.
    written_ms: Arc<AtomicU64>,
    /// Held by whoever replaces the manifest (a checkpoint's record, the link's note of a
    /// newer server): neither may replace a record the other has just written with the
    /// older one it read.
    writer: Arc<Mutex<()>>,
}

impl Store {
    /// Opens the store of the data directory `data_dir_id` names, creating the directory,
    /// writing the identity into the manifest where it lacks one (a new data directory, or
    /// one written before identities), and deleting what a crash left behind: half-written
    /// `*.tmp` files, and RDBs the manifest does not name (stored, but the crash came before
    /// they were recorded, or recorded over before they were deleted). An RDB is deleted
    /// only on a manifest's word: with no manifest, one is an error, and a manifest of
    /// another data directory is one too (`crate::datadir::parts` refuses both first,
    /// saying why and what to do); a manifest whose own RDB is gone removes none.
    pub fn open(dir: &Path, data_dir_id: &DataDirId) -> Result<Store, StoreError> {
        let io = |source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        };
        create_dir_durably(dir).map_err(io)?;
        let found = Store::manifest(dir)?;
        let rdbs = Store::rdbs(dir).map_err(io)?;
        let bad = |why: String| StoreError::Manifest {
            path: dir.join(CHECKPOINT_FILE),
            why,
        };
        let current = found.as_ref().and_then(|m| m.checkpoint.clone());
        match &found {
            None if !rdbs.is_empty() => {
                return Err(bad(format!(
                    "missing, and {} holds {}: not removed on a guess",
                    dir.display(),
                    rdbs.join(", ")
                )))
            }
            Some(Recorded {
                data_dir_id: Some(id),
                checkpoint: Some(_),
            }) if id != data_dir_id => {
                return Err(bad(format!(
                    "of data directory {id}, not of this one ({data_dir_id})"
                )))
            }
            _ => {}
        }
        let store = Store {
            dir: dir.to_path_buf(),
            data_dir_id: Some(data_dir_id.clone()),
            written_ms: Arc::new(AtomicU64::new(written_ms(dir, current.as_ref()))),
            recorded: Arc::new(Mutex::new(current.clone())),
            writer: Arc::default(),
        };
        if found.is_none_or(|m| m.data_dir_id.as_ref() != Some(data_dir_id)) {
            store.write_manifest(current.as_ref())?;
        }
        // A manifest naming a file that is gone has lost its word on the others: they stay,
        // and the verification of the named one refuses the start.
        let named_there = current.as_ref().is_none_or(|c| store.path_of(c).is_file());
        for e in std::fs::read_dir(dir).map_err(io)? {
            let p = e.map_err(io)?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            // Only files are walrus's leftovers: a directory here is someone else's, kept.
            let stale = p.is_file()
                && (name.ends_with(".tmp")
                    || (name.ends_with(".rdb")
                        && named_there
                        && current.as_ref().is_none_or(|c| c.file != name)));
            if stale {
                tracing::info!(path = %p.display(), "removing a stale checkpoint file");
                std::fs::remove_file(&p).map_err(io)?;
            }
        }
        Ok(store)
    }

    /// The store in `dir` as it is, for reading only: nothing is created or removed
    /// (`walrus verify` reads a stopped walrus's directory, or a backup, without changing
    /// it; `open` would delete what it takes for a crash's leftovers).
    pub fn read_only(dir: &Path) -> Result<Store, StoreError> {
        let found = Store::manifest(dir)?;
        let current = found.as_ref().and_then(|m| m.checkpoint.clone());
        Ok(Store {
            dir: dir.to_path_buf(),
            data_dir_id: found.and_then(|m| m.data_dir_id),
            written_ms: Arc::new(AtomicU64::new(written_ms(dir, current.as_ref()))),
            recorded: Arc::new(Mutex::new(current)),
            writer: Arc::default(),
        })
    }

    /// The manifest in `dir`, as it is; `None` when there is none.
    pub fn manifest(dir: &Path) -> Result<Option<Recorded>, StoreError> {
        let path = dir.join(CHECKPOINT_FILE);
        let bad = |why: String| StoreError::Manifest {
            path: path.clone(),
            why,
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Recorded::parse(&text)
                .map(Some)
                .map_err(|e| bad(e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(bad(e.to_string())),
        }
    }

    /// The names of the RDBs in `dir` (none if there is no `dir`), sorted.
    pub fn rdbs(dir: &Path) -> std::io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            r => r?,
        };
        let mut names = Vec::new();
        for e in entries {
            let p = e?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if p.is_file() && name.ends_with(".rdb") {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where a new RDB of `replid` at `offset` is stored before it is recorded: a name no
    /// file has, so that a new RDB never replaces the recorded one (two checkpoints with no
    /// write between them share an offset), and not the recorded one's even when its file was
    /// deleted by hand (a reader of the record, the archive's uploader, would take the new
    /// bytes for the recorded ones). Only the manifest switches from one to the next.
    /// The name is reserved by creating its temporary file (`.rdb.tmp`, which
    /// [`rdb_file::receive`] writes and renames), since the link and a checkpoint may both ask.
    pub fn path_for(&self, replid: &str, offset: u64) -> Result<PathBuf, StoreError> {
        let recorded = self.recorded().map(|c| self.path_of(&c));
        for n in 0u64.. {
            let p = match n {
                0 => self.dir.join(format!("checkpoint-{replid}-{offset}.rdb")),
                n => self
                    .dir
                    .join(format!("checkpoint-{replid}-{offset}-{n}.rdb")),
            };
            let tmp = p.with_extension("rdb.tmp");
            let io = |source| StoreError::Io {
                path: tmp.clone(),
                source,
            };
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
            {
                // Free unless an RDB of that name was renamed into place before.
                Ok(_) if !p.exists() && recorded.as_ref() != Some(&p) => return Ok(p),
                Ok(_) => std::fs::remove_file(&tmp).map_err(io)?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(e)),
            }
        }
        unreachable!("some name is free")
    }

    /// [`Store::path_for`] on tokio's blocking threads: a file system that stopped answering
    /// holds the checkpoint or resync that asks, never the proxy's threads.
    pub async fn reserve(&self, replid: &str, offset: u64) -> Result<PathBuf, StoreError> {
        let (store, replid) = (self.clone(), replid.to_string());
        tokio::task::spawn_blocking(move || store.path_for(&replid, offset))
            .await
            .map_err(|e| StoreError::Io {
                path: self.dir.clone(),
                source: std::io::Error::other(e),
            })?
    }

    /// [`record`](Self::record); on failure the stored RDB is removed, unless the manifest
    /// names it after all (replaced before a failed directory fsync): the checkpoint in force
    /// stays, and a failed one keeps no space.
    pub fn record_or_discard(
        &self,
        stored: &StoredRdb,
        written_by: &str,
        replid: &str,
        offset: u64,
        from_lsn: u64,
    ) -> Result<Checkpoint, StoreError> {
        let recorded = self.record(stored, written_by, replid, offset, from_lsn);
        if let Ok(c) = &recorded {
            crate::metrics::CHECKPOINT_WRITTEN_BYTES.inc_by(c.size);
        }
        if recorded.is_err() {
            let named = self.current().ok().flatten().map(|c| c.file);
            if named.as_deref() != stored.path.file_name().and_then(|n| n.to_str()) {
                let _ = std::fs::remove_file(&stored.path);
            }
        }
        recorded
    }

    pub fn path_of(&self, c: &Checkpoint) -> PathBuf {
        self.dir.join(&c.file)
    }

    /// When the recorded checkpoint's RDB was written, if known; from memory (no I/O).
    pub fn written_at(&self) -> Option<std::time::SystemTime> {
        let ms = self.written_ms.load(Ordering::Acquire);
        (ms > 0).then(|| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
    }

    /// The recorded checkpoint, from memory (no I/O).
    pub fn recorded(&self) -> Option<Checkpoint> {
        self.recorded
            .lock()
            .expect("checkpoint record lock")
            .clone()
    }

    /// The recorded checkpoint's `from_lsn`.
    pub fn recorded_from_lsn(&self) -> Option<u64> {
        self.recorded_extent().map(|e| e.from_lsn)
    }

    /// The recorded checkpoint's figures, from memory: asked after every durable advance,
    /// so it copies no strings.
    pub fn recorded_extent(&self) -> Option<Extent> {
        self.recorded
            .lock()
            .expect("checkpoint record lock")
            .as_ref()
            .map(|c| Extent {
                size: c.size,
                offset: c.offset,
                from_lsn: c.from_lsn,
            })
    }

    /// The recorded checkpoint, read from the manifest.
    pub fn current(&self) -> Result<Option<Checkpoint>, StoreError> {
        Ok(Store::manifest(&self.dir)?.and_then(|m| m.checkpoint))
    }

    /// Records a stored RDB, written by the server `written_by` names, as the current
    /// checkpoint (atomically), then deletes every other RDB: from here on a restore starts
    /// from this one.
    fn record(
        &self,
        stored: &StoredRdb,
        written_by: &str,
        replid: &str,
        offset: u64,
        from_lsn: u64,
    ) -> Result<Checkpoint, StoreError> {
        let file = stored
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("stored RDBs have UTF-8 names")
            .to_string();
        let c = Checkpoint {
            file,
            replid: replid.to_string(),
            offset,
            size: stored.bytes,
            crc64: stored.crc64,
            from_lsn,
            rdb_version: Some(stored.version),
            written_by: Some(written_by.to_string()),
            newest_server: None,
            time_ms: Some(crate::units::time::now_ms()),
        };
        {
            let _writing = self.writer.lock().expect("manifest writer lock");
            // A checkpoint older than the recorded one of the same history would leave the
            // journal between them released: the chain would have a gap.
            if let Some(r) = self
                .recorded()
                .filter(|r| r.replid == c.replid && r.offset > offset)
            {
                return Err(StoreError::Manifest {
                    path: self.dir.join(CHECKPOINT_FILE),
                    why: format!(
                        "refusing to record {} at offset {offset}: the recorded {} is at offset {}",
                        c.file, r.file, r.offset
                    ),
                });
            }
            // The link's full resync and a checkpoint may store RDBs at once, and each
            // record removes every other RDB: one stored here may be gone already. The
            // manifest must never name a file that is not there (a restore, or the next
            // start, would find nothing to load): then this one is not recorded.
            if let Err(e) = std::fs::metadata(&stored.path) {
                return Err(StoreError::Manifest {
                    path: self.dir.join(CHECKPOINT_FILE),
                    why: format!(
                        "not recording {}: {e} (a checkpoint recorded meanwhile removed it)",
                        c.file
                    ),
                });
            }
            self.write(&c)?;
            crate::fault::fail_point!("checkpoint::manifest_switched");
            // Under the lock too: a record's removals never outrun the next record's check.
            self.remove_others(&c.file);
        }
        Ok(c)
    }

    /// Notes that the journal is about to take the stream of `server`: if the recorded
    /// checkpoint and journal hold nothing of a server that runs all of its commands, the
    /// manifest says so from now on (atomically, before anything of it is journaled).
    pub fn note_server(&self, server: &ServerVersion) -> Result<(), StoreError> {
        let _writing = self.writer.lock().expect("manifest writer lock");
        let Some(mut c) = self.recorded() else {
            return Ok(());
        };
        if c.servers().any(|s| s.runs_all_of(server)) {
            return Ok(());
        }
        c.newest_server = Some(server.to_string());
        self.write(&c)
    }

    /// Replaces the manifest with `c`, atomically (under the writer lock).
    fn write(&self, c: &Checkpoint) -> Result<(), StoreError> {
        self.write_manifest(Some(c))?;
        if let Some(ms) = c.time_ms {
            self.written_ms.store(ms, Ordering::Release);
        }
        *self.recorded.lock().expect("checkpoint record lock") = Some(c.clone());
        Ok(())
    }

    /// Replaces the manifest with the store's identity and `checkpoint`, atomically.
    fn write_manifest(&self, checkpoint: Option<&Checkpoint>) -> Result<(), StoreError> {
        let m = Recorded {
            data_dir_id: self.data_dir_id.clone(),
            checkpoint: checkpoint.cloned(),
        };
        let text = m.render();
        // Paired with `Store::manifest`, which reads it back: a record it refuses would make
        // the data directory unopenable, and the checkpoint in force lost with it. A parse
        // per record, next to an fsync and a rename, costs nothing that matters.
        assert!(
            Recorded::parse(&text).is_ok_and(|back| back == m),
            "the checkpoint manifest about to be written does not read back as written: {m:?}"
        );
        replace_file(&self.dir, CHECKPOINT_FILE, text.as_bytes()).map_err(|e| {
            StoreError::Manifest {
                path: self.dir.join(CHECKPOINT_FILE),
                why: e.to_string(),
            }
        })
    }

    fn remove_others(&self, keep: &str) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "rdb") && p.file_name() != Some(keep.as_ref()) {
                if let Err(err) = std::fs::remove_file(&p) {
                    tracing::warn!("cannot remove old checkpoint {}: {err}", p.display());
                }
            }
        }
    }

    /// Reads the checkpoint's RDB whole and checks its size, CRC and format against the
    /// record (blocking). Returns its format version.
    pub fn verify(&self, c: &Checkpoint) -> Result<u16, StoreError> {
        let path = self.path_of(c);
        let corrupt = |why: String| StoreError::Corrupt {
            path: path.clone(),
            why,
        };
        let sum = rdb_file::sum_file(&path).map_err(|e| corrupt(e.to_string()))?;
        if sum.bytes != c.size {
            return Err(corrupt(format!(
                "{} bytes, the manifest records {}",
                sum.bytes, c.size
            )));
        }
        if sum.crc64 != c.crc64 {
            return Err(corrupt(format!(
                "CRC-64 {:016x}, the manifest records {:016x}",
                sum.crc64, c.crc64
            )));
        }
        if c.rdb_version.is_some_and(|v| v != sum.version) {
            return Err(corrupt(format!(
                "RDB format {}, the manifest records {:?}",
                sum.version, c.rdb_version
            )));
        }
        Ok(sum.version)
    }
}

/// [`Store::written_ms`] for `c` in `dir`: blocking (a `stat` for a manifest without
/// `time_ms`), so only where the store is opened.
fn written_ms(dir: &Path, c: Option<&Checkpoint>) -> u64 {
    let Some(c) = c else { return 0 };
    let modified = || {
        let t = std::fs::metadata(dir.join(&c.file))
            .and_then(|m| m.modified())
            .ok()?;
        let since = t.duration_since(std::time::UNIX_EPOCH).ok()?;
        u64::try_from(since.as_millis()).ok()
    };
    c.time_ms.or_else(modified).unwrap_or(0)
}

#[cfg(test)]
#[path = "store_tests.rs"]
pub(crate) mod tests;
