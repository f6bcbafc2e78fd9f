//! Where a reply goes: its client's session, through a one-shot channel, counted against the
//! client's output limit (`proxy.max_output_bytes`, Valkey's client-output-buffer-limit) the
//! moment it is handed over, not when the session gets round to it.
//!
//! A session busy elsewhere (waiting for room on a connection, for the gate's admission, or
//! for a client that does not read) does not take its replies as they arrive; without this
//! count they would wait in their channels unbounded, up to `proxy.max_pipeline_requests`
//! replies of any size. Past the limit a reply is dropped (an empty one is sent in its
//! place, so the session wakes) and the client is marked over: its session closes it, as
//! Valkey closes a client past its limit, without writing anything more.
//!
//! While a client's replies pile up, its session reads on what it sends (it may be sending a
//! whole pipeline before it reads a reply) without handling it: those requests count against
//! the same limit (`ahead`), since they are held only because the client does not read.

use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::oneshot;

/// One client's reply bytes walrus holds: handed over and not yet taken by the session
/// (`parked`), and taken but not yet written to the client's socket (`unwritten`); and the
/// bytes of requests it read ahead while those piled up (`ahead`).
#[derive(Debug)]
pub struct ClientOutput {
    parked: AtomicUsize,
    unwritten: AtomicUsize,
    ahead: AtomicUsize,
    /// Set once, for good: a reply was dropped, so nothing after it may be written.
    over: AtomicBool,
    limit: usize,
}

impl ClientOutput {
    pub fn new(limit: usize) -> Arc<ClientOutput> {
        Arc::new(ClientOutput {
            parked: AtomicUsize::new(0),
            unwritten: AtomicUsize::new(0),
            ahead: AtomicUsize::new(0),
            over: AtomicBool::new(false),
            limit,
        })
    }

    /// For replies nobody limits (walrus's own requests, tests).
    pub fn unlimited() -> Arc<ClientOutput> {
        ClientOutput::new(usize::MAX)
    }

    /// A reply of `n` bytes is handed over: `false` if it would take the client past its
    /// limit (the client is then over, for good).
    fn charge(&self, n: usize) -> bool {
        if self.over.load(Ordering::Acquire) {
            return false;
        }
        self.parked.fetch_add(n, Ordering::AcqRel);
        if self.held() > self.limit {
            self.parked.fetch_sub(n, Ordering::AcqRel);
            self.over.store(true, Ordering::Release);
            return false;
        }
        true
    }

    /// The session took a reply of `n` bytes from its channel.
    pub fn taken(&self, n: usize) {
        let before = self.parked.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(before >= n, "taken {n} bytes of {before} parked");
    }

    /// The session holds `n` bytes unwritten: `false` if that takes the client past its
    /// limit (the client is then over, for good).
    pub fn unwritten(&self, n: usize) -> bool {
        self.set(&self.unwritten, n)
    }

    /// The session holds `n` bytes of requests read ahead, unhandled, while the client's
    /// replies pile up: `false` if that takes the client past its limit (the client is then
    /// over, for good).
    pub fn ahead(&self, n: usize) -> bool {
        self.set(&self.ahead, n)
    }

    fn set(&self, count: &AtomicUsize, n: usize) -> bool {
        count.store(n, Ordering::Release);
        if self.held() > self.limit {
            self.over.store(true, Ordering::Release);
        }
        !self.over()
    }

    /// Bytes held for the client: replies handed over, or taken and not yet written, and
    /// requests read ahead.
    pub fn held(&self) -> usize {
        [&self.parked, &self.unwritten, &self.ahead]
            .into_iter()
            .map(|c| c.load(Ordering::Acquire))
            .fold(0, usize::saturating_add)
    }

    /// Bytes handed over and not yet taken by the session.
    pub fn parked(&self) -> usize {
        self.parked.load(Ordering::Acquire)
    }

    /// A reply was dropped, or the client holds more than its limit: close it, writing
    /// nothing more.
    pub fn over(&self) -> bool {
        self.over.load(Ordering::Acquire)
    }
}

/// The sending end of one reply's channel.
#[derive(Debug)]
pub struct ReplyTx {
    tx: oneshot::Sender<Bytes>,
    output: Arc<ClientOutput>,
}

/// A channel for one reply to the client whose output is `output`.
pub fn reply_channel(output: &Arc<ClientOutput>) -> (ReplyTx, oneshot::Receiver<Bytes>) {
    let (tx, rx) = oneshot::channel();
    let output = output.clone();
    (ReplyTx { tx, output }, rx)
}

impl ReplyTx {
    /// Nobody waits for the reply any more: its client is gone, or was closed.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Hands `reply` over, or, past the client's limit, an empty reply in its place (the
    /// session, woken by it, finds the client over and closes it).
    pub fn send(self, reply: Bytes) {
        let n = reply.len();
        if self.tx.is_closed() {
            return; // nobody waits for it (the session is gone, or took no interest)
        }
        if !self.output.charge(n) {
            let _ = self.tx.send(Bytes::new());
        } else if self.tx.send(reply).is_err() {
            // The session is gone.
            self.output.taken(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_past_the_limit_are_dropped_and_the_client_stays_over() {
        let output = ClientOutput::new(10);
        let (a, mut ra) = reply_channel(&output);
        let (b, mut rb) = reply_channel(&output);
        let (c, mut rc) = reply_channel(&output);
        a.send(Bytes::from_static(b"123456"));
        b.send(Bytes::from_static(b"123456"));
        assert!(output.over());
        assert_eq!(ra.try_recv().unwrap(), "123456");
        output.taken(6);
        assert!(rb.try_recv().unwrap().is_empty(), "dropped");
        // Room again, but nothing after a dropped reply may be written.
        c.send(Bytes::from_static(b"1"));
        assert!(rc.try_recv().unwrap().is_empty());
    }

    #[test]
    fn unwritten_and_parked_bytes_share_the_limit() {
        let output = ClientOutput::new(10);
        assert!(output.unwritten(8));
        let (a, mut ra) = reply_channel(&output);
        a.send(Bytes::from_static(b"123"));
        assert!(ra.try_recv().unwrap().is_empty());
        assert!(!output.unwritten(0), "over for good");
    }

    #[test]
    fn requests_read_ahead_share_the_limit() {
        let output = ClientOutput::new(10);
        assert!(output.ahead(6));
        assert!(output.unwritten(4));
        assert_eq!(output.held(), 10);
        assert!(!output.ahead(7), "over");
        assert!(!output.ahead(0), "over for good");
    }

    #[test]
    fn a_reply_nobody_waits_for_is_not_counted() {
        let output = ClientOutput::new(10);
        let (a, ra) = reply_channel(&output);
        drop(ra);
        a.send(Bytes::from_static(b"123456789"));
        assert!(output.unwritten(1));
    }
}
