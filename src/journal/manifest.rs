//! The manifest (superblock): format version, ring geometry, writer epoch, the records'
//! key, the data directory's identity, and the checkpoint.
//!
//! It is small TOML followed by a CRC line, replaced atomically without allocating (see
//! [`replace_file`]: the new version goes into `MANIFEST.prev` in place, then the two names
//! are exchanged). A reader sees either the old or the new manifest, never a mix; the CRC
//! catches bit rot.

use std::fs::{self, File, OpenOptions};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::JournalError;
use super::format::{RecordKey, REPL_ID_BYTES};

pub const MANIFEST_FILE: &str = "MANIFEST";
/// Version of the manifest and segment layout this build writes: 2 added the records' key
/// (format 2 records), 3 each entry's time (format 3 records).
pub const LAYOUT_VERSION: u32 = 3;
/// Journals made before entries carried their time: read, and upgraded at their next open
/// for writing.
pub const UNTIMED_LAYOUT_VERSION: u32 = 2;
/// Journals made before the key: read, and upgraded at their next open for writing.
pub const UNKEYED_LAYOUT_VERSION: u32 = 1;

/// A data directory's identity: 128 random bits drawn when its journal is made, written into
/// the journal's manifest and the checkpoints' (`crate::checkpoint::store`), so that a
/// manifest copied in from another data directory is told from the directory's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DataDirId(String);

impl DataDirId {
    /// A fresh identity from the operating system's random source.
    pub fn random() -> std::io::Result<DataDirId> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
        Ok(DataDirId(hex_encode(&bytes)))
    }
}

impl TryFrom<String> for DataDirId {
    type Error = String;

    fn try_from(s: String) -> Result<DataDirId, String> {
        if s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(DataDirId(s))
        } else {
            Err(format!("data_dir_id {s:?} is not 32 lowercase hex digits"))
        }
    }
}

impl From<DataDirId> for String {
    fn from(id: DataDirId) -> String {
        id.0
    }
}

impl std::fmt::Display for DataDirId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

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
    /// Epoch of the entry before `start_lsn`: recovery accepts nothing older after it.
    #[serde(default)]
    pub prev_epoch: u32,
}

impl Checkpoint {
    pub fn initial() -> Checkpoint {
        Checkpoint {
            released_through_lsn: 0,
            start_pos: 0,
            start_lsn: 1,
            prev_repl_id_hex: hex_encode(&[0u8; REPL_ID_BYTES]),
            prev_repl_offset: 0,
            prev_epoch: 0,
        }
    }

    /// The last entry this says was written: released, or before the log's start (0: none).
    pub fn written_through(&self) -> u64 {
        self.released_through_lsn
            .max(self.start_lsn.saturating_sub(1))
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
    /// The secret mixed into every record's checksum (16 hex digits); absent in layout 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_key_hex: Option<String>,
    /// The first epoch that wrote keyed (format 2) records: records of older epochs are
    /// format 1, from a journal upgraded from layout 1 (0 for a journal made keyed). Bound
    /// to epochs, not positions: a later cut (a repair) below the upgrade point must not
    /// make the next run's keyed records look misplaced, and epochs never decrease along
    /// the log.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub keyed_from_epoch: u32,
    /// Where the run of `epoch` began writing: the end of the log its open recovered.
    /// Records of older epochs beyond it were left behind by a decision of that open (a
    /// torn tail, or a repair's cut), so they never vouch for anything. Absent before the
    /// first open that records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at_pos: Option<u64>,
    /// Format 1 records lie only below this log position: the end the upgrading open found,
    /// lowered by every later open that found a shorter log (a repair's cut). Bound to
    /// positions as well as epochs because a client's value written after the upgrade may
    /// hold a format 1 record of an old epoch: it needs no key to be well formed. Absent in
    /// a journal made keyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unkeyed_below_pos: Option<u64>,
    /// The data directory's identity ([`DataDirId`]): drawn at init, or at the first open
    /// for writing of a journal made before identities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir_id: Option<DataDirId>,
    /// A compact ring's log end (a backup's journal: [`super::compact`]): its segment files
    /// are cut after the block that holds it, and read as zeros past their end. A scan must
    /// find the log ending exactly here; the first open for writing fills the ring out
    /// again. Builds that predate it refuse the field: they would read the cut files as a
    /// damaged ring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_end_pos: Option<u64>,
    pub checkpoint: Checkpoint,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Manifest {
    pub fn new(segment_size_bytes: u64, segments: u32, key: RecordKey) -> Manifest {
        Manifest {
            layout_version: LAYOUT_VERSION,
            segment_size_bytes,
            segments,
            epoch: 0,
            record_key_hex: Some(format!("{:016x}", key.0)),
            keyed_from_epoch: 0,
            resumed_at_pos: None,
            unkeyed_below_pos: None,
            data_dir_id: None,
            compact_end_pos: None,
            checkpoint: Checkpoint::initial(),
        }
    }

    /// The records' key, and where format 1 records may be: of epochs below the first, at
    /// positions below the second. A layout 1 journal has no key: all its records are
    /// format 1.
    pub fn record_keys(&self) -> (RecordKey, u32, u64) {
        match &self.record_key_hex {
            Some(hex) => (
                RecordKey(u64::from_str_radix(hex, 16).expect("checked by parse")),
                self.keyed_from_epoch,
                self.unkeyed_below_pos.unwrap_or(0),
            ),
            None => (RecordKey(0), u32::MAX, u64::MAX),
        }
    }

    /// Records an open for writing that found the log ending at `end_pos`: its epoch (already
    /// bumped) writes from there, and, in a journal upgraded from layout 1, format 1 records
    /// now lie only below it.
    pub fn resume_at(&mut self, end_pos: u64) {
        self.resumed_at_pos = Some(end_pos);
        if let Some(p) = &mut self.unkeyed_below_pos {
            *p = (*p).min(end_pos);
        }
    }

    /// Upgrades a manifest of an older layout at an open for writing, after its epoch bump
    /// and [`resume_at`](Self::resume_at): this run's records and every later one are of the
    /// current format. Older ones stay readable as they are: format 2 (keyed, untimed) by
    /// their version, which the key seals; format 1 (unkeyed) only below where this run
    /// resumes. `new_key` is called only for a layout 1 journal, which has no key.
    pub fn upgrade(
        &mut self,
        new_key: impl FnOnce() -> Result<RecordKey, JournalError>,
    ) -> Result<(), JournalError> {
        if self.layout_version == UNKEYED_LAYOUT_VERSION {
            self.record_key_hex = Some(format!("{:016x}", new_key()?.0));
            self.keyed_from_epoch = self.epoch;
            self.unkeyed_below_pos = Some(self.resumed_at_pos.expect("resume_at comes first"));
        }
        self.layout_version = LAYOUT_VERSION;
        Ok(())
    }

    /// The manifest's text, sealed with its CRC line.
    pub fn render(&self) -> String {
        seal(&toml::to_string(self).expect("manifest serializes"))
    }

    /// Reads a manifest's text (as [`render`](Self::render) wrote it), checking its CRC line,
    /// its layout version and its key.
    pub fn parse(text: &str) -> Result<Manifest, JournalError> {
        let body = unseal(text).map_err(|e| JournalError::Manifest(e.to_string()))?;
        let m: Manifest =
            toml::from_str(body).map_err(|e| JournalError::Manifest(e.to_string()))?;
        let keyed = match m.layout_version {
            LAYOUT_VERSION | UNTIMED_LAYOUT_VERSION => true,
            UNKEYED_LAYOUT_VERSION => false,
            v => {
                return Err(JournalError::Manifest(format!(
                    "layout_version {v} is not supported (this build reads {UNKEYED_LAYOUT_VERSION} to {LAYOUT_VERSION})"
                )))
            }
        };
        let key_ok = match m.record_key_hex.as_deref() {
            Some(h) => keyed && h.len() == 16 && u64::from_str_radix(h, 16).is_ok(),
            None => !keyed,
        };
        if !key_ok {
            return Err(JournalError::Manifest(format!(
                "layout_version {} needs {} record_key_hex",
                m.layout_version,
                if keyed { "a 16-hex-digit" } else { "no" }
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
pub(crate) fn unseal(text: &str) -> Result<&str, JournalError> {
    seal_checked(text).map_err(JournalError::Seal)
}

/// [`unseal`], saying what is wrong with the CRC line.
fn seal_checked(text: &str) -> Result<&str, String> {
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

/// Atomically replaces `dir/name`, allocating nothing on the way, so that a manifest can be
/// replaced on a full disk (the journal bumps its epoch at every open and moves its
/// checkpoint at every release; an ENOSPC there would stop releases and every start).
///
/// `name.prev` holds the previous version. The new contents overwrite it in place, padded
/// with newlines to its size (sealed text ignores them), and are synced; then the two names
/// are exchanged (renameat2 RENAME_EXCHANGE) and the directory synced. A crash before the
/// exchange leaves the old version in force, after it the new one. Blocks a file already
/// has, rewritten, and an exchange of names need no free space. Where there is no old
/// version yet, or the file system cannot exchange names, `name.prev` is renamed over
/// `name` instead (that needs space the next time, to make `name.prev` again).
pub fn replace_file(dir: &Path, name: &str, contents: &[u8]) -> Result<(), JournalError> {
    use std::os::unix::fs::FileExt;
    let target = dir.join(name);
    let spare = dir.join(format!("{name}.prev"));
    let ctx = |what: &str| format!("{what} {}", spare.display());
    let f = open_in_place(&spare).map_err(|e| JournalError::io(ctx("opening"), e))?;
    let size = f
        .metadata()
        .map_err(|e| JournalError::io(ctx("stat of"), e))?
        .len();
    let mut padded = contents.to_vec();
    let len = (contents.len() as u64).next_multiple_of(4096).max(size);
    padded.resize(len as usize, b'\n');
    crate::fault::io_point!("manifest::write")
        .and_then(|()| f.write_all_at(&padded, 0))
        .map_err(|e| JournalError::io(ctx("writing"), e))?;
    crate::fault::fail_point!("manifest::written");
    f.sync_all()
        .map_err(|e| JournalError::io(ctx("fsync of"), e))?;
    drop(f);
    crate::fault::fail_point!("manifest::synced");
    let exchanged = target.exists() && exchange(&spare, &target)?;
    if !exchanged {
        fs::rename(&spare, &target).map_err(|e| JournalError::io(ctx("renaming"), e))?;
    }
    crate::fault::fail_point!("manifest::replaced");
    fsync_dir(dir)?;
    crate::fault::fail_point!("manifest::dir_synced");
    if !exchanged {
        // Make the spare now, while there is room (at init, or on the first store of a
        // journal from before spares): the next replacement must not need a block. Only a
        // spare: without it, the next replacement renames again.
        let made = open_in_place(&spare)
            .and_then(|f| f.write_all_at(&padded, 0).and_then(|()| f.sync_all()));
        if let Err(e) = made {
            tracing::warn!(
                "cannot make {} (the next replacement will need free space): {e}",
                spare.display()
            );
        }
    }
    Ok(())
}

/// Opens `path` for writing over its existing blocks (created if missing, never truncated).
fn open_in_place(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// Swaps two names atomically; Ok(false) where the file system cannot.
fn exchange(a: &Path, b: &Path) -> Result<bool, JournalError> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).expect("no NUL in paths");
    let (ca, cb) = (c(a), c(b));
    // SAFETY: two valid C strings; AT_FDCWD with absolute or cwd-relative paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => Ok(false),
        _ => Err(JournalError::io(
            format!("exchanging {} and {}", a.display(), b.display()),
            e,
        )),
    }
}

/// fsync a directory so that renames and creations in it are durable.
pub fn fsync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| JournalError::io(format!("fsync of directory {}", dir.display()), e))
}

/// Creates `dir` and its missing parents, and makes each new name durable: a directory's
/// name lives in its parent, which syncing the files inside does not sync. Without it, a
/// power cut soon after a first start could take `journal/` or `checkpoints/` away, with
/// everything synced inside them since.
pub fn create_dir_durably(dir: &Path) -> std::io::Result<()> {
    let mut created = Vec::new();
    let mut next = Some(dir);
    while let Some(p) = next.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        created.push(p);
        next = p.parent();
    }
    fs::create_dir_all(dir)?;
    for p in created {
        let parent = p.parent().filter(|p| !p.as_os_str().is_empty());
        File::open(parent.unwrap_or(Path::new(".")))?.sync_all()?;
    }
    Ok(())
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
        let mut m = Manifest::new(65536, 3, RecordKey(0xfeed));
        m.epoch = 5;
        m.checkpoint.start_lsn = 77;
        m.store(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), Some(m.clone()));
        let mut next = m.clone();
        next.epoch = 6;
        next.store(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), Some(next));
        // The previous version stays, padded to a block, as the next write's place.
        let prev = fs::read_to_string(dir.path().join("MANIFEST.prev")).unwrap();
        assert_eq!(prev.len(), 4096);
        assert_eq!(Manifest::parse(&prev).unwrap(), m);
        m.store(dir.path()).unwrap();
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
