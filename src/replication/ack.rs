//! What walrus tells Valkey as its replica: `REPLCONF ACK <received> FACK <durable>`; and
//! [`Received`], the stream's offset as journaled, which the link advances entry by entry.

use super::follow::Covered;
use crate::journal::Journal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Valkey drops a replica silent for `repl-timeout` (60 s by default): ack well within it.
const ACK_INTERVAL: Duration = Duration::from_secs(1);

/// How far walrus has received Valkey's stream in one attachment: the offset at the end of
/// the last entry journaled. The link advances it, entry by entry; the acknowledger tells
/// Valkey (`ACK`). One writer (the link), so a load and a store make an advance.
#[derive(Debug)]
pub struct Received(AtomicU64);

impl Received {
    /// `offset`: where the stream starts (the full resync's offset, or the journal's end a
    /// partial resync continues from).
    pub fn new(offset: u64) -> Received {
        Received(AtomicU64::new(offset))
    }

    pub fn offset(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Checks, before an entry of offsets `start..end` (`start`: the offset before its first
    /// byte) is journaled, that it continues the stream exactly: a hole or an overlap in the
    /// journal would surface only at a restore (a gap in the chain), after the writes it
    /// covers were acknowledged.
    pub fn check_next(&self, start: u64, end: u64) {
        let received = self.offset();
        assert!(
            start == received && end > start,
            "an entry of offsets {start}..{end} does not continue the stream received through {received}"
        );
    }

    /// The entry ending at `end` is journaled. Paired with [`check_next`](Self::check_next):
    /// the received offset never goes back.
    pub fn appended(&self, end: u64) {
        let received = self.offset();
        assert!(
            end > received,
            "the received offset would go back from {received} to {end}"
        );
        self.0.store(end, Ordering::Release);
    }
}

/// Tells Valkey how far walrus has received (`ACK`, what `WAIT` counts) and how far that is
/// on disk (`FACK`, what `WAITAOF` counts): every second (Valkey drops a replica that stays
/// silent for `repl-timeout`), when Valkey asks (`GETACK`: a client waits in `WAIT` or
/// `WAITAOF`), and after that at every durable advance until what walrus had received when
/// asked is durable. Not at every advance otherwise: an ACK per group commit cost walrus a
/// send and Valkey a command (about 5% of walrus's CPU under 50 writing clients), for no
/// one. The gate follows the durable position on its own ([`super::follow`]).
pub async fn acknowledge(
    mut wr: crate::net::WriteHalf,
    // Weak: an aborted acker may be dropped a moment after the link, and the journal must
    // close at shutdown.
    journal: std::sync::Weak<Journal>,
    mut covered: Covered,
    received: Arc<Received>,
    getack: Arc<Notify>,
) {
    let mut tick = tokio::time::interval(ACK_INTERVAL);
    let mut last_sent = None;
    // The received offset when Valkey last asked, until FACK reaches it.
    let mut asked_for = None;
    let Some(mut durable) = journal.upgrade().map(|j| j.durable()) else {
        return;
    };
    loop {
        let d = *durable.borrow_and_update();
        if d.failed {
            // Nothing more becomes durable: FACK stays where it is.
            return;
        }
        let fack = covered.advance(&d);
        let ack = received.offset().max(fack);
        let due = last_sent.is_none() || asked_for.is_some();
        if due && last_sent != Some((ack, fack)) {
            if send_ack(&mut wr, ack, fack).await.is_err() {
                return;
            }
            last_sent = Some((ack, fack));
        }
        if asked_for.is_some_and(|a| fack >= a) {
            asked_for = None;
        }
        // A tick or a GETACK clears `last_sent`: the top of the loop then sends, with what
        // has been received by then. Durable advances matter only while Valkey waits for an
        // answer (the gate follows them on its own): otherwise this task sleeps through them.
        tokio::select! {
            r = durable.changed(), if asked_for.is_some() => if r.is_err() { return },
            _ = tick.tick() => last_sent = None,
            _ = getack.notified() => {
                last_sent = None;
                asked_for = Some(received.offset());
            }
        }
    }
}

async fn send_ack(wr: &mut crate::net::WriteHalf, ack: u64, fack: u64) -> std::io::Result<()> {
    wr.send_all(&crate::resp::write::command([
        b"REPLCONF".as_slice(),
        b"ACK",
        ack.to_string().as_bytes(),
        b"FACK",
        fack.to_string().as_bytes(),
    ]))
    .await
}

#[cfg(test)]
mod tests {
    use super::Received;

    #[test]
    fn the_stream_is_received_entry_after_entry() {
        let r = Received::new(100);
        r.check_next(100, 150);
        r.appended(150);
        r.check_next(150, 151);
        r.appended(151);
        assert_eq!(r.offset(), 151);
    }

    #[test]
    #[should_panic(
        expected = "an entry of offsets 160..170 does not continue the stream received through 150"
    )]
    fn a_hole_is_caught_before_it_is_journaled() {
        let r = Received::new(100);
        r.appended(150);
        r.check_next(160, 170);
    }

    #[test]
    #[should_panic(
        expected = "an entry of offsets 140..170 does not continue the stream received through 150"
    )]
    fn an_overlap_is_caught_before_it_is_journaled() {
        let r = Received::new(150);
        r.check_next(140, 170);
    }

    #[test]
    #[should_panic(expected = "the received offset would go back from 150 to 120")]
    fn the_received_offset_never_goes_back() {
        let r = Received::new(150);
        r.appended(120);
    }
}
