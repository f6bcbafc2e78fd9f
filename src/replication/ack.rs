//! What walrus tells Valkey as its replica: `REPLCONF ACK <received> FACK <durable>`.

use super::follow::Covered;
use crate::journal::Journal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Valkey drops a replica silent for `repl-timeout` (60 s by default): ack well within it.
const ACK_INTERVAL: Duration = Duration::from_secs(1);

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
    received: Arc<AtomicU64>,
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
        let ack = received.load(Ordering::Acquire).max(fack);
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
                asked_for = Some(received.load(Ordering::Acquire));
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
