//! Backups: the current checkpoint and the journal after it, copied into a new data
//! directory that `walrus serve --data-dir` restores from and `walrus verify` checks.
//!
//! The copy is not of files but of the chain ([`chain::walk`]): the checkpoint's RDB, byte
//! for byte (its CRC checked again in the copy), and a new journal holding the stream after
//! the checkpoint's offset, up to the durable end when the copy starts, as new entries from
//! LSN 1 (the copy's checkpoint manifest says `from_lsn = 1`). So the copy is consistent
//! while walrus writes on (only durable entries are read, and only up to where the walk
//! began), holds nothing a restore does not need, and may have another ring geometry than
//! the original: the same copy, offline, is how a ring is resized ([`offline`]).
//!
//! Live ([`Backups::take`], `POST /backup`): a checkpoint first (which keeps the journal to
//! copy short), then the checkpointer's pin ([`crate::checkpoint::Pin`]) held while
//! copying, so that no checkpoint releases the segments being read; a checkpoint that runs
//! meanwhile records its RDB but releases nothing until the copy is done. The RDB is opened
//! before anything else is read: a checkpoint recorded meanwhile deletes its name, and the
//! open file stays readable.
//!
//! A backup is written into a staging directory beside its target (`.NAME.partial`) and
//! renamed into place once complete and synced: a backup cut short (walrus killed, the
//! disk full) is never found under the name asked for, so neither `walrus verify` nor
//! `walrus serve` can take half a backup for a whole one. The staging directory is locked
//! while it is written, so the next backup beside it, to any name, removes those that
//! backups cut short left. It gives up, releasing the pin,
//! when walrus stops or when the ring wants room (an append was refused for it): a backup
//! must not hold back the checkpoint that frees the ring, or writes would wait on it.

use super::chain::{self, ChainError};
use super::pitr::Cut;
use super::DataDirError;
use crate::checkpoint::store::{Checkpoint, Recorded, Store, CHECKPOINT_FILE};
use crate::checkpoint::{CheckpointError, Pin, Request};
use crate::journal::lock::{Access, DirLock};
use crate::journal::manifest::{fsync_dir, replace_file, Manifest};
use crate::journal::open::{replay_dir, scan_dir};
use crate::journal::{Entry, IoBackendChoice, Journal, JournalConfig, JournalError};
use crate::journal::{ReplayEntry, ReplayFrom};
use std::path::{Path, PathBuf};

use DataDirError::{Failed, Refused};

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

/// Live backups of a running walrus.
pub struct Backups {
    /// Weak: the journal must close at shutdown; the endpoint that holds this lives on.
    pub journal: std::sync::Weak<Journal>,
    pub store: Store,
    pub checkpoint: tokio::sync::mpsc::Sender<Request>,
    pub pin: Pin,
    /// One backup at a time: a second one would only double the reads and the pin's time.
    pub running: tokio::sync::Mutex<()>,
    /// Set when walrus stops: a backup gives up rather than hold the shutdown.
    pub stop: tokio::sync::watch::Receiver<bool>,
    /// `disk.high_watermark`: a backup on the journal's or checkpoints' file system must
    /// leave it below, or walrus would refuse writes because of its own backup.
    pub high_watermark: f64,
}

impl Backups {
    /// Takes a checkpoint, then copies it and the journal after it into `to` (absolute, new
    /// or empty).
    pub async fn take(&self, to: PathBuf) -> Result<Summary, DataDirError> {
        self.copy(to, true).await
    }

    /// Copies the recorded checkpoint and the whole journal after it into `to`, taking no new
    /// checkpoint: what an in-place rewind starts from, and its way back
    /// (`crate::restore::rewind`). The journal must be settled, with no write coming.
    pub async fn keep(&self, to: PathBuf) -> Result<Summary, DataDirError> {
        self.copy(to, false).await
    }

    async fn copy(&self, to: PathBuf, checkpoint_first: bool) -> Result<Summary, DataDirError> {
        let _one = self.running.try_lock().map_err(|_| {
            Failed("another backup is running; wait for it to finish (one at a time)".into())
        })?;
        if !to.is_absolute() {
            return Err(Refused(format!(
                "{} is not an absolute path (walrus resolves nothing against its working directory)",
                to.display()
            )));
        }
        let journal = self.journal.upgrade().ok_or(Failed(
            "walrus is shutting down: the journal is closed".into(),
        ))?;
        let journal_dir = journal
            .segment_paths()
            .first()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        let live: Vec<PathBuf> = [Some(self.store.dir().to_path_buf()), journal_dir]
            .into_iter()
            .flatten()
            .collect();
        let status = journal.status();
        let geometry = (status.segment_bytes, status.segments);
        drop(journal);
        let target = Target::prepare(&to, &live)?;
        if checkpoint_first {
            self.checkpoint_first(&target).await?;
        }
        let rdb = self.store.recorded().map_or(0, |cp| cp.size);
        let need = rdb + geometry.0 * u64::from(geometry.1);
        // On the data's file system the next checkpoint must still fit below the mark.
        if let Err(e) = target.check_room(need, &live, Some((self.high_watermark, rdb))) {
            return Err(target.abandon(e));
        }
        // The copy's ring is allocated (zero-filled) before the pin: that takes as long as
        // writing the ring, and checkpoints need not wait for it.
        let staging = target.staging.clone();
        let copy = match tokio::task::spawn_blocking(move || new_journal(&staging, geometry)).await
        {
            Ok(Ok(copy)) => copy,
            Ok(Err(e)) => return Err(target.abandon(e)),
            Err(e) => return Err(target.abandon(Failed(format!("the backup task failed: {e}")))),
        };
        if *self.stop.borrow() {
            let _ = copy.close();
            return Err(target.abandon(Failed("the backup gave up: walrus is stopping".into())));
        }
        let pinned = self.pin.clone().read_owned().await;
        let Some(journal) = self.journal.upgrade() else {
            return Err(target.abandon(Failed(
                "walrus is shutting down: the journal is closed".into(),
            )));
        };
        let store = self.store.clone();
        let runtime = tokio::runtime::Handle::current();
        let stop = self.stop.clone();
        let copied = tokio::task::spawn_blocking(move || {
            let give_up = || {
                if *stop.borrow() {
                    Some("walrus is stopping".to_string())
                } else if journal.wants_room() {
                    Some("the journal's ring wants room, which only a checkpoint can free, and the backup held it back; retry when writes are quieter, or give the ring more segments".to_string())
                } else {
                    None
                }
            };
            target.write(
                &Read::Open(&journal),
                &store,
                copy,
                geometry,
                &runtime,
                &give_up,
                None,
            )
        })
        .await
        .map_err(|e| Failed(format!("the backup task failed: {e}")))?;
        drop(pinned);
        copied
    }

    /// A checkpoint before a backup, so that the copy holds little journal.
    async fn checkpoint_first(&self, target: &Target) -> Result<(), DataDirError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.checkpoint
            .send(tx)
            .await
            .map_err(|_| target.abandon(Failed("the checkpointer is not running".into())))?;
        match rx.await {
            Ok(Ok(_)) => Ok(()),
            // Nothing written since the recorded checkpoint: it is the fresh one.
            Ok(Err(CheckpointError::NotNow(why))) => {
                tracing::info!("backup: no new checkpoint ({why}); copying the recorded one");
                Ok(())
            }
            Ok(Err(e)) => Err(target.abandon(Failed(format!(
                "the checkpoint before the backup failed: {e}"
            )))),
            Err(_) => Err(target.abandon(Failed("the checkpointer stopped".into()))),
        }
    }
}

/// `path` with symlinks resolved as far as it exists, the rest appended as written.
fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        match existing.canonicalize() {
            Ok(p) => return Ok(rest.iter().rev().fold(p, |p, part| p.join(part))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                rest.push(existing.file_name().ok_or(e)?.to_os_string());
                existing = existing.parent().unwrap_or(Path::new("."));
                if existing.as_os_str().is_empty() {
                    existing = Path::new(".");
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Where a backup goes: its directory, and the staging directory beside it that is renamed
/// to it once the copy is complete.
struct Target {
    to: PathBuf,
    staging: PathBuf,
    /// The staging directory's lock: a backup writing it is not one cut short.
    _lock: DirLock,
}

/// The one of walrus's `live` directories that `path` would be inside once the symlinks
/// above it are resolved, if any: a backup or an export written there could replace a file
/// walrus keeps, or be removed as a leftover.
pub(super) fn live_dir_of(path: &Path, live: &[PathBuf]) -> Result<Option<PathBuf>, String> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut resolved =
        resolve(parent).map_err(|e| format!("cannot resolve {}: {e}", parent.display()))?;
    resolved.extend(path.file_name());
    Ok(live
        .iter()
        .filter_map(|d| d.canonicalize().ok())
        .find(|live| resolved.starts_with(live)))
}

/// Removes the staging directories that backups cut short left beside `staging` (this
/// backup's), whatever their target: a `.NAME.partial` directory whose lock no backup holds,
/// holding nothing but what a backup writes (this target's own is walrus's whatever it
/// holds). One that cannot be removed is left, and said.
fn remove_abandoned(staging: &Path) {
    const WRITTEN: [&str; 3] = [crate::journal::lock::LOCK_FILE, "journal", "checkpoints"];
    let parent = staging.parent().unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        let a_staging = name
            .to_str()
            .and_then(|n| n.strip_prefix('.')?.strip_suffix(".partial"))
            .is_some_and(|target| !target.is_empty());
        if !a_staging || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let a_backups = path == staging
            || std::fs::read_dir(&path).is_ok_and(|mut inside| {
                inside.all(|f| f.is_ok_and(|f| WRITTEN.iter().any(|w| f.file_name() == *w)))
            });
        // Held: a backup is writing it now.
        let Some(_held) = a_backups
            .then(|| DirLock::take(&path, Access::Exclusive).ok())
            .flatten()
        else {
            continue;
        };
        match std::fs::remove_dir_all(&path) {
            Ok(()) => tracing::info!("removed {}, left by a backup cut short", path.display()),
            Err(e) => tracing::warn!(
                "cannot remove {}, left by a backup cut short: {e}",
                path.display()
            ),
        }
    }
}

impl Target {
    /// Checks `to` and makes its staging directory. `to` must name a new or empty directory
    /// that is neither a symlink nor a mount point (the staging directory beside it must
    /// rename onto it, on one file system), without `.` or `..`, and not inside one of
    /// walrus's `live` directories once symlinks above it are resolved. Nothing is created
    /// before these checks pass.
    fn prepare(to: &Path, live: &[PathBuf]) -> Result<Target, DataDirError> {
        use std::os::unix::fs::MetadataExt;
        let refused = |why: &str| Refused(format!("{}: {why}", to.display()));
        let dotted = to
            .as_os_str()
            .to_string_lossy()
            .split('/')
            .any(|part| part == "." || part == "..");
        if dotted {
            return Err(refused("name the directory without . or .. in its path"));
        }
        let name = to
            .file_name()
            .ok_or_else(|| refused("names no directory"))?;
        let parent = to
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if let Some(live) = live_dir_of(to, live).map_err(Failed)? {
            return Err(Refused(format!(
                "{} is inside walrus's own {}: back up elsewhere (e.g. a backups/ directory \
                 beside journal/ and checkpoints/, better on another volume)",
                to.display(),
                live.display()
            )));
        }
        match std::fs::symlink_metadata(to) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Refused(format!("cannot read {}: {e}", to.display()))),
            Ok(m) if m.file_type().is_symlink() => {
                return Err(refused("is a symlink: name the directory it points to"))
            }
            Ok(m) if !m.is_dir() => return Err(refused("is not a directory")),
            Ok(m) => {
                let mut entries = std::fs::read_dir(to)
                    .map_err(|e| Refused(format!("cannot read {}: {e}", to.display())))?;
                if entries.next().is_some() {
                    return Err(refused(
                        "is not empty: a backup goes into a new or empty directory",
                    ));
                }
                let parent_dev = std::fs::metadata(parent).map(|p| p.dev()).ok();
                if parent_dev != Some(m.dev()) {
                    return Err(refused(
                        "is a mount point: back up into a new directory inside it",
                    ));
                }
            }
        }
        // The parent is a person's to make writable: a failure here is theirs to fix.
        std::fs::create_dir_all(parent)
            .map_err(|e| Refused(format!("cannot create {}: {e}", parent.display())))?;
        let mut staging_name = std::ffi::OsString::from(".");
        staging_name.push(name);
        staging_name.push(".partial");
        let staging = parent.join(staging_name);
        // What backups cut short left here (walrus killed, the disk full), for this target or
        // another; then a file or symlink in the way of this one's (named for this target,
        // it is nobody else's; removed, not followed).
        remove_abandoned(&staging);
        match std::fs::symlink_metadata(&staging) {
            Ok(m) if !m.is_dir() => std::fs::remove_file(&staging)
                .map_err(|e| Failed(format!("cannot remove {}: {e}", staging.display())))?,
            _ => {}
        }
        std::fs::create_dir(&staging).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Failed(format!(
                "another backup is writing {} ({} is in use)",
                to.display(),
                staging.display()
            )),
            _ => Refused(format!("cannot create {}: {e}", staging.display())),
        })?;
        // Held until the copy is renamed into place, or removed: a later backup leaves it.
        let lock = DirLock::take(&staging, Access::Exclusive)
            .map_err(|e| Failed(format!("cannot lock {}: {e}", staging.display())))?;
        Ok(Target {
            to: to.to_path_buf(),
            staging,
            _lock: lock,
        })
    }

    /// Refuses a backup of `need` bytes that its file system cannot hold, or, when that is
    /// also the file system of one of walrus's `live` directories, one that would leave no
    /// room below the high watermark for the next checkpoint (`(mark, its size)`): walrus
    /// would then refuse writes because of its own backup.
    fn check_room(
        &self,
        need: u64,
        live: &[PathBuf],
        high_watermark: Option<(f64, u64)>,
    ) -> Result<(), DataDirError> {
        use std::os::unix::fs::MetadataExt;
        let usage = crate::disk::Usage::of(&self.staging).map_err(|e| {
            Failed(format!(
                "cannot read {}'s file system: {e}",
                self.staging.display()
            ))
        })?;
        let mib = |b: u64| format!("{} MiB", b >> 20);
        if usage.avail_bytes < need {
            return Err(Refused(format!(
                "the backup needs {} (the checkpoint's RDB and a ring of the journal's size) and {}'s file system has {} free: back up to a larger volume",
                mib(need),
                self.to.display(),
                mib(usage.avail_bytes)
            )));
        }
        let dev = |p: &Path| std::fs::metadata(p).ok().map(|m| m.dev());
        let shared = live
            .iter()
            .any(|d| dev(d).is_some() && dev(d) == dev(&self.staging));
        if let (true, Some((high, next_checkpoint))) = (shared, high_watermark) {
            let total = (usage.used_bytes + usage.avail_bytes).max(1);
            let after = (usage.used_bytes + need + next_checkpoint) as f64 / total as f64;
            if after >= high {
                return Err(Refused(format!(
                    "the backup needs {} on the file system walrus's data is on, which would then be {:.0}% full with room for the next checkpoint, past disk.high_watermark ({:.0}%): walrus would refuse writes. Back up to another volume",
                    mib(need),
                    after * 100.0,
                    high * 100.0
                )));
            }
        }
        Ok(())
    }

    /// Removes what was written, and returns `why`.
    fn abandon(&self, why: DataDirError) -> DataDirError {
        let _ = std::fs::remove_dir_all(&self.staging);
        why
    }

    /// The copy, into the staging directory, then renamed to the target (blocking). On
    /// failure what it wrote is removed.
    #[allow(clippy::too_many_arguments)]
    fn write(
        self,
        read: &Read,
        store: &Store,
        copy: Journal,
        geometry: (u64, u32),
        runtime: &tokio::runtime::Handle,
        give_up: &dyn Fn() -> Option<String>,
        cut: Option<&Cut>,
    ) -> Result<Summary, DataDirError> {
        let copied = copy_into(
            read,
            store,
            copy,
            &self.staging,
            geometry,
            runtime,
            give_up,
            cut,
        )
        .and_then(|summary| {
            if let Some(why) = give_up() {
                return Err(Failed(format!("the backup gave up: {why}")));
            }
            // rename(2) replaces an empty directory, as `prepare` allows the target to be.
            std::fs::rename(&self.staging, &self.to).map_err(|e| {
                Failed(format!(
                    "cannot rename {} to {}: {e}",
                    self.staging.display(),
                    self.to.display()
                ))
            })?;
            crate::fault::fail_point!("backup::renamed");
            let parent = self.staging.parent().unwrap_or(Path::new("."));
            fsync_dir(parent).map_err(|e| Failed(e.to_string()))?;
            Ok(Summary {
                to: self.to.clone(),
                ..summary
            })
        });
        match copied {
            Ok(s) => Ok(s),
            Err(e) => Err(self.abandon(e)),
        }
    }
}

/// Offline: copies a stopped walrus's data directory `from` into `to` with a ring of
/// `segments` x `segment_size_bytes` (None: the same as `from`'s). Opening the journal
/// takes its lock: a running walrus is refused.
pub fn offline(
    from: &Path,
    to: &Path,
    geometry: (Option<u64>, Option<u32>),
) -> Result<Summary, DataDirError> {
    let stopped = Stopped::of(from, geometry)?;
    // The journal's lock first: against a running walrus nothing is touched, not even a
    // staging directory its own backup may be writing.
    let cfg = JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::for_geometry(
            stopped.manifest.segment_size_bytes,
            stopped.manifest.segments,
        )
    };
    let (journal, _) = Journal::open(&stopped.journal_dir, &cfg).map_err(|e| {
        Failed(format!(
            "cannot open the journal (is walrus still running?): {e}"
        ))
    })?;
    let copied = stopped.copy(&Read::Open(&journal), to, None);
    journal
        .close()
        .map_err(|e| Failed(format!("closing the journal: {e}")))?;
    copied
}

/// A data directory no walrus runs in (stopped, or a backup), checked as `serve` checks it,
/// to be copied.
pub(super) struct Stopped {
    pub journal_dir: PathBuf,
    pub cp_dir: PathBuf,
    pub manifest: Manifest,
    /// The copy's ring.
    pub geometry: (u64, u32),
}

impl Stopped {
    /// `from`'s parts, which must prove what it holds ([`super::parts::check`]); the
    /// copy's ring is `geometry` (`from`'s where not given).
    pub fn of(from: &Path, geometry: (Option<u64>, Option<u32>)) -> Result<Stopped, DataDirError> {
        let (journal_dir, cp_dir) = super::data_dirs(from);
        super::parts::check(&journal_dir, &cp_dir, None)?;
        let manifest = Manifest::load(&journal_dir)
            .map_err(|e| Refused(e.to_string()))?
            .ok_or_else(|| Refused(format!("no journal in {}", journal_dir.display())))?;
        let geometry = (
            geometry.0.unwrap_or(manifest.segment_size_bytes),
            geometry.1.unwrap_or(manifest.segments),
        );
        Ok(Stopped {
            journal_dir,
            cp_dir,
            manifest,
            geometry,
        })
    }

    /// Copies the checkpoint and the journal after it, read through `read`, up to `cut`
    /// (all of it: `None`), into the new data directory `to` (blocking).
    pub fn copy(&self, read: &Read, to: &Path, cut: Option<&Cut>) -> Result<Summary, DataDirError> {
        let live = [self.journal_dir.clone(), self.cp_dir.clone()];
        let geometry = self.geometry;
        Target::prepare(to, &live).and_then(|target| {
            let opened = Store::read_only(&self.cp_dir)
                .map_err(|e| Failed(e.to_string()))
                .and_then(|store| {
                    let rdb = store.recorded().map_or(0, |cp| cp.size);
                    // walrus is stopped: the file system only has to hold the copy.
                    target.check_room(rdb + geometry.0 * u64::from(geometry.1), &live, None)?;
                    let copy = new_journal(&target.staging, geometry)?;
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| Failed(format!("cannot start a runtime: {e}")))?;
                    Ok((store, copy, runtime))
                });
            match opened {
                Ok((store, copy, runtime)) => target.write(
                    read,
                    &store,
                    copy,
                    geometry,
                    runtime.handle(),
                    &|| None,
                    cut,
                ),
                Err(e) => Err(target.abandon(e)),
            }
        })
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
fn copy_into(
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
        Some(c) => Box::new(super::pitr::through(entries, c.at)),
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
        c.reached(&end).map_err(Failed)?;
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
/// LSN 1, once every entry is durable; then syncs `dir`.
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

/// The backup's journal in `dir`/journal, its ring allocated: a ring of `(segment size,
/// segments)`.
pub(crate) fn new_journal(
    dir: &Path,
    (segment_size_bytes, segments): (u64, u32),
) -> Result<Journal, DataDirError> {
    let cfg = JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::for_geometry(segment_size_bytes, segments)
    };
    cfg.validate().map_err(|e| Refused(e.to_string()))?;
    Journal::open(&dir.join("journal"), &cfg)
        .map(|(j, _)| j)
        .map_err(|e| Failed(format!("cannot create the backup's journal: {e}")))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::store::tests::stored;

    /// A journal of five entries after a checkpoint at offset 30, as a running walrus has.
    fn data(dir: &Path) -> (Journal, Store) {
        let cfg = JournalConfig::small_for_tests(64 * 1024, 4);
        let (journal, _) = Journal::open(&dir.join("journal"), &cfg).unwrap();
        let a = "a".repeat(40);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut last = None;
            for i in 1..=5u64 {
                let entry = Entry {
                    repl_id: a.as_bytes().try_into().unwrap(),
                    repl_offset_end: 20 + i * 10,
                    payload: bytes::Bytes::from(vec![b'x'; 10]),
                };
                last = Some(journal.append(entry).await.unwrap());
            }
            last.unwrap().wait().await.unwrap();
        });
        let store = crate::checkpoint::store::tests::open(&dir.join("checkpoints"));
        let rdb = stored(&store, &a, 30, b"REDIS0011body");
        store
            .record_or_discard(&rdb, "Valkey 9.1.2", &a, 30, 2)
            .unwrap();
        (journal, store)
    }

    fn write(
        journal: &Journal,
        store: &Store,
        to: &Path,
        give_up: &dyn Fn() -> Option<String>,
    ) -> Result<Summary, DataDirError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let target = Target::prepare(to, &[])?;
        let copy = new_journal(&target.staging, (64 * 1024, 4))?;
        target.write(
            &Read::Open(journal),
            store,
            copy,
            (64 * 1024, 4),
            runtime.handle(),
            give_up,
            None,
        )
    }

    #[test]
    fn a_backup_appears_under_its_name_only_complete() {
        let tmp = tempfile::tempdir().unwrap();
        let (journal, store) = data(&tmp.path().join("data"));
        let to = tmp.path().join("backups/b1");
        // Given up half way (walrus stopping, the ring wanting room): nothing is left, under
        // its name or beside it.
        let asked = std::cell::Cell::new(0);
        let give_up = || {
            asked.set(asked.get() + 1);
            (asked.get() > 2).then(|| "walrus is stopping".to_string())
        };
        let e = write(&journal, &store, &to, &give_up).unwrap_err();
        assert!(matches!(e, DataDirError::Failed(_)), "{e}");
        assert!(e.to_string().contains("walrus is stopping"), "{e}");
        assert!(!to.exists());
        let parent = tmp.path().join("backups");
        assert_eq!(std::fs::read_dir(&parent).unwrap().count(), 0);
        // A staging directory left by a crash is not a backup, and the next one replaces it;
        // so are those of backups to other names, unless a backup holds one, or it holds
        // what no backup writes.
        for left in [".b1.partial", ".b0.partial", ".b2.partial"] {
            std::fs::create_dir_all(parent.join(left).join("checkpoints")).unwrap();
        }
        let writing = DirLock::take(&parent.join(".b2.partial"), Access::Exclusive).unwrap();
        std::fs::create_dir_all(parent.join(".notes.partial")).unwrap();
        std::fs::write(parent.join(".notes.partial/notes.txt"), b"mine").unwrap();
        let done = write(&journal, &store, &to, &|| None).unwrap();
        assert!(!parent.join(".b0.partial").exists());
        assert!(parent.join(".b2.partial/checkpoints").is_dir());
        assert!(parent.join(".notes.partial/notes.txt").is_file());
        drop(writing);
        for kept in [".b2.partial", ".notes.partial"] {
            std::fs::remove_dir_all(parent.join(kept)).unwrap();
        }
        assert_eq!(done.to, to);
        assert_eq!(done.entries, 4, "the entries after the checkpoint's offset");
        assert!(to.join("checkpoints").join(CHECKPOINT_FILE).is_file());
        assert!(!parent.join(".b1.partial").exists());
        let v = crate::datadir::verify::verify_data_dir(&to, None).unwrap();
        assert_eq!(v.restore.unwrap().chain.entries, 4);
        // A copy whose manifest is missing (a copy by hand, cut short) is no backup.
        std::fs::remove_file(to.join("checkpoints").join(CHECKPOINT_FILE)).unwrap();
        std::fs::remove_dir_all(to.join("journal")).unwrap();
        drop(journal.close());
        let cfg = JournalConfig::small_for_tests(64 * 1024, 4);
        drop(Journal::open(&to.join("journal"), &cfg).unwrap());
        let e = crate::datadir::verify::verify_data_dir(&to, None).unwrap_err();
        assert!(e.to_string().contains("an incomplete copy"), "{e}");
    }

    #[test]
    fn a_backup_into_walruss_own_directories_is_refused_however_it_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let live = [data.join("journal"), data.join("checkpoints")];
        for d in &live {
            std::fs::create_dir_all(d).unwrap();
        }
        std::os::unix::fs::symlink(data.join("journal"), tmp.path().join("link")).unwrap();
        for to in [
            data.join("checkpoints/nightly.rdb"),
            tmp.path().join("link/b1"),
            tmp.path().join("link/x/y/b1"),
        ] {
            let e = Target::prepare(&to, &live).err().expect("refused");
            assert!(
                matches!(e, DataDirError::Refused(_))
                    && e.to_string().contains("inside walrus's own"),
                "{}: {e}",
                to.display()
            );
        }
        // Nothing was created inside them on the way to the refusal.
        assert!(!data.join("journal/x").exists());
        // Names that are not a plain new or empty directory are refused as such.
        std::fs::create_dir_all(tmp.path().join("empty")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("empty"), tmp.path().join("to-empty")).unwrap();
        std::fs::write(tmp.path().join("a-file"), b"x").unwrap();
        for (to, why) in [
            (
                data.join("backups/../checkpoints/nightly"),
                "without . or ..",
            ),
            (tmp.path().join("empty/."), "without . or .."),
            (tmp.path().join("to-empty"), "is a symlink"),
            (tmp.path().join("a-file"), "is not a directory"),
        ] {
            let e = Target::prepare(&to, &live).err().expect("refused");
            assert!(
                matches!(e, DataDirError::Refused(_)) && e.to_string().contains(why),
                "{}: {e}",
                to.display()
            );
        }
        // Beside them is fine, and so is an empty directory.
        assert!(Target::prepare(&data.join("backups/b1"), &live).is_ok());
        assert!(Target::prepare(&tmp.path().join("empty"), &live).is_ok());
    }

    #[test]
    fn a_backup_its_file_system_cannot_hold_or_that_would_pass_the_watermark_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let live = [tmp.path().join("data")];
        std::fs::create_dir_all(&live[0]).unwrap();
        let target = Target::prepare(&tmp.path().join("b1"), &live).unwrap();
        let e = target.check_room(u64::MAX / 2, &live, None).unwrap_err();
        assert!(e.to_string().contains("free"), "{e}");
        // On the data's own file system, any figure past the high watermark refuses writes.
        let e = target.check_room(1, &live, Some((1e-12, 0))).unwrap_err();
        assert!(e.to_string().contains("disk.high_watermark"), "{e}");
        // On another file system (none of walrus's directories there), the watermark is not
        // walrus's concern.
        assert!(target.check_room(1, &[], Some((1e-12, 0))).is_ok());
        assert!(target.check_room(1, &live, Some((0.999_999, 0))).is_ok());
        // ... unless the next checkpoint would then not fit below it.
        let avail = crate::disk::Usage::of(tmp.path()).unwrap().avail_bytes;
        let e = target
            .check_room(1, &live, Some((0.999_999, avail)))
            .unwrap_err();
        assert!(e.to_string().contains("the next checkpoint"), "{e}");
    }
}
