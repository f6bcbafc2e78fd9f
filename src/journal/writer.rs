//! The writer loop: submits group-commit writes at increasing offsets, keeps several in
//! flight, and publishes the durable position as the end of the contiguous prefix of
//! completed writes. Runs on a dedicated thread, generic over the I/O backend.
//!
//! A failed write fails the journal forever: an fsync error may have dropped dirty pages,
//! so retrying and trusting a later success could acknowledge lost data.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, watch, Notify};

use super::batcher::Batcher;
use super::buf::IoBuf;

/// The durable position: every entry up to `lsn` is on stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Durable {
    /// Highest durable LSN (0: none yet).
    pub lsn: u64,
    /// Replication offset at the end of entry `lsn`.
    pub repl_offset: u64,
    /// The journal failed: no entry after `lsn` will ever become durable.
    pub failed: bool,
}

/// An I/O backend: performs one write durably (to a segment opened O_DSYNC).
///
/// Writes are block-aligned, whole blocks, inside one segment file. The writer loop keeps
/// up to `max_in_flight()` of them outstanding. Swapping tokio-uring for another io_uring
/// binding means implementing this trait only.
pub trait IoBackend: 'static {
    fn max_in_flight(&self) -> usize;
    fn write_durable(
        &self,
        seg_index: u32,
        seg_off: u64,
        buf: IoBuf,
    ) -> impl Future<Output = (std::io::Result<()>, IoBuf)> + 'static;
}

/// State shared by appenders (any thread) and the writer thread.
pub struct WriterState {
    pub batcher: Mutex<Batcher>,
    /// Appenders wake the writer: work is pending.
    pub wake_writer: Notify,
    /// The writer wakes appenders waiting for a free buffer.
    pub buffers_freed: Notify,
    pub durable_tx: watch::Sender<Durable>,
    /// Durable LSN, readable without the watch lock; stamped into records as durable_hint.
    pub durable_lsn: AtomicU64,
    /// Writes submitted, and those done as a direct blocking call at queue depth 1.
    pub writes_total: AtomicU64,
    pub writes_inline: AtomicU64,
    /// The last append was refused because the ring is full (cleared by the next one that
    /// fits): only a release makes room, so whoever releases must know, whatever the ring's
    /// fill says (a large entry can meet a full ring well below any fill trigger).
    pub room_wanted: std::sync::atomic::AtomicBool,
    /// Notified when an append is refused for room (one permit: one releaser listens).
    pub room_wanted_notify: Notify,
}

impl WriterState {
    pub fn lock(&self) -> MutexGuard<'_, Batcher> {
        // A panic while holding the lock is a bug; the state may be torn, so stop.
        self.batcher.lock().expect("journal batcher mutex poisoned")
    }

    pub(crate) fn fail(&self, why: String) {
        tracing::error!(error = %why, "journal failed; no further entry will become durable");
        // Also reachable while unwinding: do not panic again on a poisoned lock.
        let mut b = match self.batcher.lock() {
            Ok(b) => b,
            Err(p) => p.into_inner(),
        };
        b.set_failed(Arc::from(why));
        drop(b);
        self.durable_tx.send_modify(|d| d.failed = true);
        self.buffers_freed.notify_waiters();
    }
}

struct InFlight {
    seq: u64,
    end_pos: u64,
    done: bool,
    last_complete: Option<(u64, u64)>,
}

/// Fails the journal if the writer unwinds, so that tickets error instead of hanging.
struct PanicGuard(Arc<WriterState>);

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail("journal writer panicked".to_string());
        }
    }
}

/// Runs until the journal is closed and drained, or failed and drained.
pub async fn drive<B: IoBackend>(backend: B, shared: Arc<WriterState>) {
    let _guard = PanicGuard(shared.clone());
    let max_in_flight = backend.max_in_flight();
    assert!(max_in_flight > 0);
    let (done_tx, mut done_rx) = mpsc::channel::<(u64, std::io::Result<()>, IoBuf)>(max_in_flight);
    let mut inflight: VecDeque<InFlight> = VecDeque::with_capacity(max_in_flight);
    let mut next_seq = 0u64;
    let mut failed = false;
    // Furthest position written: a continuation rewrites its first block, so ring space
    // used grows by how far a write reaches past every earlier one (a gap skipped at a
    // segment's end included).
    let mut ring_end = None::<u64>;
    loop {
        if !failed {
            while inflight.len() < max_in_flight {
                let durable_lsn = shared.durable_lsn.load(Ordering::Acquire);
                let Some(w) = shared.lock().take_write(durable_lsn) else {
                    break;
                };
                let seq = next_seq;
                next_seq += 1;
                shared.writes_total.fetch_add(1, Ordering::Relaxed);
                inflight.push_back(InFlight {
                    seq,
                    end_pos: w.end_pos,
                    done: false,
                    last_complete: w.last_complete,
                });
                crate::metrics::JOURNAL_BYTES.inc_by(w.buf.len() as u64);
                let reached = ring_end.unwrap_or(w.start_pos());
                crate::metrics::JOURNAL_RING_BYTES.inc_by(w.end_pos.saturating_sub(reached));
                ring_end = Some(w.end_pos.max(reached));
                let started = std::time::Instant::now();
                let fut = backend.write_durable(w.seg_index, w.seg_off, w.buf);
                let tx = done_tx.clone();
                tokio::task::spawn_local(async move {
                    let (res, buf) = fut.await;
                    crate::metrics::JOURNAL_WRITE.observe(started.elapsed().as_secs_f64());
                    // The receiver lives as long as any write is in flight.
                    let _ = tx.send((seq, res, buf)).await;
                });
            }
        }
        if inflight.is_empty() {
            let b = shared.lock();
            if failed || (b.is_closed() && b.is_idle()) {
                break;
            }
        }
        tokio::select! {
            biased;
            Some((seq, res, buf)) = done_rx.recv() => {
                let front = inflight.front().expect("completion without a write in flight").seq;
                let slot = &mut inflight[(seq - front) as usize];
                assert_eq!(slot.seq, seq, "in-flight writes are tracked in submission order");
                slot.done = true;
                let fenced = {
                    let mut b = shared.lock();
                    b.give_back(buf);
                    b.write_done(slot.end_pos);
                    // Fenced from outside (`Journal::fail`): nothing more becomes durable.
                    b.failed().is_some()
                };
                failed |= fenced;
                shared.buffers_freed.notify_waiters();
                if let Err(e) = res {
                    if !failed {
                        failed = true;
                        shared.fail(format!("segment write failed: {e}"));
                    }
                }
                let mut advanced = None;
                while inflight.front().is_some_and(|f| f.done) {
                    let f = inflight.pop_front().expect("checked");
                    if f.last_complete.is_some() {
                        advanced = f.last_complete;
                    }
                }
                if let (Some((lsn, repl_offset)), false) = (advanced, failed) {
                    debug_assert!(lsn >= shared.durable_lsn.load(Ordering::Relaxed), "durable LSN went backwards");
                    shared.durable_lsn.store(lsn, Ordering::Release);
                    shared.durable_tx.send_modify(|d| {
                        d.lsn = lsn;
                        d.repl_offset = repl_offset;
                    });
                }
            }
            _ = shared.wake_writer.notified() => {}
        }
    }
    shared.buffers_freed.notify_waiters();
}
