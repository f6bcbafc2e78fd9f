//! The directory of the managed Valkey's Unix socket, which only walrus's user may open.
//!
//! Valkey listens on no TCP port in managed mode: anyone who could connect would read data
//! that is not durable yet and write around the journal. The socket's own mode
//! (`--unixsocketperm 700`) is set by Valkey only after it bound the socket, so the
//! directory is what keeps others out from the first moment: walrus creates it with mode
//! 0700, and refuses to start with one that another user owns or others may enter (someone
//! else made it, or loosened it, and may hold it open).

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::client::UpstreamError;

/// Creates `dir` (mode 0700) unless it exists, then checks it is a directory, not a symbolic
/// link, owned by this process's user and closed to everyone else. The error names the path
/// and what to do.
pub fn prepare(dir: &Path) -> Result<(), UpstreamError> {
    make_private(dir).map_err(UpstreamError::Start)
}

/// [`prepare`], saying what is wrong with `dir`.
fn make_private(dir: &Path) -> Result<(), String> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    crate::journal::manifest::create_dir_durably(parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        // Its name made durable, as every directory walrus makes in the data directory.
        Ok(()) => std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let fix = "walrus keeps the managed Valkey's Unix socket there and creates the directory itself, mode 0700 (upstream.socket_dir)";
    if !meta.file_type().is_dir() {
        return Err(format!(
            "{} is not a directory (a symbolic link, or a file): {fix}; remove it",
            dir.display()
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to walrus's user (uid {me}): another user could open the managed Valkey's socket in it; {fix}; remove it or give it to uid {me}",
            dir.display(),
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} has mode {mode:04o}: other users could reach the managed Valkey's socket in it, around walrus; {fix}; run chmod 700 on it, or remove it",
            dir.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::prepare;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_new_directory_is_created_closed_to_others() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data/run");
        prepare(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Once more: it exists, as walrus left it.
        prepare(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_may_enter_is_refused_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = prepare(&dir).unwrap_err().to_string();
        assert!(
            e.contains(&dir.display().to_string()) && e.contains("mode 0755"),
            "{e}"
        );
    }

    #[test]
    fn a_symbolic_link_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
        let dir = tmp.path().join("run");
        std::os::unix::fs::symlink(&target, &dir).unwrap();
        let e = prepare(&dir).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Giving it away needs root (CAP_CHOWN); elsewhere the check is not reachable.
        if std::os::unix::fs::chown(&dir, Some(65534), None).is_err() {
            eprintln!("SKIPPED: chown needs root");
            return;
        }
        let e = prepare(&dir).unwrap_err().to_string();
        assert!(e.contains("belongs to uid 65534"), "{e}");
    }
}
