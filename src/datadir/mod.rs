//! A data directory as files: what its parts hold, checked, read, copied and cut, by
//! `walrus verify`, `walrus backup`, `walrus restore --from-dir` and `walrus journal
//! export-aof` with walrus stopped, and by a running walrus's backups (`POST /backup`).
//! Nothing here speaks to Valkey: loading Valkey from a data directory is
//! [`crate::restore`]'s.
//!
//! - [`parts`]: whether a data directory's parts prove what it holds, decided before
//!   anything opens it (`walrus serve` decides with it too).
//! - [`chain`]: the checkpoint plus the journal after it, checked, as a byte stream; read as
//!   [`commands`], with published [`messages`] told apart.
//! - [`verify`]: `walrus verify`, the checks of a restore made offline.
//! - [`backup`]: the checkpoint and the chain after it copied into a new data directory,
//!   live or offline.
//! - [`pitr`]: where a point-in-time restore cuts the chain, and a data directory copied up
//!   to the cut.
//! - [`export`]: the chain as one AOF.

pub mod backup;
pub mod chain;
pub mod commands;
pub mod export;
pub mod messages;
pub mod parts;
pub mod pitr;
pub mod verify;

use crate::checkpoint::store::StoreError;
use crate::journal::manifest::MANIFEST_FILE;
use crate::journal::JournalError;
use chain::ChainError;
use std::path::{Path, PathBuf};

/// Why a data directory could not be checked, read, copied or cut as asked.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// Nothing will change until a person acts: a request that cannot work as given (a
    /// target that is not empty, inside walrus's own directories, on a file system without
    /// room; a cut the data cannot make), or a data directory whose parts do not prove what
    /// it holds. The text says what to do.
    #[error("{0}")]
    Refused(String),
    /// It failed or gave up (an I/O error, walrus stopping, the ring wanting room, another
    /// backup running); the same request may succeed later.
    #[error("{0}")]
    Failed(String),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Chain(#[from] ChainError),
}

/// Where a data directory keeps its journal and checkpoints. `dir` may also be the journal
/// directory itself (it holds a MANIFEST): its parent is then the data directory.
pub fn data_dirs(dir: &Path) -> (PathBuf, PathBuf) {
    if dir.join(MANIFEST_FILE).is_file() {
        let data = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        return (dir.to_path_buf(), data.join("checkpoints"));
    }
    (dir.join("journal"), dir.join("checkpoints"))
}
