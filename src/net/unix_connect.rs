//! Connecting to a Unix socket without stopping the proxy on a file system that stops
//! answering.
//!
//! connect(2) looks the socket's path up on the calling thread. On a network or FUSE file
//! system whose server went away (the managed Valkey's socket in a data directory on NFS),
//! that lookup waits with it, and on the proxy's worker (one on two cores) it would stop
//! every client, `/healthz` and the stop. Moving every connect to a blocking thread costs a
//! hand-off each way: 17% of the MULTIs of clients that open a connection per request (each
//! MULTI opens one to Valkey), measured on this machine. So the first connect to a path runs
//! on a blocking thread and also learns the file systems its lookup crosses; later ones stay
//! on the calling thread when all of them are local, whose lookups are answered from the
//! kernel's memory.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use tokio::net::UnixStream;

/// File systems whose path lookups never wait on a remote server (`statfs`'s `f_type`):
/// ext2/3/4, XFS, btrfs, tmpfs, ramfs, overlayfs, F2FS, ZFS. Any other may.
const LOCAL_FS: [u32; 8] = [
    0xef53,
    0x5846_5342,
    0x9123_683e,
    0x0102_1994,
    0x8584_58f6,
    0x794c_7630,
    0xf2f5_2010,
    0x2fc1_2fc1,
];

/// Whether each path's lookup stays local, learned at its first connect.
fn verdicts() -> &'static Mutex<HashMap<PathBuf, bool>> {
    static VERDICTS: OnceLock<Mutex<HashMap<PathBuf, bool>>> = OnceLock::new();
    VERDICTS.get_or_init(Default::default)
}

/// Connects to the socket at `path`, non-blocking as tokio's own connect (a full backlog is
/// an error at once, not a thread waiting for Valkey to accept).
pub async fn connect(path: &Path) -> io::Result<UnixStream> {
    let local = verdicts()
        .lock()
        .expect("unix connect verdicts")
        .get(path)
        .copied();
    if local == Some(true) {
        return UnixStream::connect(path).await;
    }
    let p = path.to_path_buf();
    let (stream, local) = crate::task::off_worker(move || {
        let local = lookup_is_local(&p);
        let s = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
        s.set_nonblocking(true)?;
        s.connect(&socket2::SockAddr::unix(&p)?)?;
        Ok((std::os::unix::net::UnixStream::from(s), local))
    })
    .await?;
    verdicts()
        .lock()
        .expect("unix connect verdicts")
        .insert(path.to_path_buf(), local);
    UnixStream::from_std(stream)
}

/// Whether every directory the lookup of `path` walks through is on a local file system.
fn lookup_is_local(path: &Path) -> bool {
    let Ok(absolute) = std::path::absolute(path) else {
        return false;
    };
    absolute.ancestors().skip(1).all(|dir| {
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
            return false;
        };
        // SAFETY: statfs writes only into `st`, which it is given whole; `c` is a valid,
        // NUL-terminated path.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0)
            && LOCAL_FS.contains(&(st.f_type as u32))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_on_local_file_systems_is_local_and_one_under_proc_is_not() {
        let dir = tempfile::tempdir().unwrap();
        // The test machine's temp dir is on ext4 or tmpfs, and so is /.
        assert!(lookup_is_local(&dir.path().join("valkey.sock")));
        assert!(!lookup_is_local(Path::new("/proc/self/valkey.sock")));
    }
}
