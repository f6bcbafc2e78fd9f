//! Messages Valkey sends a client unasked, on their way to it: the RESP3 pushes of a dedicated
//! connection (Pub/Sub messages, tracking invalidations), and the messages of a RESP2 Pub/Sub
//! relay ([`super::pinned`]).
//!
//! A notice among them (a keyspace notification, a tracking invalidation: [`super::notices`])
//! waits until the journal covers the write it reports ([`crate::durability::notices`]), and
//! every message after it waits behind it: a client gets its messages in Valkey's order. One
//! that can never go closes the client, with the reason. Messages that report no write
//! (PUBLISH, subscription confirmations) pass as they come when nothing is held before them.
//!
//! Bounded in bytes, like Valkey's `client-output-buffer-limit pubsub`: past
//! `proxy.max_push_bytes` queued (waiting for the journal, or for a client that does not
//! read), the connection is dropped and the client disconnected, rather than walrus's memory
//! growing without limit. Bounded in time by the notices' own bound
//! (`durability.max_hold_ms`).

use super::notices;
use crate::durability::notices::{Notice, Notices};
use crate::durability::Durability;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

struct Queued {
    bytes: AtomicUsize,
    overflowed: AtomicBool,
}

/// A message and, for a notice that must wait, what it waits for.
struct Push {
    bytes: Bytes,
    notice: Option<Notice>,
}

pub struct PushSender {
    tx: mpsc::UnboundedSender<Push>,
    queued: Arc<Queued>,
    limit: usize,
    /// `None` when durability is off: nothing waits.
    gate: Option<Arc<Durability>>,
    /// The history epoch of the connection the messages come from.
    epoch: u64,
}

pub struct PushReceiver {
    rx: mpsc::UnboundedReceiver<Push>,
    queued: Arc<Queued>,
    /// The next message, taken from the channel and waiting for its notice to be released
    /// (kept here, so that a wait given up by `select!` loses nothing).
    front: Option<Push>,
    notices: Option<Notices>,
}

/// A queue of at most `limit` bytes for one client; `gate`: the durability gate its notices
/// wait on.
pub fn channel(limit: usize, gate: Option<&Arc<Durability>>) -> (PushSender, PushReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(Queued {
        bytes: AtomicUsize::new(0),
        overflowed: AtomicBool::new(false),
    });
    (
        PushSender {
            tx,
            queued: queued.clone(),
            limit,
            gate: gate.cloned(),
            epoch: 0,
        },
        PushReceiver {
            rx,
            queued,
            front: None,
            notices: gate.map(|g| g.notices()),
        },
    )
}

impl PushSender {
    /// The messages come from a connection of history `epoch`: a notice from an older one
    /// is never released.
    pub fn in_epoch(mut self, epoch: u64) -> PushSender {
        self.epoch = epoch;
        self
    }

    /// Queues a message as it arrives from Valkey; `Err` with the bytes that would be queued
    /// when over the limit (the caller ends the connection).
    pub fn send(&self, push: Bytes) -> Result<(), usize> {
        let queued = self.queued.bytes.fetch_add(push.len(), Ordering::AcqRel) + push.len();
        if queued > self.limit {
            self.queued.overflowed.store(true, Ordering::Release);
            return Err(queued);
        }
        let notice = self.gate.as_ref().and_then(|g| {
            let names = notices::names(&push)?;
            g.notice(&names, self.epoch)
        });
        // The receiver is gone only when the client is.
        let _ = self.tx.send(Push {
            bytes: push,
            notice,
        });
        Ok(())
    }
}

impl PushReceiver {
    /// The next message, once it may go; `Err`: the error the client gets before it is
    /// closed, for a notice that never may. Cancel-safe.
    pub async fn recv(&mut self) -> Option<Result<Bytes, Bytes>> {
        if self.front.is_none() {
            self.front = Some(self.rx.recv().await?);
        }
        if let (
            Some(Push {
                notice: Some(n), ..
            }),
            Some(notices),
        ) = (&self.front, &mut self.notices)
        {
            if let Err(why) = notices.released(n).await {
                return Some(Err(withheld(why)));
            }
        }
        Some(Ok(self.take_front()))
    }

    /// The next message if it may go now, without waiting.
    pub fn try_recv(&mut self) -> Option<Result<Bytes, Bytes>> {
        if self.front.is_none() {
            self.front = Some(self.rx.try_recv().ok()?);
        }
        if let (
            Some(Push {
                notice: Some(n), ..
            }),
            Some(notices),
        ) = (&self.front, &mut self.notices)
        {
            match notices.ready(n) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(why) => return Some(Err(withheld(why))),
            }
        }
        Some(Ok(self.take_front()))
    }

    fn take_front(&mut self) -> Bytes {
        let push = self.front.take().expect("a message is at the front");
        let n = push.bytes.len();
        let before = self.queued.bytes.fetch_sub(n, Ordering::AcqRel);
        // Paired with `PushSender::send`, which counts a message before it queues it: a
        // count below zero would wrap, and the next message would look over the limit.
        assert!(
            before >= n,
            "a push of {n} bytes taken while only {before} bytes are counted queued"
        );
        push.bytes
    }

    /// The sender gave up because the client did not read its pushes.
    pub fn overflowed(&self) -> bool {
        self.queued.overflowed.load(Ordering::Acquire)
    }
}

/// A notice that will never go: its client is closed, told why.
fn withheld(why: crate::durability::Refusal) -> Bytes {
    crate::metrics::CLIENTS_NOTICE_CLOSED.inc();
    tracing::warn!("closing a client: {why}");
    why.reply()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::dirty::Scope;
    use std::time::Duration;

    #[tokio::test]
    async fn pushes_past_the_limit_are_refused_until_the_client_reads() {
        let (tx, mut rx) = channel(10, None);
        assert!(tx.send(Bytes::from_static(b"123456")).is_ok());
        assert_eq!(tx.send(Bytes::from_static(b"123456")), Err(12));
        assert!(rx.overflowed());
        assert_eq!(&rx.recv().await.unwrap().unwrap()[..], b"123456");
    }

    #[tokio::test]
    #[should_panic(expected = "a push of 6 bytes taken while only 0 bytes are counted queued")]
    async fn a_push_taken_uncounted_is_caught() {
        let (tx, mut rx) = channel(10, None);
        tx.send(Bytes::from_static(b"123456")).unwrap();
        tx.queued.bytes.store(0, Ordering::SeqCst);
        rx.recv().await;
    }

    fn message(channel: &str, payload: &str) -> Bytes {
        Bytes::from(format!(
            ">3\r\n$7\r\nmessage\r\n${}\r\n{channel}\r\n${}\r\n{payload}\r\n",
            channel.len(),
            payload.len()
        ))
    }

    #[tokio::test]
    async fn a_held_notice_keeps_every_message_after_it_waiting() {
        let gate = Durability::new(u64::MAX, u64::MAX).with_max_hold(Duration::from_secs(60));
        gate.attach("run", 100, true, false, 100);
        let gate = Arc::new(gate);
        let (tx, mut rx) = channel(1 << 20, Some(&gate));
        let tx = tx.in_epoch(gate.epoch());
        let mark = gate
            .begin_write(Scope::Keys {
                db: 0,
                keys: vec![Bytes::from_static(b"k")],
            })
            .unwrap();
        let notice = message("__keyspace@0__:k", "set");
        let published = message("news", "hello");
        tx.send(notice.clone()).unwrap();
        tx.send(published.clone()).unwrap();
        assert!(rx.try_recv().is_none(), "k's write is not durable");
        gate.settle_batch(150, gate.epoch(), Vec::new(), vec![mark]);
        gate.set_durable(150);
        assert_eq!(rx.recv().await.unwrap().unwrap(), notice);
        assert_eq!(rx.try_recv().unwrap().unwrap(), published);
    }
}
