//! Who a data directory is, to the archive: an identity made once and kept in it, and the
//! writer of the archive it was restored from, which it may take over.
//!
//! Kept in `<data>/archive/`: `IDENTITY` (random, hex) and `RESTORED_FROM` (the archive
//! writer's identity when a restore from the archive made this directory).

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

/// The identity of `data_dir`, made on first use (blocking).
pub fn of(data_dir: &Path) -> Result<Identity, ArchiveError> {
    let d = dir(data_dir);
    let path = d.join("IDENTITY");
    let id = match std::fs::read_to_string(&path) {
        Ok(t) => t.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut b = [0u8; 16];
            getrandom::fill(&mut b)
                .map_err(|e| ArchiveError::Local(format!("no randomness: {e}")))?;
            let id = crate::journal::manifest::hex_encode(&b);
            write(&d, "IDENTITY", &id)?;
            id
        }
        Err(e) => return Err(local("reading", &path, e)),
    };
    let restored_from = match std::fs::read_to_string(d.join("RESTORED_FROM")) {
        Ok(t) => Some(t.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(local("reading", &d.join("RESTORED_FROM"), e)),
    };
    let abs = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    Ok(Identity {
        id,
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

    #[test]
    fn an_identity_is_made_once_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let a = of(tmp.path()).unwrap();
        assert_eq!(a.id.len(), 32);
        assert_eq!(of(tmp.path()).unwrap(), a);
        assert_eq!(a.restored_from, None);
        note_restored(tmp.path(), "someone").unwrap();
        assert_eq!(
            of(tmp.path()).unwrap().restored_from.as_deref(),
            Some("someone")
        );
        forget_restored(tmp.path()).unwrap();
        assert_eq!(of(tmp.path()).unwrap().restored_from, None);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(of(other.path()).unwrap().id, a.id);
    }
}
