//! The checkpoint store: RDB files under `<data>/checkpoints/` and the small manifest that
//! names the current one, and the data directory's identity.
//!
//! The manifest (`CHECKPOINT`, TOML with a CRC line, replaced atomically like the journal's)
//! is the only authority on which RDB a restore starts from: a file is trusted only while
//! the manifest names it, and deleted only after a newer one is recorded. It records the
//! RDB's replication id and offset (the RDB holds every write of that history up to that
//! offset), its size and Valkey's CRC-64 (verified before every use), and `from_lsn`: the
//! first journal entry a restore from it may need. Every entry before `from_lsn` is covered
//! by the RDB or belongs to a history the RDB replaced, so the journal may release them.
//! It also records the RDB's format version, the server that wrote it, and the newest server
//! whose stream the journal has taken since: a restore loads them only into a server that
//! reads that format and runs every command those servers may have journaled. (Manifests
//! written before walrus recorded these have none of them; the format is then read from the
//! RDB's header, which a verification reads anyway.)
//!
//! The manifest is written when the data directory is made, before there is any checkpoint,
//! with the data directory's identity (the journal's: [`DataDirId`]); every record keeps it.
//! So a data directory always has one, and one that is missing is lost, never "no checkpoint
//! yet"; and one copied in from another data directory is told apart
//! (`crate::datadir::parts` decides what a data directory holds before any of it is
//! opened).

use super::rdb_file::{self, StoredRdb};
use crate::journal::manifest::{create_dir_durably, replace_file, seal, unseal, DataDirId};
use crate::upstream::server::ServerVersion;
use crate::valkey::handshake::REPLID_LEN;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The manifest's file name in the checkpoint directory.
pub const CHECKPOINT_FILE: &str = "CHECKPOINT";

/// The current checkpoint, as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// File name inside the checkpoint directory.
    pub file: String,
    pub replid: String,
    pub offset: u64,
    pub size: u64,
    /// Valkey's CRC-64/Jones of the RDB (its trailer; computed again on arrival), in hex
    /// (TOML integers stop at 2^63).
    #[serde(with = "hex_u64")]
    pub crc64: u64,
    /// First journal entry a restore from this checkpoint may need.
    pub from_lsn: u64,
    /// The RDB's format version (`REDIS0011`: 11, `VALKEY080`: 80).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdb_version: Option<u16>,
    /// The server that wrote it, `Valkey 9.1.2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_by: Option<String>,
    /// A newer server than `written_by` whose stream the journal took after this checkpoint
    /// (Valkey was upgraded under walrus): its commands may be in the journal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_server: Option<String>,
    /// When walrus recorded it, in milliseconds since the Unix epoch: the dataset it holds is
    /// no later (a point-in-time restore to an earlier time cannot start from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ms: Option<u64>,
}

/// A checkpoint's figures: its RDB's size, the offset it covers, its first journal entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub size: u64,
    pub offset: u64,
    pub from_lsn: u64,
}

impl Checkpoint {
    /// The servers whose writes this checkpoint and the journal after it hold.
    pub fn servers(&self) -> impl Iterator<Item = ServerVersion> + '_ {
        [&self.written_by, &self.newest_server]
            .into_iter()
            .flatten()
            .filter_map(|s| s.parse().ok())
    }

    /// A manifest's text holding this record alone (no identity), sealed with its CRC line.
    pub fn render(&self) -> String {
        Recorded {
            data_dir_id: None,
            checkpoint: Some(self.clone()),
        }
        .render()
    }

    /// The record of a manifest's text ([`Recorded::parse`]); an error if it records none.
    pub fn parse(text: &str) -> Result<Checkpoint, String> {
        Recorded::parse(text)?
            .checkpoint
            .ok_or_else(|| "it records no checkpoint".to_string())
    }
}

/// What the manifest holds: the data directory's identity (absent in manifests written
/// before walrus recorded one), and the current checkpoint, once there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recorded {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir_id: Option<DataDirId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,
}

impl Recorded {
    /// The manifest's text, sealed with its CRC line.
    pub fn render(&self) -> String {
        seal(&toml::to_string(self).expect("checkpoint manifest serializes"))
    }

    /// Reads a manifest's text (as [`render`](Self::render) wrote it): its CRC line, then an
    /// identity, a record, or both. A record must name an RDB in the checkpoint directory (a
    /// name `path_for` could have made: not `..`, not the manifest, not a `.tmp` that `open`
    /// deletes) and a replication id that can be Valkey's.
    pub fn parse(text: &str) -> Result<Recorded, String> {
        let body = unseal(text)?;
        let m: Recorded = toml::from_str(body).map_err(|e| e.to_string())?;
        match &m.checkpoint {
            None if m.data_dir_id.is_none() => {
                return Err("it holds neither an identity nor a checkpoint".into())
            }
            Some(c) => {
                let names_an_rdb = c.file.ends_with(".rdb") && !c.file.contains('/');
                if c.replid.len() != REPLID_LEN || !names_an_rdb || c.from_lsn == 0 {
                    return Err(format!("invalid record {c:?}"));
                }
            }
            None => {}
        }
        Ok(m)
    }
}

mod hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = String::deserialize(d)?;
        u64::from_str_radix(&text, 16).map_err(serde::de::Error::custom)
    }
}

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
        Ok(Store {
            dir: dir.to_path_buf(),
            data_dir_id: found.as_ref().and_then(|m| m.data_dir_id.clone()),
            recorded: Arc::new(Mutex::new(found.and_then(|m| m.checkpoint))),
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
            Ok(text) => Recorded::parse(&text).map(Some).map_err(bad),
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
    /// write between them share an offset). Only the manifest switches from one to the next.
    /// The name is reserved by creating its temporary file (`.rdb.tmp`, which
    /// [`rdb_file::receive`] writes and renames), since the link and a checkpoint may both ask.
    pub fn path_for(&self, replid: &str, offset: u64) -> Result<PathBuf, StoreError> {
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
                Ok(_) if !p.exists() => return Ok(p),
                Ok(_) => std::fs::remove_file(&tmp).map_err(io)?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(e)),
            }
        }
        unreachable!("some name is free")
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

    /// When `c`'s RDB was written (its file's modification time), if it can be read.
    pub fn written_at(&self, c: &Checkpoint) -> Option<std::time::SystemTime> {
        std::fs::metadata(self.path_of(c))
            .and_then(|m| m.modified())
            .ok()
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
        *self.recorded.lock().expect("checkpoint record lock") = Some(c.clone());
        Ok(())
    }

    /// Replaces the manifest with the store's identity and `checkpoint`, atomically.
    fn write_manifest(&self, checkpoint: Option<&Checkpoint>) -> Result<(), StoreError> {
        let m = Recorded {
            data_dir_id: self.data_dir_id.clone(),
            checkpoint: checkpoint.cloned(),
        };
        replace_file(&self.dir, CHECKPOINT_FILE, m.render().as_bytes()).map_err(|e| {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The identity the tests' data directories have.
    pub(crate) fn id() -> DataDirId {
        DataDirId::try_from("0123456789abcdef0123456789abcdef".to_string()).unwrap()
    }

    /// The store in `dir`, of the tests' data directory.
    pub(crate) fn open(dir: &Path) -> Store {
        Store::open(dir, &id()).unwrap()
    }

    pub(crate) fn rdb_bytes(body: &[u8]) -> Vec<u8> {
        let mut d = crate::valkey::rdb::RdbDigest::default();
        d.update(body);
        d.update(&[0; 8]);
        let crc = d.finish().unwrap().crc64;
        let mut v = body.to_vec();
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    /// An RDB of `body` stored as the checkpointer stores one (also for the checkpointer's
    /// own tests).
    pub(crate) fn stored(store: &Store, replid: &str, offset: u64, body: &[u8]) -> StoredRdb {
        let path = store.path_for(replid, offset).unwrap();
        let bytes = rdb_bytes(body);
        // As `rdb_file::receive` does: the reserved temporary file becomes the RDB.
        let tmp = path.with_extension("rdb.tmp");
        std::fs::write(&tmp, &bytes).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let sum = rdb_file::sum_file(&path).unwrap();
        StoredRdb {
            path,
            bytes: sum.bytes,
            crc64: sum.crc64,
            version: sum.version,
            eof_mark: false,
        }
    }

    #[test]
    fn record_replaces_verify_detects_damage_open_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path());
        assert_eq!(store.current().unwrap(), None);
        let a = "a".repeat(40);
        let first = stored(&store, &a, 10, b"REDIS0011first");
        let before = crate::units::time::now_ms();
        let c1 = store.record(&first, "Valkey 9.1.2", &a, 10, 1).unwrap();
        let after = crate::units::time::now_ms();
        assert!(c1.time_ms.is_some_and(|t| (before..=after).contains(&t)));
        assert_eq!(store.current().unwrap(), Some(c1.clone()));
        assert_eq!(store.verify(&c1).unwrap(), 11);
        assert_eq!(c1.rdb_version, Some(11));
        let second = stored(&store, &a, 99, b"REDIS0011second");
        let c2 = store.record(&second, "Valkey 9.1.2", &a, 99, 7).unwrap();
        assert!(
            !first.path.exists(),
            "the older RDB goes once a newer one is recorded"
        );
        assert_eq!(store.current().unwrap().unwrap().from_lsn, 7);
        // A flipped bit is caught, naming the file.
        let mut bytes = std::fs::read(&second.path).unwrap();
        bytes[3] ^= 0x10;
        std::fs::write(&second.path, &bytes).unwrap();
        let err = store.verify(&c2).unwrap_err().to_string();
        assert!(err.contains(&c2.file), "{err}");
        // Leftovers of a crash: a temp file and an unrecorded RDB.
        std::fs::write(tmp.path().join("x.rdb.tmp"), b"half").unwrap();
        let orphan = stored(&store, &a, 200, b"REDIS0011orphan");
        let reopened = open(tmp.path());
        assert!(!tmp.path().join("x.rdb.tmp").exists() && !orphan.path.exists());
        assert!(second.path.exists());
        assert_eq!(reopened.current().unwrap(), Some(c2));
        // A damaged manifest is an error, never "no checkpoint".
        let m = tmp.path().join(CHECKPOINT_FILE);
        let text = std::fs::read_to_string(&m)
            .unwrap()
            .replace("offset = 99", "offset = 98");
        std::fs::write(&m, text).unwrap();
        assert!(matches!(
            reopened.current(),
            Err(StoreError::Manifest { .. })
        ));
    }

    /// The manifest is written with the data directory's identity before there is any
    /// checkpoint, and keeps it in every record; an RDB is removed only on a manifest's word.
    #[test]
    fn the_manifest_carries_the_identity_and_rdbs_go_only_on_its_word() {
        let tmp = tempfile::tempdir().unwrap();
        let manifest = || Store::manifest(tmp.path()).unwrap();
        let store = open(tmp.path());
        let empty = Recorded {
            data_dir_id: Some(id()),
            checkpoint: None,
        };
        assert_eq!(manifest(), Some(empty.clone()));
        assert_eq!(store.current().unwrap(), None);
        // An RDB stored but not recorded (a first checkpoint interrupted): a leftover.
        let a = "a".repeat(40);
        let left = stored(&store, &a, 10, b"REDIS0011left");
        open(tmp.path());
        assert!(!left.path.exists());
        let rdb = stored(&store, &a, 10, b"REDIS0011body");
        let c = store.record(&rdb, "Valkey 9.1.2", &a, 10, 1).unwrap();
        assert_eq!(manifest().unwrap().data_dir_id, Some(id()));
        // A manifest written before identities takes this one; one of another data
        // directory, recording a checkpoint, is refused, and nothing is removed.
        std::fs::write(tmp.path().join(CHECKPOINT_FILE), c.render()).unwrap();
        assert_eq!(manifest().unwrap().data_dir_id, None);
        assert_eq!(open(tmp.path()).current().unwrap(), Some(c.clone()));
        assert_eq!(manifest().unwrap().data_dir_id, Some(id()));
        let other = DataDirId::random().unwrap();
        let e = Store::open(tmp.path(), &other).unwrap_err().to_string();
        assert!(e.contains(&format!("of data directory {}", id())), "{e}");
        // A manifest whose RDB is gone: the others stay.
        std::fs::rename(&rdb.path, tmp.path().join("moved.rdb")).unwrap();
        open(tmp.path());
        assert!(tmp.path().join("moved.rdb").exists());
        std::fs::rename(tmp.path().join("moved.rdb"), &rdb.path).unwrap();
        // No manifest: the RDB stays, and the store does not open.
        std::fs::remove_file(tmp.path().join(CHECKPOINT_FILE)).unwrap();
        let e = Store::open(tmp.path(), &id()).unwrap_err().to_string();
        assert!(e.contains("not removed on a guess"), "{e}");
        assert!(rdb.path.exists());
        // A manifest holds an identity, a checkpoint, or both.
        assert_eq!(Recorded::parse(&empty.render()), Ok(empty));
        let nothing = Recorded {
            data_dir_id: None,
            checkpoint: None,
        };
        assert!(Recorded::parse(&nothing.render()).is_err());
    }

    /// Found by fuzzing (fuzz/regressions/checkpoint_manifest): a record naming a file that
    /// is no RDB of the store (the parent directory, a `.tmp` that `open` deletes) was read.
    #[test]
    fn a_record_names_an_rdb_of_the_store() {
        let c = Checkpoint {
            file: "checkpoint-a-1.rdb".into(),
            replid: "a".repeat(40),
            offset: 1,
            size: 17,
            crc64: 7,
            from_lsn: 1,
            rdb_version: Some(11),
            written_by: None,
            newest_server: None,
            time_ms: Some(1_796_332_725_250),
        };
        assert_eq!(Checkpoint::parse(&c.render()), Ok(c.clone()));
        for file in ["..", "", "CHECKPOINT", "x.rdb.tmp", "../x.rdb", "sub/x.rdb"] {
            let bad = Checkpoint {
                file: file.into(),
                ..c.clone()
            };
            assert!(Checkpoint::parse(&bad.render()).is_err(), "{file:?}");
        }
    }

    #[test]
    fn manifests_without_a_format_are_read_and_verified_by_the_rdbs_header() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path());
        let a = "a".repeat(40);
        let rdb = stored(&store, &a, 10, b"VALKEY080body");
        let c = store.record(&rdb, "Valkey 9.1.2", &a, 10, 1).unwrap();
        // As walrus wrote manifests before it recorded formats.
        let old = Checkpoint {
            rdb_version: None,
            written_by: None,
            newest_server: None,
            ..c.clone()
        };
        let body = toml::to_string(&Recorded {
            data_dir_id: None,
            checkpoint: Some(old),
        })
        .unwrap();
        assert!(!body.contains("rdb_version"), "{body}");
        replace_file(tmp.path(), CHECKPOINT_FILE, seal(&body).as_bytes()).unwrap();
        let read = store.current().unwrap().unwrap();
        assert_eq!(read.rdb_version, None);
        assert_eq!(store.verify(&read).unwrap(), 80);
        // A recorded format the file does not have is damage.
        let wrong = Checkpoint {
            rdb_version: Some(11),
            ..c
        };
        let err = store.verify(&wrong).unwrap_err().to_string();
        assert!(
            err.contains("RDB format 80, the manifest records Some(11)"),
            "{err}"
        );
    }

    #[test]
    fn a_new_rdb_never_replaces_the_recorded_one_and_offsets_never_go_back() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path());
        let a = "a".repeat(40);
        let first = stored(&store, &a, 10, b"REDIS0011first");
        let c1 = store.record(&first, "Valkey 9.1.2", &a, 10, 1).unwrap();
        // A second checkpoint at the same offset gets a name of its own; until the
        // manifest names it, the first stays whole.
        let second = stored(&store, &a, 10, b"REDIS0011second");
        assert_ne!(second.path, first.path);
        assert_eq!(store.verify(&c1).unwrap(), 11);
        let c2 = store.record(&second, "Valkey 9.1.2", &a, 10, 2).unwrap();
        assert!(!first.path.exists() && second.path.exists());
        // An older one of the same history is refused, and the recorded one stays.
        let older = stored(&store, &a, 5, b"REDIS0011older");
        let err = store
            .record_or_discard(&older, "Valkey 9.1.2", &a, 5, 3)
            .unwrap_err();
        assert!(err.to_string().contains("the recorded"), "{err}");
        assert!(!older.path.exists(), "a refused RDB keeps no space");
        // Two names asked for at once (the link and a checkpoint) differ.
        let (x, y) = (
            store.path_for(&a, 10).unwrap(),
            store.path_for(&a, 10).unwrap(),
        );
        assert_ne!(x, y);
        assert_eq!(store.current().unwrap(), Some(c2));
        // Another history's may start anywhere.
        let b = "b".repeat(40);
        let new_history = stored(&store, &b, 0, b"REDIS0011new");
        store
            .record(&new_history, "Valkey 9.1.2", &b, 0, 4)
            .unwrap();
    }

    /// Found by the power-loss generator (docs/power-loss.md): the link's full resync and a
    /// checkpoint stored their RDBs at once; the checkpoint's record removed every other
    /// RDB, and the link's record then named its removed file. The next start refused:
    /// "checkpoint ... fails verification: No such file or directory".
    #[test]
    fn an_rdb_removed_by_a_concurrent_record_is_never_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path());
        let a = "a".repeat(40);
        let links = stored(&store, &a, 20, b"REDIS0011link");
        let checkpoints = stored(&store, &a, 10, b"REDIS0011checkpoint");
        let c = store
            .record(&checkpoints, "Valkey 9.1.2", &a, 10, 1)
            .unwrap();
        assert!(!links.path.exists(), "a record removes every other RDB");
        let err = store
            .record_or_discard(&links, "Valkey 9.1.2", &a, 20, 2)
            .unwrap_err();
        assert!(err.to_string().contains("removed it"), "{err}");
        assert_eq!(store.current().unwrap(), Some(c.clone()));
        assert_eq!(store.verify(&c).unwrap(), 11);
    }

    #[test]
    fn the_newest_server_that_fed_the_journal_is_noted_once() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path());
        let v = |s: &str| s.parse::<ServerVersion>().unwrap();
        // No checkpoint yet: nothing to note.
        store.note_server(&v("Valkey 9.1.2")).unwrap();
        assert_eq!(store.current().unwrap(), None);
        let a = "a".repeat(40);
        let rdb = stored(&store, &a, 10, b"REDIS0011body");
        store.record(&rdb, "Valkey 8.1.8", &a, 10, 1).unwrap();
        store.note_server(&v("Valkey 8.1.2")).unwrap();
        assert_eq!(store.current().unwrap().unwrap().newest_server, None);
        store.note_server(&v("Valkey 9.1.2")).unwrap();
        store.note_server(&v("Valkey 9.0.0")).unwrap();
        let c = store.current().unwrap().unwrap();
        assert_eq!(c.newest_server.as_deref(), Some("Valkey 9.1.2"));
        assert_eq!(store.recorded(), Some(c.clone()));
        // A new checkpoint starts over from its own writer.
        let rdb = stored(&store, &a, 20, b"VALKEY080body");
        let c = store.record(&rdb, "Valkey 9.1.2", &a, 20, 2).unwrap();
        assert_eq!(c.newest_server, None);
    }
}
