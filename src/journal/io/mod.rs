//! I/O backends and their selection.
//!
//! Both open the segment files O_DSYNC (and O_DIRECT when allowed): each completed write is
//! durable, and several are in flight.
//!
//! - `uring`: tokio-uring on a dedicated thread.
//! - `sync`: the portable fallback, blocking pwrite on `max_in_flight` threads. Chosen
//!   automatically when io_uring is unavailable (Docker's and containerd's default seccomp
//!   profiles block it; gVisor and old kernels lack it).
//!
//! O_DIRECT is probed at startup by writing one aligned block to a probe file: tmpfs and
//! some overlay file systems refuse it with EINVAL.

pub mod sync;
pub mod uring;

/// A write goes inline (on the writer loop's thread) only while the device is fast: the
/// fastest of the latest writes took less than this. An inline write blocks that loop for its
/// whole duration: nothing else can be submitted meanwhile. On a fast local disk (a 4 KiB
/// O_DSYNC write in ~0.1 ms) that is worth the hand-off it saves, tens of µs of a durable
/// reply; on a network volume (1-5 ms a sync) the entries arriving during it would wait a
/// whole device latency before their own write could even start, and writes would go one at
/// a time.
const INLINE_WHILE_WRITES_UNDER_US: f64 = 250.0;
/// How many of the latest writes the device is judged by. Their fastest, not their mean: on
/// busy cores a write to a fast disk takes several times the device's latency (the thread
/// waits for a core after each completion, inline or not), so by the mean, writes left the
/// inline path under load, where it saves most: more and smaller writes, each with one more
/// hand-off (docs/benchmarks.md, "The inline write under load"). A slow device is slow on
/// every write.
const RECENT_WRITES: usize = 16;
/// A write this slow is the device's, not a wait for a core (a few hundred µs on busy cores):
/// the next write leaves the inline path at once, instead of once the fast writes before it
/// have aged out of the window, each inline write meanwhile a whole stall on its own.
const STALL_US: f64 = 4.0 * INLINE_WHILE_WRITES_UNDER_US;

#[derive(Default)]
struct State {
    in_flight: std::cell::Cell<usize>,
    /// Durations (µs) of the latest writes, at most `RECENT_WRITES`; none at first, so the
    /// first write goes inline.
    recent_us: std::cell::RefCell<std::collections::VecDeque<f64>>,
}

impl State {
    fn record(&self, us: f64) {
        let mut recent = self.recent_us.borrow_mut();
        if recent.len() == RECENT_WRITES {
            recent.pop_front();
        }
        recent.push_back(us);
    }

    /// Whether the device looks fast: its fastest recent write (none yet: fast), unless the
    /// latest one took past `STALL_US`.
    fn device_fast(&self) -> bool {
        let recent = self.recent_us.borrow();
        let fastest = recent.iter().copied().reduce(f64::min);
        fastest.is_none_or(|us| us < INLINE_WHILE_WRITES_UNDER_US)
            && recent.back().is_none_or(|&us| us < STALL_US)
    }
}

/// Counts a backend's writes in flight (on its one writer-loop thread) and tells each new
/// write whether to go inline: at queue depth 1, on a fast device, both backends write on
/// that thread.
#[derive(Default)]
pub(crate) struct InFlight(std::rc::Rc<State>);

/// Held by a write until it finishes (or its future is dropped); records its duration.
pub(crate) struct InFlightGuard {
    state: std::rc::Rc<State>,
    started: std::time::Instant,
}

impl InFlight {
    /// Registers a write; `true` when it should go inline (counted as such): no other write
    /// in flight and the device is fast.
    pub(crate) fn begin(
        &self,
        writes_inline: &std::sync::atomic::AtomicU64,
    ) -> (bool, InFlightGuard) {
        let before = self.0.in_flight.get();
        self.0.in_flight.set(before + 1);
        let inline = before == 0 && self.0.device_fast();
        if inline {
            writes_inline.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let guard = InFlightGuard {
            state: self.0.clone(),
            started: std::time::Instant::now(),
        };
        (inline, guard)
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let s = &self.state;
        s.in_flight.set(s.in_flight.get() - 1);
        s.record(self.started.elapsed().as_secs_f64() * 1e6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a slow device no write goes inline: an inline write would keep the next one from
    /// starting for a whole device latency.
    #[test]
    fn writes_go_inline_only_alone_and_while_the_device_is_fast() {
        let (shared, f) = (std::sync::atomic::AtomicU64::new(0), InFlight::default());
        let (inline, first) = f.begin(&shared);
        assert!(inline, "a first write, alone, goes inline");
        let (inline, _second) = f.begin(&shared);
        assert!(!inline, "a write beside another does not");
        drop(first);
        drop(_second);
        // A slow device: every write takes 5 ms.
        for _ in 0..RECENT_WRITES {
            f.0.record(5000.0);
        }
        let (inline, _third) = f.begin(&shared);
        assert!(!inline, "a write after slow ones went inline");
    }

    /// A fast disk on busy cores: most writes take several times the device's latency (the
    /// thread waits for a core after each one), a few take the device's own. Writes stay
    /// inline: the mean (here over 400 µs) is the CPU's, the fastest is the device's.
    #[test]
    fn a_fast_device_on_busy_cores_keeps_writing_inline() {
        let (shared, f) = (std::sync::atomic::AtomicU64::new(0), InFlight::default());
        for i in 0..RECENT_WRITES {
            f.0.record(if i % 8 == 3 { 110.0 } else { 480.0 });
        }
        assert!(
            f.begin(&shared).0,
            "writes left the inline path on a fast device"
        );
        // Once the device itself slows down (16 writes of 1 ms, a network volume), they leave it.
        for _ in 0..RECENT_WRITES {
            f.0.record(1000.0);
        }
        assert!(!f.begin(&shared).0);
    }

    /// A fast device that starts stalling (a throttled volume: 2 s a write) leaves the inline
    /// path at its first slow write, not once the fast ones have aged out of the window:
    /// meanwhile every write would go alone, each a whole stall.
    #[test]
    fn a_device_that_starts_stalling_leaves_the_inline_path_at_once() {
        let (shared, f) = (std::sync::atomic::AtomicU64::new(0), InFlight::default());
        for _ in 0..RECENT_WRITES {
            f.0.record(100.0);
        }
        f.0.record(2_000_000.0);
        assert!(!f.begin(&shared).0, "a write after a stall went inline");
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
    /// Files opened with O_DSYNC, so that a completed write is durable: always, except
    /// under the `journal::no_sync` fail point, when nothing syncs.
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
            BackendKind::Sync => "sync (pwrite on threads)",
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
    let dsync = !crate::fault::journal_no_sync();
    let depth = cfg.max_in_flight_writes as usize;
    let info = |kind| BackendInfo {
        kind,
        direct_io: direct,
        dsync,
        max_in_flight: depth,
    };
    if cfg.io_backend != IoBackendChoice::Sync {
        let files = open_segments(dir, geo, direct, dsync)?;
        match uring::start(files, depth, shared.clone()) {
            Ok(handle) => return Ok((info(BackendKind::IoUring), handle)),
            Err(e) if cfg.io_backend == IoBackendChoice::Auto => {
                // Not a warning: the fallback keeps as many writes in flight, and a container
                // runtime's default seccomp profile refuses io_uring on every start.
                tracing::info!(error = %e, "io_uring unavailable, using the sync backend (O_DSYNC pwrite on {depth} threads)");
            }
            Err(e) => {
                return Err(JournalError::io(
                    "journal.io_backend = \"io_uring\" but io_uring is unavailable",
                    e,
                ));
            }
        }
    }
    let files = open_segments(dir, geo, direct, dsync)?;
    let handle = sync::start(files, depth, shared)?;
    Ok((info(BackendKind::Sync), handle))
}
