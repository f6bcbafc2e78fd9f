//! The data directory is walrus's user's alone: the journal and the checkpoints hold the
//! dataset, and a restore trusts that no other user can read it ([`crate::restore`]'s
//! listener lets processes of walrus's own user through).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// What walrus creates is its user's alone, whatever the umask it was started with (022
/// makes files anyone can read): the journal, checkpoints, backups, AOF exports, and the
/// managed Valkey's files, which inherit it.
pub fn private_files() {
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(0o077) };
}

/// Creates `dir`, or closes it to other users where an older walrus, or a umask, left it
/// open: what is in it is then reached by walrus's user alone. A directory walrus does not
/// own (a volume's root, which Kubernetes gives to a group) is left as its owner made it;
/// what walrus creates in it is private ([`private_files`]).
pub fn make_private(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let meta = std::fs::metadata(dir)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() == me && meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        tracing::info!(
            "{} was open to other users (mode {:o}); it holds the dataset: now 0700",
            dir.display(),
            meta.mode() & 0o777
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_data_directory_is_closed() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        make_private(&data).unwrap();
        assert_eq!(std::fs::metadata(&data).unwrap().mode() & 0o777, 0o700);
    }
}
