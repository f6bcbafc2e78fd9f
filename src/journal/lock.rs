//! Who owns a directory: an advisory lock (`flock`) on its `LOCK` file, held while the owner
//! works in it and released by the kernel when the owner's process ends, however it ends.
//! The journal's directory has one (one writer per journal: [`super::Journal::open`]), and
//! so has the data directory (`walrus serve` and the offline commands take it before they
//! do anything else: `crate::cli`).
//!
//! An exclusive owner writes who it is into the file (pid, host, command line), so that a
//! process it refuses can name it. Shared owners (commands that only read) write nothing,
//! and create nothing: a directory with no `LOCK` has had no owner that takes one, and a
//! backup on read-only media must still be readable. The file is never removed; between
//! owners it names the last exclusive one.
//!
//! On a network file system the lock holds across hosts only where the file system carries
//! `flock` to its server: Linux's NFS client does (as a lock on the whole file, NFSv4, or
//! NFSv3 with its lock manager), unless mounted with `nolock` or `local_lock=flock`; then it
//! holds only among the processes of one host (docs/operations.md, "One walrus per data
//! directory").

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::error::JournalError;

/// The lock's file name, in the directory it guards.
pub const LOCK_FILE: &str = "LOCK";

/// How a directory is held: by one owner that may change it, or by any number that read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Shared,
    Exclusive,
}

/// A held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DirLock {
    _file: Option<File>,
}

impl DirLock {
    /// Takes the lock of `dir` (which must exist) without waiting. Exclusive: `LOCK` is
    /// created if missing, and then names this process. Shared: nothing is created; a
    /// directory without `LOCK` is read unlocked. A lock held against this one is
    /// [`JournalError::InUse`], naming its holder.
    pub fn take(dir: &Path, access: Access) -> Result<DirLock, JournalError> {
        let path = dir.join(LOCK_FILE);
        let opened = match access {
            Access::Exclusive => OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path),
            Access::Shared => match File::open(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(DirLock { _file: None })
                }
                r => r,
            },
        };
        let file =
            opened.map_err(|e| JournalError::io(format!("opening {}", path.display()), e))?;
        if let Err(e) = flock(&file, access) {
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(JournalError::io(format!("locking {}", path.display()), e));
            }
            return Err(JournalError::InUse {
                dir: dir.to_path_buf(),
                holder: holder(&file, access),
            });
        }
        if access == Access::Exclusive {
            // Only to name this process to others: a lock whose file cannot say so (a full
            // disk) is still held.
            if let Err(e) = write_owner(&file) {
                tracing::warn!(
                    "cannot write this process's pid into {}: {e}",
                    path.display()
                );
            }
        }
        Ok(DirLock { _file: Some(file) })
    }
}

fn flock(file: &File, access: Access) -> std::io::Result<()> {
    let op = match access {
        Access::Shared => libc::LOCK_SH,
        Access::Exclusive => libc::LOCK_EX,
    };
    // SAFETY: flock on a descriptor this function borrows.
    if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What names this process: `pid 1234 on HOST (COMMAND LINE)`.
fn owner() -> String {
    let mut host = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer it is given.
    let named = unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len()) } == 0;
    let host = if named {
        let end = host.iter().position(|&b| b == 0).unwrap_or(host.len());
        String::from_utf8_lossy(&host[..end]).into_owned()
    } else {
        "an unknown host".into()
    };
    // Quoted where a shell would need it: an empty `--metrics-listen ""` stays visible.
    let command: Vec<String> = std::env::args()
        .map(|a| {
            let plain = !a.is_empty() && !a.contains(|c: char| c.is_whitespace() || c == '"');
            if plain {
                a
            } else {
                format!("{a:?}")
            }
        })
        .collect();
    format!(
        "pid {} on {host} ({})",
        std::process::id(),
        command.join(" ")
    )
}

/// Writes [`owner`] over the file's start, padded with newlines over what a longer owner
/// left (no truncation: one system call fewer for the service's filter to allow).
fn write_owner(file: &File) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut text = format!("{}\n", owner()).into_bytes();
    let old = file.metadata()?.len() as usize;
    text.resize(text.len().max(old), b'\n');
    file.write_all_at(&text, 0)?;
    file.sync_data()
}

/// Who holds `file`'s lock against a request for `wanted`. An exclusive holder named itself
/// in the file; shared holders did not (the file still names the last exclusive one), so
/// they are told apart first: a shared request succeeds only against them.
fn holder(mut file: &File, wanted: Access) -> String {
    if wanted == Access::Exclusive && flock(file, Access::Shared).is_ok() {
        // SAFETY: releases the shared lock just taken on this descriptor.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        return "walrus commands that read it (walrus verify, walrus journal verify)".into();
    }
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    match text.trim() {
        "" => "another process".into(),
        named => named.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_exclusive_owner_or_many_readers_and_a_refusal_names_the_owner() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        // Readers create nothing where there is no lock yet.
        drop(DirLock::take(&dir, Access::Shared).unwrap());
        assert!(!dir.join(LOCK_FILE).exists());
        let owner = DirLock::take(&dir, Access::Exclusive).unwrap();
        let me = format!("pid {} on ", std::process::id());
        for access in [Access::Exclusive, Access::Shared] {
            let e = DirLock::take(&dir, access).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{} is in use by {me}", dir.display())),
                "{e}"
            );
        }
        drop(owner);
        let readers = [
            DirLock::take(&dir, Access::Shared).unwrap(),
            DirLock::take(&dir, Access::Shared).unwrap(),
        ];
        let e = DirLock::take(&dir, Access::Exclusive)
            .unwrap_err()
            .to_string();
        assert!(e.contains("walrus commands that read it"), "{e}");
        drop(readers);
        drop(DirLock::take(&dir, Access::Exclusive).unwrap());
    }

    /// The limit docs/failure-modes.md states: the lock lives on the file, so a `LOCK`
    /// deleted under its owner lets a second one make another and take it.
    #[test]
    fn a_deleted_lock_file_no_longer_guards_its_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let _owner = DirLock::take(tmp.path(), Access::Exclusive).unwrap();
        std::fs::remove_file(tmp.path().join(LOCK_FILE)).unwrap();
        assert!(DirLock::take(tmp.path(), Access::Exclusive).is_ok());
    }
}
