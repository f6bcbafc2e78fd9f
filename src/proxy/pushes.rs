//! RESP3 pushes of a dedicated connection (Pub/Sub messages, tracking invalidations) on
//! their way to a client that may not read them. Bounded in bytes, like Valkey's
//! `client-output-buffer-limit pubsub`: past `proxy.max_push_bytes` queued, the connection is
//! dropped and the client disconnected, rather than walrus's memory growing without limit.

use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

struct Queued {
    bytes: AtomicUsize,
    overflowed: AtomicBool,
}

pub struct PushSender {
    tx: mpsc::UnboundedSender<Bytes>,
    queued: Arc<Queued>,
    limit: usize,
}

pub struct PushReceiver {
    rx: mpsc::UnboundedReceiver<Bytes>,
    queued: Arc<Queued>,
}

pub fn channel(limit: usize) -> (PushSender, PushReceiver) {
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
        },
        PushReceiver { rx, queued },
    )
}

impl PushSender {
    /// Queues a push; `Err` with the bytes that would be queued when over the limit (the
    /// caller ends the connection).
    pub fn send(&self, push: Bytes) -> Result<(), usize> {
        let queued = self.queued.bytes.fetch_add(push.len(), Ordering::AcqRel) + push.len();
        if queued > self.limit {
            self.queued.overflowed.store(true, Ordering::Release);
            return Err(queued);
        }
        // The receiver is gone only when the client is.
        let _ = self.tx.send(push);
        Ok(())
    }
}

impl PushReceiver {
    pub async fn recv(&mut self) -> Option<Bytes> {
        let push = self.rx.recv().await?;
        self.queued.bytes.fetch_sub(push.len(), Ordering::AcqRel);
        Some(push)
    }

    /// The sender gave up because the client did not read its pushes.
    pub fn overflowed(&self) -> bool {
        self.queued.overflowed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pushes_past_the_limit_are_refused_until_the_client_reads() {
        let (tx, mut rx) = channel(10);
        assert!(tx.send(Bytes::from_static(b"123456")).is_ok());
        assert_eq!(tx.send(Bytes::from_static(b"123456")), Err(12));
        assert!(rx.overflowed());
        assert_eq!(&rx.recv().await.unwrap()[..], b"123456");
    }
}
