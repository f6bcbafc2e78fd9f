//! Who a data directory is, to the archive: its identity (`data_dir_id`, drawn when its
//! journal was made and kept in both its manifests), and the writer of the archive it was
//! restored from, which it may take over (`<data>/archive/RESTORED_FROM`, written by a restore
//! from the archive).

use super::ArchiveError;
use std::path::{Path, PathBuf};

/// A data directory, as the archive knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub id: String,
    /// For people, in the manifest and in refusals: host and directory.
    pub name: String,
    /// The writer whose archive this directory was restored from.
    pub restored_from: Option<String>,
}

fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("archive")
}

/// The data directory `data_dir` whose identity is `id`, as the archive knows it (blocking).
pub fn of(
    data_dir: &Path,
    id: &crate::journal::manifest::DataDirId,
) -> Result<Identity, ArchiveError> {
    let d = dir(data_dir);
    let restored_from = match std::fs::read_to_string(d.join("RESTORED_FROM")) {
        Ok(t) => Some(t.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(local("reading", &d.join("RESTORED_FROM"), e)),
    };
    let abs = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    Ok(Identity {
        id: id.to_string(),
        name: format!("{}:{}", hostname(), abs.display()),
        restored_from,
    })
}

/// Notes that a restore from the archive written by `writer` made `data_dir` (blocking).
pub fn note_restored(data_dir: &Path, writer: &str) -> Result<(), ArchiveError> {
    write(&dir(data_dir), "RESTORED_FROM", writer)
}

/// Forgets the restore once the archive is this directory's own (blocking).
pub fn forget_restored(data_dir: &Path) -> Result<(), ArchiveError> {
    let p = dir(data_dir).join("RESTORED_FROM");
    match std::fs::remove_file(&p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(local("removing", &p, e)),
    }
}

fn write(d: &Path, name: &str, text: &str) -> Result<(), ArchiveError> {
    std::fs::create_dir_all(d).map_err(|e| local("creating", d, e))?;
    crate::journal::manifest::replace_file(d, name, format!("{text}\n").as_bytes())
        .map_err(|e| ArchiveError::Local(e.to_string()))
}

fn local(what: &str, p: &Path, e: std::io::Error) -> ArchiveError {
    ArchiveError::Local(format!("{what} {}: {e}", p.display()))
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer it is given.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "unknown-host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::manifest::DataDirId;

    #[test]
    fn a_restore_is_noted_until_the_archive_is_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let id = DataDirId::random().unwrap();
        let a = of(tmp.path(), &id).unwrap();
        assert_eq!((a.id, a.restored_from), (id.to_string(), None));
        note_restored(tmp.path(), "someone").unwrap();
        assert_eq!(
            of(tmp.path(), &id).unwrap().restored_from.as_deref(),
            Some("someone")
        );
        forget_restored(tmp.path()).unwrap();
        assert_eq!(of(tmp.path(), &id).unwrap().restored_from, None);
    }
}
