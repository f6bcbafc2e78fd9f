//! The data directory is walrus's user's alone: the journal and the checkpoints hold the
//! dataset, and a restore trusts that no other user can read it ([`crate::restore`]'s
//! listener lets processes of walrus's own user through). And it is one walrus's at a time:
//! `serve` and the offline commands ([`crate::cli`]) take its lock ([`lock`]) before
//! anything else.

use super::Fatal;
use crate::journal::lock::{Access, DirLock};
use crate::journal::manifest::create_dir_durably;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Takes the data directory's lock (`DIR/LOCK`, [`DirLock`]) before anything is done in it:
/// exclusive for `serve` and the commands that write (a second `serve` would start a
/// valkey-server on the first one's socket, and its stop would unlink it), shared for those
/// that only read (what they read must not move under them). The refusal names the owner
/// and what to do, and nothing has been changed by then. It is exit 1 by the command's rule
/// (`cli`): the same command succeeds once the owner stops, so a unit that systemd starts
/// while a person's walrus holds the directory takes over when that one stops, within its
/// restart limit.
pub fn lock(dir: &Path, access: Access) -> Result<DirLock, Fatal> {
    DirLock::take(dir, access)
        .map_err(|e| match e {
            crate::journal::JournalError::InUse { .. } => format!(
            "data directory {e}; one walrus at a time owns a data directory (docs/operations.md, \
             \"One walrus per data directory\"): stop that one first, or use another directory. \
             Nothing was changed"
        ),
            e => format!("data directory {}: {e}", dir.display()),
        })
        .map_err(Fatal::from)
}

/// The data directory a journal directory belongs to: its parent, when it is the
/// `journal/` that `serve` makes in one (a journal made elsewhere, `journal init --dir X`,
/// has its own lock only).
pub fn of_journal(journal_dir: &Path) -> Option<&Path> {
    journal_dir
        .file_name()
        .is_some_and(|n| n == "journal")
        .then(|| journal_dir.parent())
        .flatten()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
}

/// The data directory `serve` works in, created (durably: [`create_dir_durably`]) and
/// locked.
pub fn own(dir: &Path) -> Result<DirLock, super::Fatal> {
    create_dir_durably(dir).map_err(|source| CreateError {
        path: dir.to_path_buf(),
        source,
    })?;
    lock(dir, Access::Exclusive)
}

/// A directory walrus could not create; the I/O error is kept for the exit code's rule.
#[derive(Debug, thiserror::Error)]
#[error("cannot create {}: {source}", path.display())]
pub struct CreateError {
    path: std::path::PathBuf,
    source: std::io::Error,
}

/// What walrus creates is its user's alone, whatever the umask it was started with (022
/// makes files anyone can read): the journal, checkpoints, backups, AOF exports, and the
/// managed Valkey's files, which inherit it.
pub fn private_files() {
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(0o077) };
}

/// Creates `dir`, or closes it to other users where an older walrus, or a umask, left it
/// open: the directory (0700) and the files in it (journal segments are made once and
/// reused, so their mode lasts). What walrus does not own (a volume's root, which
/// Kubernetes gives to a group) is left as its owner made it; what walrus creates is
/// private ([`private_files`]).
pub fn make_private(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let meta = std::fs::metadata(dir)?;
    if meta.uid() == me && meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        tracing::info!(
            "{} was open to other users (mode {:o}); it holds the dataset: now 0700",
            dir.display(),
            meta.mode() & 0o777
        );
    }
    let closed = close_files(dir, me)?;
    if closed > 0 {
        tracing::info!(
            "{closed} files in {} were open to other users; they hold the dataset: now theirs alone",
            dir.display()
        );
    }
    Ok(())
}

/// Takes other users' permissions off the regular files walrus owns below `dir` (not
/// following symbolic links); returns how many it changed.
fn close_files(dir: &Path, me: u32) -> std::io::Result<usize> {
    let mut closed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            closed += close_files(&entry.path(), me)?;
        } else if meta.is_file() && meta.uid() == me && meta.mode() & 0o077 != 0 {
            let mode = meta.mode() & 0o700;
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode))?;
            closed += 1;
        }
    }
    Ok(closed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_data_directory_and_its_files_are_closed() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let segment = data.join("journal/seg-00000.wal");
        std::fs::create_dir_all(data.join("journal")).unwrap();
        std::fs::write(&segment, b"x").unwrap();
        for (path, mode) in [(&data, 0o755), (&segment, 0o644)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        make_private(&data).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&segment), 0o600);
    }
}
