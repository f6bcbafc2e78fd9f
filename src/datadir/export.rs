//! `walrus journal export-aof`: the way out. What walrus holds (the current checkpoint and
//! the journal after it) written as one append-only file with an RDB preamble, which a stock
//! valkey-server loads when it finds the file as `appendonly.aof` in its `--dir` and runs with
//! `--appendonly yes` (Valkey 7 and later move such a single file into their multi-part
//! layout by themselves).
//!
//! The file is the checkpoint's RDB, byte for byte, then the replication stream after the
//! checkpoint's offset as [`chain::walk`] hands it over (CRC-checked, without holes), minus
//! the commands that only make sense on a replication link: `PING` and `REPLCONF ...`
//! (`GETACK`), and published messages (`PUBLISH`, `SPUBLISH`: see [`super::messages`]),
//! which Valkey's own AOF never holds either. Every other command (SELECT, MULTI/EXEC, the effects of scripts, every write)
//! is kept byte for byte; that is what an AOF holds too.
//!
//! No SELECT needs adding in front of the stream: Valkey makes the first command after a
//! full synchronization (the checkpoint's offset) carry its own SELECT.
//!
//! The export runs with walrus stopped: opening the journal takes its lock (the same one a
//! running walrus holds), so what is read is a consistent, still state. It writes nothing
//! to the journal but what every open writes (the manifest's epoch).

use super::chain::{self, ChainError};
use super::commands::Commands;
use super::pitr::{Cut, Until};
use super::DataDirError;
use crate::checkpoint::manifest::Checkpoint;
use crate::checkpoint::store::Store;
use crate::journal::manifest::{fsync_dir, Manifest, MANIFEST_FILE};
use crate::journal::ring::segment_path;
use crate::journal::{IoBackendChoice, Journal, JournalConfig, JournalError};
use crate::journal::{ReplayEntry, ReplayFrom};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSummary {
    pub out: PathBuf,
    /// The checkpoint's RDB file, and its size (the file's first bytes).
    pub checkpoint: PathBuf,
    pub rdb_bytes: u64,
    /// Replication ids the stream went through, the checkpoint's first.
    pub replids: Vec<String>,
    /// Replication offsets: the checkpoint's, and the end of the journal's stream.
    pub start_offset: u64,
    pub end_offset: u64,
    /// Journal entries read after the checkpoint.
    pub journal_entries: u64,
    /// Stream bytes and commands written after the RDB.
    pub stream_bytes: u64,
    pub commands_kept: u64,
    /// Replication-only commands left out (PING, REPLCONF) and messages (PUBLISH), and their
    /// bytes.
    pub commands_dropped: u64,
    pub bytes_dropped: u64,
    /// Where a point-in-time export cut the journal (`None`: it holds all of it).
    pub cut: Option<Cut>,
}

impl ExportSummary {
    /// Size of the written file.
    pub fn file_bytes(&self) -> u64 {
        self.rdb_bytes + self.stream_bytes
    }
}

/// Writes the current checkpoint plus the journal after it, up to where `until` cuts it
/// ([`super::pitr`]), to `out` as one AOF with an RDB preamble (blocking). `data_dir` is
/// walrus's data directory (holding `journal/` and `checkpoints/`), or its journal directory.
pub fn export_aof(
    data_dir: &Path,
    out: &Path,
    until: &Until,
) -> Result<ExportSummary, DataDirError> {
    let (journal_dir, cp_dir) = super::data_dirs(data_dir);
    let live = super::backup::target::live_dir_of(out, &[journal_dir.clone(), cp_dir.clone()])?;
    if let Some(live) = live {
        return Err(DataDirError::Refused(format!(
            "--out {} is inside walrus's own {}: write the export elsewhere (there it could \
             replace a file walrus keeps, or be removed as a leftover)",
            out.display(),
            live.display()
        )));
    }
    super::parts::check(&journal_dir, &cp_dir, None)?;
    export(data_dir, out, until)
}

fn export(data_dir: &Path, out: &Path, until: &Until) -> Result<ExportSummary, DataDirError> {
    use DataDirError::Failed;
    let (journal_dir, cp_dir) = super::data_dirs(data_dir);
    let manifest = Manifest::load(&journal_dir)
        .map_err(|e| Failed(e.to_string()))?
        .ok_or_else(|| {
            Failed(format!(
                "no journal in {} (no {MANIFEST_FILE}): --dir must be walrus's data directory, \
                 the one holding journal/ and checkpoints/",
                journal_dir.display()
            ))
        })?;
    if !cp_dir.join("CHECKPOINT").is_file() {
        return Err(Failed(format!(
            "no checkpoint in {}: walrus records its first one when it first attaches to Valkey",
            cp_dir.display()
        )));
    }
    // Opening a journal creates missing segment files, zero-filled: that would hide a lost
    // one instead of reporting it.
    if let Some(missing) = (0..manifest.segments)
        .map(|i| segment_path(&journal_dir, i))
        .find(|p| !p.is_file())
    {
        return Err(Failed(format!(
            "journal segment {} is missing; `walrus journal verify --dir {}` tells what is left",
            missing.display(),
            journal_dir.display()
        )));
    }
    // The journal first: its lock proves no walrus is running, before the checkpoint is read.
    let cfg = JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::for_geometry(manifest.segment_size_bytes, manifest.segments)
    };
    let (journal, _) = Journal::open(&journal_dir, &cfg).map_err(|e| {
        Failed(match e {
            JournalError::InUse { .. } => format!(
                "the journal in {} is in use by a running walrus; stop it first ({e})",
                journal_dir.display()
            ),
            e => format!("cannot open the journal: {e}"),
        })
    })?;
    let store = Store::read_only(&cp_dir).map_err(|e| Failed(e.to_string()))?;
    let cp = store
        .current()
        .map_err(|e| Failed(e.to_string()))?
        .ok_or_else(|| Failed(format!("no checkpoint recorded in {}", cp_dir.display())))?;
    store.verify(&cp).map_err(|e| Failed(e.to_string()))?;
    let replay = || journal.replay(ReplayFrom::Lsn(cp.from_lsn));
    let cut = match until {
        Until::End => None,
        until => Some(super::pitr::find::find_cut(&cp, replay()?, until)?),
    };
    let result = write_atomically(out, |w| {
        let entries = replay().map_err(|e| e.to_string())?;
        match &cut {
            Some(c) => write_aof(w, &store, &cp, super::pitr::through(entries, c.at)),
            None => write_aof(w, &store, &cp, entries),
        }
    });
    let closed = journal.close();
    let mut summary = result.map_err(Failed)?;
    closed.map_err(|e| Failed(format!("closing the journal: {e}")))?;
    summary.out = out.to_path_buf();
    summary.cut = cut;
    Ok(summary)
}

/// Writes `out` through a temporary file beside it: fsynced, renamed over `out`, the
/// directory fsynced. On failure the temporary file is removed and `out` is untouched.
fn write_atomically(
    out: &Path,
    body: impl FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> Result<ExportSummary, String>,
) -> Result<ExportSummary, String> {
    let name = out
        .file_name()
        .ok_or_else(|| format!("--out {} does not name a file", out.display()))?;
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".export.tmp");
    let tmp = dir.join(tmp_name);
    let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", tmp.display());
    let file = std::fs::File::create(&tmp).map_err(|e| io("creating", e))?;
    let result = (|| {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, &file);
        let summary = body(&mut w)?;
        w.flush().map_err(|e| io("writing", e))?;
        drop(w);
        file.sync_all().map_err(|e| io("fsync of", e))?;
        std::fs::rename(&tmp, out)
            .map_err(|e| format!("renaming {} to {}: {e}", tmp.display(), out.display()))?;
        fsync_dir(dir).map_err(|e| e.to_string())?;
        Ok(summary)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn write_aof(
    w: &mut impl Write,
    store: &Store,
    cp: &Checkpoint,
    entries: impl Iterator<Item = Result<ReplayEntry, JournalError>>,
) -> Result<ExportSummary, String> {
    let path = store.path_of(cp);
    let rdb_bytes = copy_rdb(w, &path)?;
    let mut filter = Filter::new(cp.offset);
    // The closure can only fail with a ChainError: the real reason waits here.
    let mut failure: Option<String> = None;
    let walked = chain::walk_entries(entries, cp, |slice| {
        filter.feed(&slice.bytes, w).map_err(|e| {
            failure = Some(e);
            ChainError::Journal(JournalError::InvalidArgument("export failed".into()))
        })
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let end = walked.map_err(|e| e.to_string())?;
    filter.finish()?;
    Ok(ExportSummary {
        out: PathBuf::new(),
        checkpoint: path,
        rdb_bytes,
        replids: end.ids,
        start_offset: cp.offset,
        end_offset: end.offset,
        journal_entries: end.entries,
        stream_bytes: filter.kept_bytes,
        commands_kept: filter.kept,
        commands_dropped: filter.dropped,
        bytes_dropped: filter.dropped_bytes,
        cut: None,
    })
}

/// Copies the RDB verbatim (verified just before, with the journal's lock held: nothing
/// changes it meanwhile). Returns its size.
fn copy_rdb(w: &mut impl Write, path: &Path) -> Result<u64, String> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| format!("reading checkpoint {}: {e}", path.display()))?;
    std::io::copy(&mut f, w).map_err(|e| format!("copying checkpoint {}: {e}", path.display()))
}

/// Keeps the stream's commands ([`Commands`]) but the replication-only ones.
struct Filter {
    commands: Commands,
    kept: u64,
    kept_bytes: u64,
    dropped: u64,
    dropped_bytes: u64,
}

impl Filter {
    fn new(offset: u64) -> Filter {
        Filter {
            commands: Commands::new(offset),
            kept: 0,
            kept_bytes: 0,
            dropped: 0,
            dropped_bytes: 0,
        }
    }

    /// Writes the whole commands `bytes` completes.
    fn feed(&mut self, bytes: &[u8], w: &mut impl Write) -> Result<(), String> {
        let Filter {
            commands,
            kept,
            kept_bytes,
            dropped,
            dropped_bytes,
        } = self;
        commands
            .feed(bytes, |c| {
                let n = c.end - c.start;
                let name = c.name();
                if name.eq_ignore_ascii_case(b"PING")
                    || name.eq_ignore_ascii_case(b"REPLCONF")
                    || super::messages::is_message(name)
                {
                    *dropped += 1;
                    *dropped_bytes += n;
                } else {
                    w.write_all(&c.request.raw)
                        .map_err(|e| format!("writing the output: {e}"))?;
                    *kept += 1;
                    *kept_bytes += n;
                }
                Ok(())
            })
            .map_err(|e| e.to_string())
    }

    /// The stream must end after a whole command.
    fn finish(&self) -> Result<(), String> {
        self.commands.finish().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::write::command;

    fn run(slices: &[&[u8]]) -> (Vec<u8>, Filter) {
        let mut f = Filter::new(100);
        let mut out = Vec::new();
        for s in slices {
            f.feed(s, &mut out).unwrap();
        }
        (out, f)
    }

    #[test]
    fn drops_replication_commands_and_messages_keeps_the_rest_across_slices() {
        let select = command(["SELECT", "3"]);
        let set = command(["SET", "k", "v\r\nwith PING inside"]);
        let ping = command(["PING"]);
        let publish = command(["PUBLISH", "news", "old"]);
        let getack = command(["REPLCONF", "GETACK", "*"]);
        let multi = command(["MULTI"]);
        let exec = command(["EXEC"]);
        let stream = [
            &select[..],
            &ping,
            &set,
            &getack,
            &multi,
            &set,
            &publish,
            &exec,
            &ping,
        ]
        .concat();
        let want = [&select[..], &set, &multi, &set, &exec].concat();
        // Every split point, including inside commands and inside CRLFs.
        for cut in 0..=stream.len() {
            for cut2 in cut..=stream.len() {
                let (out, f) = run(&[&stream[..cut], &stream[cut..cut2], &stream[cut2..]]);
                assert_eq!(out, want, "cuts at {cut}, {cut2}");
                assert_eq!((f.kept, f.dropped), (5, 4));
                assert_eq!(f.kept_bytes + f.dropped_bytes, stream.len() as u64);
                f.finish().unwrap();
            }
        }
        let (_, f) = run(&[&stream[..stream.len() - 3]]);
        assert!(f.finish().unwrap_err().contains("ends inside a command"));
    }
}
