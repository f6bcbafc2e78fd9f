//! The checkpoint manifest (`CHECKPOINT`, TOML with a CRC line, replaced atomically like
//! the journal's): what it records, and its text.
//!
//! It is the only authority on which RDB a restore starts from: a file is trusted only while
//! the manifest names it, and deleted only after a newer one is recorded ([`super::store`]).
//! It records the RDB's replication id and offset (the RDB holds every write of that history
//! up to that offset), its size and Valkey's CRC-64 (verified before every use), and
//! `from_lsn`: the first journal entry a restore from it may need. Every entry before
//! `from_lsn` is covered by the RDB or belongs to a history the RDB replaced, so the journal
//! may release them. It also records the RDB's format version, the server that wrote it, and
//! the newest server whose stream the journal has taken since: a restore loads them only into
//! a server that reads that format and runs every command those servers may have journaled.
//! (Manifests written before walrus recorded these have none of them; the format is then
//! read from the RDB's header, which a verification reads anyway.)
//!
//! The manifest is written when the data directory is made, before there is any checkpoint,
//! with the data directory's identity (the journal's: [`DataDirId`]); every record keeps it.
//! So a data directory always has one, and one that is missing is lost, never "no checkpoint
//! yet"; and one copied in from another data directory is told apart
//! (`crate::datadir::parts` decides what a data directory holds before any of it is
//! opened).

use super::CheckpointError;
use crate::journal::manifest::{seal, unseal, DataDirId};
use crate::upstream::server::ServerVersion;
use crate::valkey::handshake::REPLID_LEN;
use serde::{Deserialize, Serialize};

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
    pub fn parse(text: &str) -> Result<Checkpoint, CheckpointError> {
        Recorded::parse(text)?
            .checkpoint
            .ok_or_else(|| CheckpointError::Malformed("it records no checkpoint".to_string()))
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
    pub fn parse(text: &str) -> Result<Recorded, CheckpointError> {
        Recorded::read(text).map_err(CheckpointError::Malformed)
    }

    /// [`Recorded::parse`], saying what in `text` is wrong.
    fn read(text: &str) -> Result<Recorded, String> {
        let body = unseal(text).map_err(|e| e.to_string())?;
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
