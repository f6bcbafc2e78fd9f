//! The manifest (superblock): format version, ring geometry, writer epoch and checkpoint.
//!
//! It is small TOML followed by a CRC line, replaced atomically: write `MANIFEST.tmp`, fsync
//! it, rename over `MANIFEST`, fsync the directory. A reader sees either the old or the new
//! manifest, never a mix; the CRC catches bit rot.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::JournalError;
use super::format::REPL_ID_BYTES;

pub const MANIFEST_FILE: &str = "MANIFEST";
/// Version of the manifest and segment layout.
pub const LAYOUT_VERSION: u32 = 1;

/// Where recovery starts: the first retained entry. Everything before it is released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Entries up to and including this LSN were released by the caller (0: none).
    pub released_through_lsn: u64,
    /// Logical log position of the first retained record.
    pub start_pos: u64,
    /// LSN expected at `start_pos`.
    pub start_lsn: u64,
    /// Replication id of the entry before `start_lsn` (hex of the 40 raw bytes).
    pub prev_repl_id_hex: String,
    /// Replication offset at the end of the entry before `start_lsn`.
    pub prev_repl_offset: u64,
}

impl Checkpoint {
    pub fn initial() -> Checkpoint {
        Checkpoint {
            released_through_lsn: 0,
            start_pos: 0,
            start_lsn: 1,
            prev_repl_id_hex: hex_encode(&[0u8; REPL_ID_BYTES]),
            prev_repl_offset: 0,
        }
    }

    pub fn prev_repl_id(&self) -> Result<[u8; REPL_ID_BYTES], JournalError> {
        hex_decode_replid(&self.prev_repl_id_hex).ok_or_else(|| {
            JournalError::Manifest(format!("bad prev_repl_id_hex {:?}", self.prev_repl_id_hex))
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub layout_version: u32,
    pub segment_size_bytes: u64,
    pub segments: u32,
    /// Incremented at every open for writing; records carry the epoch that wrote them.
    pub epoch: u32,
    pub checkpoint: Checkpoint,
}

impl Manifest {
    pub fn new(segment_size_bytes: u64, segments: u32) -> Manifest {
        Manifest {
            layout_version: LAYOUT_VERSION,
            segment_size_bytes,
            segments,
            epoch: 0,
            checkpoint: Checkpoint::initial(),
        }
    }

    fn render(&self) -> String {
        seal(&toml::to_string(self).expect("manifest serializes"))
    }

    fn parse(text: &str) -> Result<Manifest, JournalError> {
        let body = unseal(text).map_err(JournalError::Manifest)?;
        let m: Manifest =
            toml::from_str(body).map_err(|e| JournalError::Manifest(e.to_string()))?;
        if m.layout_version != LAYOUT_VERSION {
            return Err(JournalError::Manifest(format!(
                "layout_version {} is not supported (this build reads {LAYOUT_VERSION})",
                m.layout_version
            )));
        }
        Ok(m)
    }

    /// Loads `dir/MANIFEST`; Ok(None) when it does not exist.
    pub fn load(dir: &Path) -> Result<Option<Manifest>, JournalError> {
        let path = dir.join(MANIFEST_FILE);
        match fs::read_to_string(&path) {
            Ok(text) => Manifest::parse(&text).map(Some).map_err(|e| match e {
                JournalError::Manifest(why) => {
                    JournalError::Manifest(format!("{}: {why}", path.display()))
                }
                e => e,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(JournalError::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Atomically replaces `dir/MANIFEST`.
    pub fn store(&self, dir: &Path) -> Result<(), JournalError> {
        replace_file(dir, MANIFEST_FILE, self.render().as_bytes())
    }
}

/// Appends the CRC line that [`unseal`] checks.
pub fn seal(body: &str) -> String {
    format!("{body}# crc64 {:016x}\n", crc64(body.as_bytes()))
}

/// The body of a [`seal`]ed text, or why its CRC line does not match.
pub fn unseal(text: &str) -> Result<&str, String> {
    let idx = text.rfind("# crc64 ").ok_or("missing crc64 line")?;
    let (body, crc_line) = text.split_at(idx);
    let stored = u64::from_str_radix(crc_line.trim_start_matches("# crc64 ").trim(), 16)
        .map_err(|e| format!("bad crc64 line: {e}"))?;
    let actual = crc64(body.as_bytes());
    if stored != actual {
        return Err(format!(
            "checksum mismatch (stored {stored:016x}, computed {actual:016x})"
        ));
    }
    Ok(body)
}

/// Atomically replaces `dir/name`: write `name.tmp`, fsync it, rename it over `name`, fsync
/// the directory. A reader sees the old or the new contents, never a mix.
pub fn replace_file(dir: &Path, name: &str, contents: &[u8]) -> Result<(), JournalError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let ctx = |what: &str| format!("{what} {}", tmp.display());
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| JournalError::io(ctx("creating"), e))?;
        crate::fault::manifest_write()
            .and_then(|()| f.write_all(contents))
            .map_err(|e| JournalError::io(ctx("writing"), e))?;
        f.sync_all()
            .map_err(|e| JournalError::io(ctx("fsync of"), e))
    })();
    if let Err(e) = written {
        // The old file stays in force; leave no half-written copy taking space.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, dir.join(name)).map_err(|e| JournalError::io(ctx("renaming"), e))?;
    fsync_dir(dir)
}

/// fsync a directory so that renames and creations in it are durable.
pub fn fsync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| JournalError::io(format!("fsync of directory {}", dir.display()), e))
}

fn crc64(bytes: &[u8]) -> u64 {
    let mut d = crc64fast::Digest::new();
    d.write(bytes);
    d.sum64()
}

pub fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn hex_decode_replid(s: &str) -> Option<[u8; REPL_ID_BYTES]> {
    if s.len() != REPL_ID_BYTES * 2 {
        return None;
    }
    let mut out = [0u8; REPL_ID_BYTES];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_load_roundtrip_and_crc() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), None);
        let mut m = Manifest::new(65536, 3);
        m.epoch = 5;
        m.checkpoint.start_lsn = 77;
        m.store(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), Some(m.clone()));
        assert!(!dir.path().join("MANIFEST.tmp").exists());
        let path = dir.path().join(MANIFEST_FILE);
        let text = fs::read_to_string(&path)
            .unwrap()
            .replace("epoch = 5", "epoch = 6");
        fs::write(&path, text).unwrap();
        let err = Manifest::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
    }

    #[test]
    fn replid_hex_roundtrip() {
        let id = *b"0123456789abcdef0123456789abcdef01234567";
        assert_eq!(hex_decode_replid(&hex_encode(&id)), Some(id));
        assert_eq!(hex_decode_replid("zz"), None);
    }
}
