//! I/O backends and their selection.
//!
//! - `uring`: tokio-uring on a dedicated thread, files opened O_DSYNC (and O_DIRECT when
//!   allowed): each completed write is durable, several are in flight.
//! - `sync`: the portable fallback, pwrite + fdatasync on a few dedicated threads. Chosen
//!   automatically when io_uring is unavailable (Docker's and containerd's default seccomp
//!   profiles block it).
//!
//! O_DIRECT is probed at startup by writing one aligned block to a probe file: tmpfs and
//! some overlay file systems refuse it with EINVAL.

pub mod sync;
pub mod uring;

/// Counts a backend's writes in flight (on its one writer-loop thread) and tells each new
/// write whether it is alone: at queue depth 1 both backends write inline, on that thread.
#[derive(Default)]
pub(crate) struct InFlight(std::rc::Rc<std::cell::Cell<usize>>);

/// Held by a write until it finishes (or its future is dropped).
pub(crate) struct InFlightGuard(std::rc::Rc<std::cell::Cell<usize>>);

impl InFlight {
    /// Registers a write; `true` when no other write is in flight (counted as inline).
    pub(crate) fn begin(&self, shared: &super::writer::WriterState) -> (bool, InFlightGuard) {
        let before = self.0.get();
        self.0.set(before + 1);
        if before == 0 {
            shared
                .writes_inline
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        (before == 0, InFlightGuard(self.0.clone()))
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// Two future types behind one `impl Future` (avoids boxing per write).
pub(crate) mod either {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub enum Either<A, B> {
        Left(A),
        Right(B),
    }
    pub use Either::{Left, Right};

    impl<A: Future, B: Future<Output = A::Output>> Future for Either<A, B> {
        type Output = A::Output;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<A::Output> {
            // SAFETY: structural pinning; the variant is never moved out of the pin.
            unsafe {
                match self.get_unchecked_mut() {
                    Either::Left(a) => Pin::new_unchecked(a).poll(cx),
                    Either::Right(b) => Pin::new_unchecked(b).poll(cx),
                }
            }
        }
    }
}

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::buf::IoBuf;
use super::config::{DirectIo, IoBackendChoice, JournalConfig};
use super::error::JournalError;
use super::format::BLOCK_BYTES;
use super::ring::{segment_path, Geometry};
use super::writer::WriterState;

/// Which backend runs, with which flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendInfo {
    pub kind: BackendKind,
    pub direct_io: bool,
    /// Files opened with O_DSYNC (io_uring); otherwise each write is followed by fdatasync.
    pub dsync: bool,
    pub max_in_flight: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    IoUring,
    Sync,
}

impl std::fmt::Display for BackendInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            BackendKind::IoUring => "io_uring",
            BackendKind::Sync => "sync (pwrite+fdatasync)",
        };
        write!(
            f,
            "{kind}, O_DIRECT {}, O_DSYNC {}, {} writes in flight",
            if self.direct_io { "on" } else { "off" },
            if self.dsync { "on" } else { "off" },
            self.max_in_flight
        )
    }
}

const PROBE_FILE: &str = ".walrus-direct-io-probe";

/// True when the file system under `dir` accepts O_DIRECT|O_DSYNC aligned writes.
pub fn probe_direct_io(dir: &Path) -> bool {
    let path = dir.join(PROBE_FILE);
    let ok = (|| -> std::io::Result<()> {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
            .open(&path)?;
        let mut buf = IoBuf::new(BLOCK_BYTES);
        buf.set_len(BLOCK_BYTES);
        f.write_all_at(buf.as_slice(), 0)
    })()
    .is_ok();
    let _ = std::fs::remove_file(&path);
    ok
}

/// Opens every segment for writing with the given flags.
pub fn open_segments(
    dir: &Path,
    geo: Geometry,
    direct: bool,
    dsync: bool,
) -> Result<Vec<File>, JournalError> {
    let mut flags = 0;
    if direct {
        flags |= libc::O_DIRECT;
    }
    if dsync {
        flags |= libc::O_DSYNC;
    }
    (0..geo.segments)
        .map(|i| {
            let p = segment_path(dir, i);
            OpenOptions::new()
                .write(true)
                .custom_flags(flags)
                .open(&p)
                .map_err(|e| JournalError::io(format!("opening {} for writing", p.display()), e))
        })
        .collect()
}

fn resolve_direct(dir: &Path, cfg: &JournalConfig) -> Result<bool, JournalError> {
    match cfg.direct_io {
        DirectIo::Off => Ok(false),
        DirectIo::On => {
            if probe_direct_io(dir) {
                Ok(true)
            } else {
                Err(JournalError::Config(format!(
                    "journal.direct_io = \"on\" but the file system under {} refuses O_DIRECT",
                    dir.display()
                )))
            }
        }
        DirectIo::Auto => Ok(probe_direct_io(dir)),
    }
}

/// Starts the writer thread with the configured (or best available) backend.
pub fn start_writer(
    dir: &Path,
    geo: Geometry,
    cfg: &JournalConfig,
    shared: Arc<WriterState>,
) -> Result<(BackendInfo, JoinHandle<()>), JournalError> {
    let direct = resolve_direct(dir, cfg)?;
    let depth = cfg.max_in_flight_writes as usize;
    if cfg.io_backend != IoBackendChoice::Sync {
        let dsync = !crate::fault::journal_no_sync();
        let files = open_segments(dir, geo, direct, dsync)?;
        match uring::start(files, depth, shared.clone()) {
            Ok(handle) => {
                let info = BackendInfo {
                    kind: BackendKind::IoUring,
                    direct_io: direct,
                    dsync,
                    max_in_flight: depth,
                };
                return Ok((info, handle));
            }
            Err(e) if cfg.io_backend == IoBackendChoice::Auto => {
                tracing::warn!(error = %e, "io_uring unavailable, using the sync backend (pwrite + fdatasync)");
            }
            Err(e) => {
                return Err(JournalError::io(
                    "journal.io_backend = \"io_uring\" but io_uring is unavailable",
                    e,
                ));
            }
        }
    }
    let files = open_segments(dir, geo, direct, false)?;
    let handle = sync::start(files, depth, shared)?;
    Ok((
        BackendInfo {
            kind: BackendKind::Sync,
            direct_io: direct,
            dsync: false,
            max_in_flight: depth,
        },
        handle,
    ))
}
