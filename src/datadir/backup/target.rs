//! Where a backup goes: a new or empty directory, checked before anything is written, and
//! the staging directory beside it that the copy is written into and renamed from (the
//! module doc of [`super`] says why); staging directories that backups cut short left are
//! removed by the next backup beside them.

use super::copy::{copy_into, Read, Summary};
use crate::checkpoint::store::Store;
use crate::datadir::pitr::Cut;
use crate::datadir::DataDirError::{self, Failed, Refused};
use crate::journal::lock::{Access, DirLock};
use crate::journal::manifest::fsync_dir;
use crate::journal::Journal;
use std::path::{Path, PathBuf};

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
pub(super) struct Target {
    to: PathBuf,
    pub(super) staging: PathBuf,
    /// The staging directory's lock: a backup writing it is not one cut short.
    _lock: DirLock,
}

/// The one of walrus's `live` directories that `path` would be inside once the symlinks
/// above it are resolved, if any: a backup or an export written there could replace a file
/// walrus keeps, or be removed as a leftover.
pub(crate) fn live_dir_of(path: &Path, live: &[PathBuf]) -> Result<Option<PathBuf>, DataDirError> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut resolved =
        resolve(parent).map_err(|e| Failed(format!("cannot resolve {}: {e}", parent.display())))?;
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
    pub(super) fn prepare(to: &Path, live: &[PathBuf]) -> Result<Target, DataDirError> {
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
        if let Some(live) = live_dir_of(to, live)? {
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
    pub(super) fn check_room(
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
    pub(super) fn abandon(&self, why: DataDirError) -> DataDirError {
        let _ = std::fs::remove_dir_all(&self.staging);
        why
    }

    /// The copy, into the staging directory, then renamed to the target (blocking). On
    /// failure what it wrote is removed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write(
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
