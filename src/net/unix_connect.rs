//! Connecting to a Unix socket without stopping the proxy on a file system that stops
//! answering.
//!
//! connect(2) looks the socket's path up on the calling thread. On a network or FUSE file
//! system whose server went away (the managed Valkey's socket in a data directory on NFS),
//! that lookup waits with it, and on the proxy's worker (one on two cores) it would stop
//! every client, `/healthz` and the stop. Moving every connect to a blocking thread costs a
//! hand-off each way: 17% of the MULTIs of clients that open a connection per request (each
//! MULTI opens one to Valkey), measured on this machine. So the first connect to a path runs
//! on a blocking thread and also learns the file systems its lookup crosses (symbolic links
//! resolved); later ones stay on the calling thread when all of them are local. A local file
//! system answers a lookup of a path in use from the kernel's cache; one on a network block
//! device (EBS, iSCSI) that stopped answering could still stall a lookup the cache lost.
//!
//! Connects off the worker are bounded per path ([`IN_FLIGHT`]): on a volume that stops
//! answering, each one keeps a blocking thread until it answers, while its caller gives up
//! at its own timeout; the others wait for a turn, within that timeout, instead of taking
//! every blocking thread that the disk watcher, checkpoints and the admin requests need.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;

/// File systems whose lookups never wait on a remote server (`statfs`'s `f_type`, as in
/// Linux's `include/uapi/linux/magic.h`); any other may.
const LOCAL_FS: [(u32, &str); 8] = [
    (0xef53, "ext2/3/4"),
    (0x5846_5342, "XFS"),
    (0x9123_683e, "btrfs"),
    (0x0102_1994, "tmpfs"),
    (0x8584_58f6, "ramfs"),
    (0x794c_7630, "overlayfs"),
    (0xf2f5_2010, "F2FS"),
    (0x2fc1_2fc1, "ZFS"),
];

/// Connects to one path that may be made off the worker at once.
const IN_FLIGHT: usize = 8;

struct Known {
    /// Whether its lookup stays on local file systems, once learned.
    local: Option<bool>,
    /// Turns for its connects off the worker.
    turns: Arc<Semaphore>,
}

fn paths() -> &'static Mutex<HashMap<PathBuf, Known>> {
    static PATHS: OnceLock<Mutex<HashMap<PathBuf, Known>>> = OnceLock::new();
    PATHS.get_or_init(Default::default)
}

/// Connects to the socket at `path`, non-blocking as tokio's own connect (a full backlog is
/// an error at once, not a thread waiting for Valkey to accept).
pub async fn connect(path: &Path) -> io::Result<UnixStream> {
    let (local, turns) = {
        let mut paths = paths().lock().expect("unix connect paths");
        if !paths.contains_key(path) {
            let turns = Arc::new(Semaphore::new(IN_FLIGHT));
            paths.insert(path.to_path_buf(), Known { local: None, turns });
        }
        let known = &paths[path];
        (known.local, known.turns.clone())
    };
    if local == Some(true) {
        return UnixStream::connect(path).await;
    }
    let turn = turns.acquire_owned().await.map_err(io::Error::other)?;
    let p = path.to_path_buf();
    let (stream, learned) = crate::task::off_worker(move || {
        let _turn = turn;
        let learned = local.is_none().then(|| lookup_is_local(&p)).flatten();
        let s = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
        s.set_nonblocking(true)?;
        s.connect(&socket2::SockAddr::unix(&p)?)?;
        Ok((std::os::unix::net::UnixStream::from(s), learned))
    })
    .await?;
    if let (Some(local), Some(known)) = (
        learned,
        paths().lock().expect("unix connect paths").get_mut(path),
    ) {
        known.local = Some(local);
    }
    UnixStream::from_std(stream)
}

/// Whether the lookup of `path` (symbolic links resolved) crosses only local file systems;
/// `None` when it cannot tell (the socket is not there yet): asked again at the next connect.
fn lookup_is_local(path: &Path) -> Option<bool> {
    let real = std::fs::canonicalize(path).ok()?;
    Some(real.ancestors().all(|p| {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
            return false;
        };
        // SAFETY: statfs writes only into `st`, which it is given whole; `c` is a valid,
        // NUL-terminated path.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        let kind = (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as u32);
        kind.is_some_and(|k| LOCAL_FS.iter().any(|&(m, _)| m == k))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_on_local_file_systems_is_local_one_under_proc_is_not_and_none_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("valkey.sock");
        std::fs::write(&file, b"").unwrap();
        // The test machine's temp dir is on ext4 or tmpfs, and so is /.
        assert_eq!(lookup_is_local(&file), Some(true));
        // Through a symbolic link: the link's target is what the lookup reaches.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/proc/self/status", &link).unwrap();
        assert_eq!(lookup_is_local(&link), Some(false));
        assert_eq!(lookup_is_local(&dir.path().join("absent")), None);
    }
}
