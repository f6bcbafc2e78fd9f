//! The archive's manifest (`MANIFEST`, TOML sealed with a CRC line like walrus's other
//! manifests): who writes the archive, on which timeline, and its restore points.
//!
//! It is the only object ever replaced, and only by a conditional write against the version
//! read: two walruses can never both think they write the archive. A restore point is a
//! checkpoint's RDB in the archive; the journal objects after it on its timeline
//! ([`super::object`]) carry it forward, as far as they go without a gap.

use super::ArchiveError;
use crate::journal::manifest::{seal, unseal};
use serde::{Deserialize, Serialize};

pub const FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    pub writer: Writer,
    /// The timeline the writer appends to.
    pub timeline: u64,
    #[serde(default)]
    pub restore_points: Vec<RestorePoint>,
}

/// The walrus that writes the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Writer {
    /// Its data directory's identity.
    pub identity: String,
    /// For people: the host and the data directory.
    pub name: String,
    /// When it took the archive (seconds since the epoch).
    pub since: i64,
}

/// A checkpoint in the archive, and what a restore from it needs to know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestorePoint {
    pub timeline: u64,
    /// The RDB's object.
    pub key: String,
    pub replid: String,
    pub offset: u64,
    pub size: u64,
    /// Valkey's CRC-64 of the RDB, in hex.
    pub crc64: String,
    /// When it was uploaded (seconds since the epoch).
    pub created: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdb_version: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_server: Option<String>,
    /// When walrus recorded the checkpoint (ms since the Unix epoch; none from a walrus
    /// before times): a point-in-time restore to an earlier time cannot start from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ms: Option<u64>,
    /// The journal offset its timeline's objects must reach before a restore from it holds
    /// everything its writer held when it recorded it. A timeline starts from a checkpoint
    /// with the local journal already past it (a walrus restored from the archive taking it
    /// over, or an archive added to a walrus with data): until that journal is uploaded
    /// again, the restore point is behind the one it follows, which stays the one to
    /// restore from. None: complete once recorded (every later restore point).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_at: Option<u64>,
}

impl RestorePoint {
    /// When it was recorded, as a UTC date (`2026-12-03T21:13:10Z`).
    pub fn recorded(&self) -> String {
        chrono::DateTime::from_timestamp(self.created, 0).map_or(self.created.to_string(), |t| {
            t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
        })
    }

    /// Whether this restore point was uploaded from local checkpoint `lc` (same history,
    /// offset and RDB checksum).
    pub fn of_checkpoint(&self, lc: &crate::checkpoint::manifest::Checkpoint) -> bool {
        self.replid == lc.replid && self.offset == lc.offset && self.crc64().ok() == Some(lc.crc64)
    }

    pub fn crc64(&self) -> Result<u64, ArchiveError> {
        u64::from_str_radix(&self.crc64, 16)
            .map_err(|e| ArchiveError::Malformed(format!("crc64 {:?}: {e}", self.crc64)))
    }
}

impl Manifest {
    pub fn render(&self) -> String {
        seal(&toml::to_string(self).expect("the archive manifest serializes"))
    }

    pub fn parse(text: &str) -> Result<Manifest, ArchiveError> {
        Manifest::read(text).map_err(ArchiveError::Malformed)
    }

    /// [`Manifest::parse`], saying what in `text` is wrong.
    fn read(text: &str) -> Result<Manifest, String> {
        let body = unseal(text).map_err(|e| e.to_string())?;
        let m: Manifest = toml::from_str(body).map_err(|e| e.to_string())?;
        if m.format != FORMAT {
            return Err(format!(
                "format {} (this walrus reads format {FORMAT}: a newer walrus wrote it)",
                m.format
            ));
        }
        if m.restore_points
            .iter()
            .any(|r| r.timeline > m.timeline || r.crc64().is_err())
        {
            return Err(
                "a restore point is on a later timeline than the writer's, or has no CRC".into(),
            );
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_and_damage_is_refused() {
        let m = Manifest {
            format: FORMAT,
            writer: Writer {
                identity: "abc".into(),
                name: "host /data".into(),
                since: 5,
            },
            timeline: 2,
            restore_points: vec![
                RestorePoint {
                    timeline: 1,
                    key: "checkpoints/00000001/x.rdb".into(),
                    replid: "a".repeat(40),
                    offset: 10,
                    size: 100,
                    crc64: "00000000000000ff".into(),
                    created: 6,
                    rdb_version: Some(11),
                    written_by: Some("Valkey 9.1.2".into()),
                    newest_server: None,
                    time_ms: None,
                    complete_at: Some(90),
                },
                RestorePoint {
                    timeline: 2,
                    key: "checkpoints/00000002/y.rdb".into(),
                    offset: 5,
                    created: 7,
                    ..Default::default()
                },
            ],
        };
        let text = m.render();
        assert_eq!(Manifest::parse(&text).unwrap(), m);
        assert!(Manifest::parse(&text.replace("since = 5", "since = 6")).is_err());
        let newer = Manifest {
            format: 2,
            ..m.clone()
        };
        assert!(Manifest::parse(&newer.render())
            .unwrap_err()
            .to_string()
            .contains("newer walrus"));
    }

    impl Default for RestorePoint {
        fn default() -> Self {
            RestorePoint {
                timeline: 1,
                key: String::new(),
                replid: "b".repeat(40),
                offset: 0,
                size: 0,
                crc64: "0".into(),
                created: 0,
                rdb_version: None,
                written_by: None,
                newest_server: None,
                time_ms: None,
                complete_at: None,
            }
        }
    }
}
