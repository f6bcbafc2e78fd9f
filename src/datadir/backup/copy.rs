//! The copy itself: the recorded checkpoint's RDB, byte for byte and checked again in the
//! copy, then the chain after it ([`chain::walk_entries`], up to a cut if one is given)
//! appended to a new journal as new entries from LSN 1, each keeping its time, then the
//! checkpoint manifest that names the RDB with the copy's own identity. The archive makes a
//! data directory from a restore point with the same pieces ([`append_slice`],
//! [`record_copy`], [`new_journal`]).

use crate::checkpoint::manifest::{Checkpoint, Recorded, CHECKPOINT_FILE};

use crate::checkpoint::store::Store;
use crate::datadir::chain::{self, ChainError};
use crate::datadir::pitr::Cut;
use crate::datadir::DataDirError::{self, Failed, Refused};
use crate::journal::manifest::{fsync_dir, replace_file};
use crate::journal::open::{replay_dir, scan_dir};
use crate::journal::{Entry, IoBackendChoice, Journal, JournalConfig, JournalError};
use crate::journal::{ReplayEntry, ReplayFrom};
use std::path::{Path, PathBuf};

/// What a backup copied.
#[derive(Debug, Clone)]
pub struct Summary {
    pub to: PathBuf,
    pub checkpoint: Checkpoint,
    /// Journal entries and stream bytes after the checkpoint, and where the stream ends.
    pub entries: u64,
    pub stream_bytes: u64,
    pub end_offset: u64,
    pub segments: u32,
    pub segment_size_bytes: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "backup written to {}", self.to.display())?;
        self.write_contents(f)
    }
}

impl Summary {
    /// What the copy holds: its checkpoint and journal.
    pub fn write_contents(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "checkpoint: {} ({} bytes of RDB, offset {})",
            self.checkpoint.file, self.checkpoint.size, self.checkpoint.offset
        )?;
        writeln!(
            f,
            "journal: {} entries, {} bytes of stream, offsets {}..{}, in a ring of {} segments of {} bytes",
            self.entries,
            self.stream_bytes,
            self.checkpoint.offset,
            self.end_offset,
            self.segments,
            self.segment_size_bytes
        )
    }
}

/// Where a copy reads the journal after the checkpoint.
pub enum Read<'a> {
    /// A journal open for writing (a running walrus's): its durable entries.
    Open(&'a Journal),
    /// A journal directory as it is, opened by no one: read only.
    Dir(&'a Path),
}

/// Entries read from a journal.
pub type Entries<'a> = Box<dyn Iterator<Item = Result<ReplayEntry, JournalError>> + 'a>;

impl<'a> Read<'a> {
    /// The bytes of journal the source's ring holds: at least those a copy of the entries
    /// after its checkpoint takes.
    pub fn used_bytes(&self) -> Result<u64, JournalError> {
        match self {
            Read::Open(j) => {
                let s = j.status();
                Ok(s.write_pos - s.head_pos)
            }
            Read::Dir(dir) => {
                let (m, report) = scan_dir(dir, &JournalConfig::default())?;
                Ok(report.end.end_pos - m.checkpoint.start_pos)
            }
        }
    }

    /// The entries from `from_lsn` on; of a directory, only once its log proves clean (mid-log
    /// corruption is refused, naming the place, as `walrus verify` does).
    pub fn entries(&self, from_lsn: u64) -> Result<Entries<'a>, JournalError> {
        match self {
            Read::Open(j) => Ok(Box::new(j.replay(ReplayFrom::Lsn(from_lsn))?)),
            Read::Dir(dir) => {
                let cfg = JournalConfig::default();
                let (_, report) = scan_dir(dir, &cfg)?;
                if let Some(corrupt) = report.corruption(dir) {
                    return Err(JournalError::InvalidArgument(corrupt));
                }
                Ok(Box::new(replay_dir(dir, &cfg, ReplayFrom::Lsn(from_lsn))?))
            }
        }
    }
}

/// RDB, then the chain (up to `cut`, if one is given) into a new journal, then the manifest
/// that names the RDB, each synced, into `dir`. `give_up` is asked between entries and between
/// blocks of the RDB.
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_into(
    read: &Read,
    store: &Store,
    copy: Journal,
    dir: &Path,
    (segment_size_bytes, segments): (u64, u32),
    runtime: &tokio::runtime::Handle,
    give_up: &dyn Fn() -> Option<String>,
    cut: Option<&Cut>,
) -> Result<Summary, DataDirError> {
    let gave_up = |why: String| Failed(format!("the backup gave up: {why}"));
    let (cp, mut rdb) = open_recorded(store).map_err(Failed)?;
    if cut.is_some_and(|c| c.checkpoint != cp) {
        return Err(Failed(format!(
            "the checkpoint changed since the cut was decided (now {}): decide it again",
            cp.file
        )));
    }
    let cp_dir = dir.join("checkpoints");
    std::fs::create_dir_all(&cp_dir)
        .map_err(|e| Failed(format!("cannot create {}: {e}", cp_dir.display())))?;
    let copy_path = cp_dir.join(&cp.file);
    let io = |what: &str, e: std::io::Error| Failed(format!("{what} {}: {e}", copy_path.display()));
    let mut out = std::fs::File::create(&copy_path).map_err(|e| io("creating", e))?;
    let mut block = vec![0u8; RDB_BLOCK_BYTES];
    loop {
        if let Some(why) = give_up() {
            return Err(gave_up(why));
        }
        let n =
            std::io::Read::read(&mut rdb, &mut block).map_err(|e| io("reading the RDB for", e))?;
        if n == 0 {
            break;
        }
        std::io::Write::write_all(&mut out, &block[..n]).map_err(|e| io("writing", e))?;
    }
    out.sync_all().map_err(|e| io("fsync of", e))?;
    // The copy is checked as a restore checks it: size, CRC-64, format.
    let copied_store = Store::read_only(&cp_dir).map_err(|e| Failed(e.to_string()))?;
    copied_store
        .verify(&cp)
        .map_err(|e| Failed(e.to_string()))?;
    crate::fault::fail_point!("backup::rdb_copied");

    let id = copy.data_dir_id();
    let mut failure = None;
    let entries = read
        .entries(cp.from_lsn)
        .map_err(|e| Failed(format!("reading the journal: {e}")))?;
    let entries: Entries = match cut {
        Some(c) => Box::new(crate::datadir::pitr::through(entries, c.at)),
        None => entries,
    };
    let walked = chain::walk_entries(entries, &cp, |slice| {
        if let Some(why) = give_up() {
            failure = Some(gave_up(why));
            return Err(ChainError::Journal(JournalError::InvalidArgument(
                "the backup gave up".into(),
            )));
        }
        append_slice(&copy, slice, runtime, (segment_size_bytes, segments)).map_err(|why| {
            let text = why.to_string();
            failure = Some(why);
            ChainError::Journal(JournalError::InvalidArgument(text))
        })
    });
    let closed = copy.close();
    if let Some(why) = failure {
        return Err(why);
    }
    let end = walked.map_err(|e| Failed(e.to_string()))?;
    if let Some(c) = cut {
        c.reached(&end)?;
    }
    crate::fault::fail_point!("backup::journal_copied");
    let record = record_copy(dir, &cp, id, closed, end.entries)?;
    crate::fault::fail_point!("backup::manifest_written");
    Ok(Summary {
        to: dir.to_path_buf(),
        checkpoint: record,
        entries: end.entries,
        stream_bytes: end.bytes,
        end_offset: end.offset,
        segments,
        segment_size_bytes,
    })
}

/// Appends one slice of the chain to a copy's journal (blocking); a ring too small for the
/// chain is refused as such.
pub(crate) fn append_slice(
    copy: &Journal,
    slice: chain::Slice,
    runtime: &tokio::runtime::Handle,
    (segment_size_bytes, segments): (u64, u32),
) -> Result<(), DataDirError> {
    let entry = Entry {
        repl_id: slice.repl_id,
        repl_offset_end: slice.end,
        payload: slice.bytes,
    };
    // The copy keeps each entry's time: `--until TIME` cuts a copy as its original.
    runtime
        .block_on(copy.append_at(entry, slice.time_ms.unwrap_or(0)))
        .map(drop)
        .map_err(|e| match e {
            JournalError::RingFull { .. } => Refused(format!(
                "the copy's ring ({segments} segments of {segment_size_bytes} bytes) \
                 cannot hold the journal after the checkpoint: give it a larger ring ({e})"
            )),
            e => Failed(format!("writing the copy's journal: {e}")),
        })
}

/// Records the copied checkpoint `cp` in `dir`'s checkpoint manifest, with the copy's
/// identity `id`, the copy's journal (closed as `closed`, with `entries` written) starting at
/// LSN 1, once every entry is durable and the journal is cut to its log
/// ([`crate::journal::compact`]); then syncs `dir`.
pub(crate) fn record_copy(
    dir: &Path,
    cp: &Checkpoint,
    id: crate::journal::manifest::DataDirId,
    closed: Result<crate::journal::Durable, JournalError>,
    entries: u64,
) -> Result<Checkpoint, DataDirError> {
    let durable = closed.map_err(|e| Failed(format!("closing the copy's journal: {e}")))?;
    if durable.lsn != entries {
        return Err(Failed(format!(
            "the copy's journal holds {} entries durably, {entries} were written",
            durable.lsn
        )));
    }
    // Its ring cut to its log: the first start on the copy fills it out again.
    crate::journal::open::cut(&dir.join("journal"))
        .map_err(|e| Failed(format!("cutting the copy's journal to its log: {e}")))?;
    let record = Checkpoint {
        from_lsn: 1,
        ..cp.clone()
    };
    // The copy is a data directory of its own: its journal's identity.
    let manifest = Recorded {
        data_dir_id: Some(id),
        checkpoint: Some(record.clone()),
    };
    replace_file(
        &dir.join("checkpoints"),
        CHECKPOINT_FILE,
        manifest.render().as_bytes(),
    )
    .map_err(|e| Failed(e.to_string()))?;
    fsync_dir(dir).map_err(|e| Failed(e.to_string()))?;
    Ok(record)
}

/// The backup's journal in `dir`/journal: a ring of `(segment size, segments)`, sparse
/// (written once, then cut to its log by [`record_copy`]).
pub(crate) fn new_journal(
    dir: &Path,
    (segment_size_bytes, segments): (u64, u32),
) -> Result<Journal, DataDirError> {
    let cfg = JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::for_geometry(segment_size_bytes, segments)
    };
    cfg.validate().map_err(|e| Refused(e.to_string()))?;
    let sparse = crate::journal::OpenOptions {
        sparse: true,
        ..Default::default()
    };
    Journal::open_with(&dir.join("journal"), &cfg, sparse)
        .map(|(j, _)| j)
        .map_err(|e| Failed(format!("cannot create the backup's journal: {e}")))
}

/// The room a copy of `journal_bytes` of journal takes besides its RDB: those bytes, and a
/// segment for what the copy's segments end in (a copy into other segments than the
/// source's splits its entries at other places).
pub(crate) fn journal_room(journal_bytes: u64, segment_size_bytes: u64) -> u64 {
    journal_bytes + segment_size_bytes
}

/// How much of the RDB is copied between two checks of whether to give up.
const RDB_BLOCK_BYTES: usize = 1 << 20;

/// The recorded checkpoint and its RDB, open. A checkpoint recorded between reading the
/// record and opening its file deletes the file: then the newer record is read again.
fn open_recorded(store: &Store) -> Result<(Checkpoint, std::fs::File), String> {
    // Each retry follows a new checkpoint; more than a few in a row means something else.
    const ATTEMPTS: usize = 5;
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        let cp = store
            .recorded()
            .ok_or("no checkpoint recorded yet: walrus records its first one when it first attaches to Valkey")?;
        match std::fs::File::open(store.path_of(&cp)) {
            Ok(f) => return Ok((cp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                last = format!("{}: {e}", store.path_of(&cp).display())
            }
            Err(e) => return Err(format!("opening {}: {e}", store.path_of(&cp).display())),
        }
    }
    Err(format!(
        "the checkpoint changed {ATTEMPTS} times while the backup opened it ({last})"
    ))
}
