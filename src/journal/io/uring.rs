//! io_uring backend through tokio-uring, on a dedicated thread.
//!
//! Files are opened O_DSYNC (plus O_DIRECT when allowed), so a completed write is durable
//! and no separate fsync is needed. Up to `max_in_flight` writes are submitted at once, at
//! increasing offsets. When no other write is outstanding, the write is a plain blocking
//! pwrite on this thread instead (see `write_durable`). tokio-uring is confined to this file: replacing it (io-uring crate,
//! tokio's own support) means reimplementing `IoBackend` here, nothing else.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::super::buf::IoBuf;
use super::super::writer::{drive, IoBackend, WriterState};

// SAFETY: IoBuf's memory is heap-allocated, never moves, and lives until the buffer is
// dropped; tokio-uring keeps the buffer alive until the kernel completes the operation.
unsafe impl tokio_uring::buf::IoBuf for IoBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.len()
    }

    fn bytes_total(&self) -> usize {
        self.capacity()
    }
}

pub struct UringBackend {
    files: Rc<Vec<tokio_uring::fs::File>>,
    /// The same segment files (dup'ed descriptors, same O_DIRECT|O_DSYNC flags) for the
    /// synchronous write at queue depth 1.
    std_files: Rc<Vec<File>>,
    max_in_flight: usize,
    /// Writes handed out and not finished (this thread only).
    in_flight: super::InFlight,
    shared: Arc<WriterState>,
}

impl IoBackend for UringBackend {
    fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    fn write_durable(
        &self,
        seg_index: u32,
        seg_off: u64,
        buf: IoBuf,
    ) -> impl std::future::Future<Output = (std::io::Result<()>, IoBuf)> + 'static {
        let (inline, guard) = self.in_flight.begin(&self.shared.writes_inline);
        if inline {
            // Queue depth 1 on a fast device (see `InFlight`): a blocking pwrite on this
            // thread. The kernel punts O_DSYNC io_uring writes to an io-wq worker (measured
            // here: ~+25 us p50 over pwrite at QD1), so when nothing else is in flight the
            // direct call is faster. It blocks the writer loop meanwhile: appends arriving
            // then are grouped into the next write, which goes through the ring.
            let files = self.std_files.clone();
            return super::either::Left(async move {
                let _guard = guard;
                let started = std::time::Instant::now();
                let res = files[seg_index as usize].write_all_at(buf.as_slice(), seg_off);
                // O_DSYNC: the write is the sync.
                crate::metrics::JOURNAL_FSYNC.observe(started.elapsed().as_secs_f64());
                (res, buf)
            });
        }
        let files = self.files.clone();
        super::either::Right(async move {
            let _guard = guard;
            let started = std::time::Instant::now();
            let done = files[seg_index as usize].write_all_at(buf, seg_off).await;
            crate::metrics::JOURNAL_FSYNC.observe(started.elapsed().as_secs_f64());
            done
        })
    }
}

/// Ring entries: enough for every in-flight write plus slack.
fn ring_entries(max_in_flight: usize) -> u32 {
    (max_in_flight * 2).next_power_of_two().max(8) as u32
}

/// Starts the uring thread. Fails (so that `auto` can fall back) when the ring cannot be
/// created or a probe write through it fails, e.g. under a seccomp profile.
pub fn start(
    files: Vec<File>,
    max_in_flight: usize,
    shared: Arc<WriterState>,
) -> std::io::Result<JoinHandle<()>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<std::io::Result<()>>(1);
    let probe_file = files[0].try_clone()?;
    let handle = std::thread::Builder::new()
        .name("walrus-journal-uring".into())
        .spawn(move || {
            let rt = match tokio_uring::Runtime::new(
                tokio_uring::builder().entries(ring_entries(max_in_flight)),
            ) {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                // Probe: an fdatasync of an unmodified segment through the ring proves the
                // io_uring syscalls are allowed, without touching segment data.
                let probe = tokio_uring::fs::File::from_std(probe_file);
                let res = probe.sync_data().await;
                let _ = probe.close().await;
                if let Err(e) = res {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                let dup = files.iter().map(File::try_clone);
                let std_files = match dup.collect::<std::io::Result<Vec<_>>>() {
                    Ok(f) => f,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let files: Vec<_> = files
                    .into_iter()
                    .map(tokio_uring::fs::File::from_std)
                    .collect();
                let backend = UringBackend {
                    files: Rc::new(files),
                    std_files: Rc::new(std_files),
                    max_in_flight,
                    in_flight: super::InFlight::default(),
                    shared: shared.clone(),
                };
                let _ = ready_tx.send(Ok(()));
                drive(backend, shared).await;
            });
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => {
            let _ = handle.join();
            Err(std::io::Error::other(
                "io_uring thread exited during startup",
            ))
        }
    }
}
