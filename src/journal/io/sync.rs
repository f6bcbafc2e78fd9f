//! The portable backend: pwrite + fdatasync on `max_in_flight` worker threads.
//!
//! The writer loop runs on its own thread in a current-thread tokio runtime; each write is
//! handed to a worker, which writes it and fdatasyncs the segment file before replying.
//! Several workers give several writes in flight, like io_uring's queue depth.

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
        let (tx, rx) = oneshot::channel();
        let sent = self.jobs.send(Job {
            seg_index,
            seg_off,
            buf,
            reply: tx,
        });
        async move {
            match sent {
                Ok(()) => rx
                    .await
                    .expect("sync worker dropped a write without replying"),
                Err(mpsc::SendError(job)) => (
                    Err(std::io::Error::other("sync journal workers are gone")),
                    job.buf,
                ),
            }
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
        let f = &files[job.seg_index as usize];
        let res = f
            .write_all_at(job.buf.as_slice(), job.seg_off)
            .and_then(|()| f.sync_data());
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
    let backend = SyncBackend {
        jobs: tx,
        max_in_flight,
    };
    std::thread::Builder::new()
        .name("walrus-journal".into())
        .spawn(move || {
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
