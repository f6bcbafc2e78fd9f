//! The archive in a directory (`file://`, a mounted volume, NFS on bare metal), written as
//! an object store would be, durably: a temporary file beside the object, fsync, rename,
//! fsync of the directory (and of each directory made on the way). The one conditional write
//! (the manifest) holds an `flock` on `<key>.lock` while it compares and replaces: NFSv4
//! carries the lock to the server.

use super::{io, ArchiveError, Listed, Version};
use std::path::Path;

/// Writes `key` under `root` durably, its contents written by `fill`: a temporary file
/// beside it, fsync, rename, fsync of the directory (and of each directory made on the way).
pub(super) fn write(
    root: &Path,
    key: &str,
    fill: &mut dyn FnMut(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<(), ArchiveError> {
    let path = root.join(key);
    let parent = path.parent().unwrap_or(root).to_path_buf();
    make_dirs(root, &parent)?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("object");
    let tmp = parent.join(format!(".{name}.{:016x}.tmp", rand_u64()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("creating", &tmp, e))?;
        fill(&mut f).map_err(|e| io("writing", &tmp, e))?;
        f.sync_all().map_err(|e| io("fsync of", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io("renaming", &tmp, e))?;
        sync_dir(&parent)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Makes `dir` (under `root`) and syncs each parent whose entries it changed.
fn make_dirs(root: &Path, dir: &Path) -> Result<(), ArchiveError> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut d = dir;
    while !d.is_dir() && d != root {
        missing.push(d.to_path_buf());
        d = d.parent().unwrap_or(root);
    }
    if !root.is_dir() {
        return Err(ArchiveError::Store(format!(
            "{} does not exist: the archive's directory must be made (and mounted) first",
            root.display()
        )));
    }
    for m in missing.iter().rev() {
        match std::fs::create_dir(m) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("creating", m, e)),
        }
        sync_dir(m.parent().unwrap_or(root))?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), ArchiveError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("fsync of", dir, e))
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

/// The directory's conditional write: under an exclusive `flock` of `<key>.lock`, the
/// current contents' CRC must be `expect`'s (or there must be none).
pub(super) fn put_if(
    root: &Path,
    key: &str,
    bytes: &[u8],
    expect: Option<&Version>,
) -> Result<Result<Version, ()>, ArchiveError> {
    make_dirs(root, root.join(key).parent().unwrap_or(root))?;
    let lock_path = root.join(format!("{key}.lock"));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| io("opening", &lock_path, e))?;
    // SAFETY: flock on a file descriptor this function owns; released when `lock` closes.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(io("locking", &lock_path, std::io::Error::last_os_error()));
    }
    let path = root.join(key);
    let current = match std::fs::read(&path) {
        Ok(b) => Some(Version::of(&b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("reading", &path, e)),
    };
    if current.as_ref() != expect {
        return Ok(Err(()));
    }
    write(root, key, &mut |f| std::io::Write::write_all(f, bytes))?;
    drop(lock);
    Ok(Ok(Version::of(bytes)))
}

/// The objects under `root/under`, recursively, in key order; temporary files and locks left
/// out.
pub(super) fn list(
    root: &Path,
    under: &str,
    after: Option<&str>,
) -> Result<Vec<Listed>, ArchiveError> {
    let mut out = Vec::new();
    let mut dirs = vec![root.join(under.trim_end_matches('/'))];
    while let Some(d) = dirs.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("listing", &d, e)),
        };
        for e in entries {
            let e = e.map_err(|e| io("listing", &d, e))?;
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.starts_with('.') || name.ends_with(".lock") {
                continue;
            }
            let meta = match e.metadata() {
                Ok(m) => m,
                // Deleted since the directory was read (a merge's parts, retention): an
                // object store's listing would not show it either.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io("reading", &p, e)),
            };
            if meta.is_dir() {
                dirs.push(p);
                continue;
            }
            let Ok(rel) = p.strip_prefix(root) else {
                continue;
            };
            let key = rel.to_string_lossy().into_owned();
            if after.is_some_and(|a| key.as_str() <= a) {
                continue;
            }
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs() as i64);
            out.push(Listed {
                key,
                size: meta.len(),
                modified,
            });
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}
