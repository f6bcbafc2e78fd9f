//! The portable backend: pwrite + fdatasync on `max_in_flight` worker threads.
//!
//! The writer loop runs on its own thread in a current-thread tokio runtime; each write is
//! handed to a worker, which writes it and fdatasyncs the segment file before replying.
//! Several workers give several writes in flight, like io_uring's queue depth. When no
//! other write is outstanding, the writer-loop thread performs the write itself: at queue
//! depth 1 this saves the hand-off to a worker and back.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use super::super::buf::IoBuf;
use super::super::error::JournalError;
use super::super::writer::{drive, IoBackend, Shared};

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
    shared: Arc<Shared>,
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
        let (alone, guard) = self.in_flight.begin(&self.shared);
        if alone {
            // Nothing else in flight (queue depth 1): write on this thread, saving two
            // thread hand-offs. Appends arriving meanwhile are grouped into the next write;
            // writes issued while this one runs go to the workers.
            let files = self.files.clone();
            return super::either::Left(async move {
                let _guard = guard;
                let res = write_and_sync(&files[seg_index as usize], &buf, seg_off);
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

pub(super) fn write_and_sync(f: &File, buf: &IoBuf, seg_off: u64) -> std::io::Result<()> {
    if let Some(delay) = *FAULT_WRITE_DELAY {
        std::thread::sleep(delay);
    }
    if let Some(marker) = &*FAULT_FAIL_ON {
        // Once the marker is seen, this "device" is dead: every later write fails too.
        let dead = FAULT_DEAD.load(std::sync::atomic::Ordering::SeqCst)
            || buf
                .as_slice()
                .windows(marker.len())
                .any(|w| w == marker.as_slice());
        if dead {
            FAULT_DEAD.store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(std::io::Error::other("injected journal write failure"));
        }
    }
    f.write_all_at(buf.as_slice(), seg_off)
        .and_then(|()| f.sync_data())
}

/// Fault injection for tests of the durable write path: `WALRUS_FAULT_JOURNAL_WRITE_DELAY_MS`
/// makes every write of this backend take that much longer, a journal device that is
/// artificially slow. Read once; unset in production.
static FAULT_WRITE_DELAY: std::sync::LazyLock<Option<std::time::Duration>> =
    std::sync::LazyLock::new(|| {
        let ms: u64 = std::env::var("WALRUS_FAULT_JOURNAL_WRITE_DELAY_MS")
            .ok()?
            .parse()
            .ok()?;
        tracing::warn!(ms, "fault injection: every journal write is delayed");
        Some(std::time::Duration::from_millis(ms))
    });

fn worker(files: Arc<Vec<File>>, jobs: Arc<Mutex<mpsc::Receiver<Job>>>) {
    loop {
        let job = {
            let rx = jobs.lock().expect("job queue mutex poisoned");
            match rx.recv() {
                Ok(j) => j,
                Err(_) => return, // backend dropped: shut down
            }
        };
        let res = write_and_sync(&files[job.seg_index as usize], &job.buf, job.seg_off);
        let _ = job.reply.send((res, job.buf));
    }
}

/// Spawns the workers and the writer-loop thread.
pub fn start(
    files: Vec<File>,
    max_in_flight: usize,
    shared: Arc<Shared>,
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

/// Fault injection: `WALRUS_FAULT_JOURNAL_FAIL_ON=<text>` makes the first write whose data
/// contains `<text>`, and every write after it, fail: a device that dies at a chosen moment.
/// Unset in production.
static FAULT_FAIL_ON: std::sync::LazyLock<Option<Vec<u8>>> = std::sync::LazyLock::new(|| {
    let marker = std::env::var("WALRUS_FAULT_JOURNAL_FAIL_ON")
        .ok()
        .filter(|m| !m.is_empty())?;
    tracing::warn!(
        marker,
        "fault injection: journal writes fail from the one containing the marker on"
    );
    Some(marker.into_bytes())
});
static FAULT_DEAD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
