//! The portable backend: blocking pwrite on `max_in_flight` worker threads, to segment files
//! opened O_DSYNC (and O_DIRECT when allowed), as the io_uring backend opens them.
//!
//! The writer loop runs on its own thread in a current-thread tokio runtime; each write is
//! handed to a worker, whose pwrite returns once the data is durable. Several workers give
//! several writes in flight, like io_uring's queue depth (its io-wq workers do the same
//! blocking write). A separate fdatasync per write would not overlap: the syncs of one file
//! serialize on its inode lock, so on a device of latency L the writes would go one per L
//! however many workers wait. When no other write is outstanding, the writer-loop thread
//! performs the write itself: at queue depth 1 this saves the hand-off to a worker and back.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use super::super::buf::IoBuf;
use super::super::error::JournalError;
use super::super::writer::{drive, IoBackend, WriterState};

type Reply = oneshot::Sender<(std::io::Result<()>, IoBuf)>;

struct Job {
    seg_index: u32,
    seg_off: u64,
    buf: IoBuf,
    reply: Reply,
}

pub struct SyncBackend {
    jobs: mpsc::Sender<Job>,
    max_in_flight: usize,
    files: Arc<Vec<File>>,
    /// Writes handed out and not yet finished (on this single writer-loop thread).
    in_flight: super::InFlight,
    shared: Arc<WriterState>,
}

impl IoBackend for SyncBackend {
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
            // Nothing else in flight (queue depth 1) and a fast device (see `InFlight`):
            // write on this thread, saving two thread hand-offs. It blocks the writer loop
            // meanwhile; appends arriving then are grouped into the next write.
            let files = self.files.clone();
            return super::either::Left(async move {
                let _guard = guard;
                let res = write_durable(&files[seg_index as usize], &buf, seg_off);
                (res, buf)
            });
        }
        let (tx, rx) = oneshot::channel();
        let sent = self.jobs.send(Job {
            seg_index,
            seg_off,
            buf,
            reply: tx,
        });
        super::either::Right(async move {
            let _guard = guard;
            match sent {
                Ok(()) => rx
                    .await
                    .expect("sync worker dropped a write without replying"),
                Err(mpsc::SendError(job)) => (
                    Err(std::io::Error::other("sync journal workers are gone")),
                    job.buf,
                ),
            }
        })
    }
}

/// One write to a segment opened O_DSYNC: durable when it returns (unless the
/// `journal::no_sync` fail point opened the segments without it).
fn write_durable(f: &File, buf: &IoBuf, seg_off: u64) -> std::io::Result<()> {
    #[cfg(feature = "failpoints")]
    if let Some(fault) = crate::fault::points::journal_write(buf.as_slice()) {
        return faulty_write(f, buf.as_slice(), seg_off, fault);
    }
    let started = std::time::Instant::now();
    let written = f.write_all_at(buf.as_slice(), seg_off);
    // O_DSYNC: the write is the sync.
    crate::metrics::JOURNAL_FSYNC.observe(started.elapsed().as_secs_f64());
    written
}

/// A journal write with an injected fault ([`crate::fault`]).
#[cfg(feature = "failpoints")]
fn faulty_write(
    f: &File,
    data: &[u8],
    seg_off: u64,
    fault: crate::fault::points::JournalFault,
) -> std::io::Result<()> {
    use super::super::format::BLOCK_BYTES;
    use crate::fault::points::JournalFault;
    use std::io::Error;
    match fault {
        JournalFault::Write(errno) => Err(Error::from_raw_os_error(errno)),
        JournalFault::Fsync(errno) => {
            // The data reached the page cache, its writeback (the O_DSYNC write's sync)
            // failed, and the kernel dropped the pages: after a crash the range holds what
            // it held before.
            // Segment files are open write-only (and maybe O_DIRECT): read the old bytes
            // through a second, read-only descriptor, and write them back from an aligned
            // buffer.
            use std::os::fd::AsRawFd;
            let reader = File::open(format!("/proc/self/fd/{}", f.as_raw_fd()))?;
            let mut before = IoBuf::new(data.len());
            before.set_len(data.len());
            reader.read_exact_at(before.as_full_mut(), seg_off)?;
            f.write_all_at(data, seg_off)?;
            f.write_all_at(before.as_slice(), seg_off)?;
            f.sync_data()?;
            Err(Error::from_raw_os_error(errno))
        }
        JournalFault::Tear => {
            let last_block = data.len().saturating_sub(1) / BLOCK_BYTES * BLOCK_BYTES;
            let keep = last_block + BLOCK_BYTES / 2;
            f.write_all_at(&data[..keep.min(data.len())], seg_off)?;
            f.sync_data()?;
            tracing::error!(
                "fault injection: journal write torn; the process stops as in a power cut"
            );
            std::process::abort()
        }
    }
}

fn worker(files: Arc<Vec<File>>, jobs: Arc<Mutex<mpsc::Receiver<Job>>>) {
    loop {
        let job = {
            let rx = jobs.lock().expect("job queue mutex poisoned");
            match rx.recv() {
                Ok(j) => j,
                Err(_) => return, // backend dropped: shut down
            }
        };
        let res = write_durable(&files[job.seg_index as usize], &job.buf, job.seg_off);
        let _ = job.reply.send((res, job.buf));
    }
}

/// Spawns the workers and the writer-loop thread.
pub fn start(
    files: Vec<File>,
    max_in_flight: usize,
    shared: Arc<WriterState>,
) -> Result<JoinHandle<()>, JournalError> {
    let files = Arc::new(files);
    let (tx, rx) = mpsc::channel();
    let rx = Arc::new(Mutex::new(rx));
    let mut workers = Vec::with_capacity(max_in_flight);
    for i in 0..max_in_flight {
        let (files, rx) = (files.clone(), rx.clone());
        workers.push(
            std::thread::Builder::new()
                .name(format!("walrus-jsync-{i}"))
                .spawn(move || worker(files, rx))
                .map_err(|e| JournalError::io("spawning journal sync worker", e))?,
        );
    }
    std::thread::Builder::new()
        .name("walrus-journal".into())
        .spawn(move || {
            // Rc: the backend lives on this thread only.
            let backend = SyncBackend {
                jobs: tx,
                max_in_flight,
                files,
                in_flight: super::InFlight::default(),
                shared: shared.clone(),
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("building the journal writer runtime");
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, drive(backend, shared));
            // drive() returned: the backend and its job sender are dropped, workers exit.
            for w in workers {
                let _ = w.join();
            }
        })
        .map_err(|e| JournalError::io("spawning journal writer thread", e))
}
