//! The accept loops and graceful shutdown.
//!
//! walrus listens for plaintext clients (`proxy.listen`), TLS clients (`tls.listen`), or
//! both. Each client, of either port, holds one of `max_clients` permits from its connect
//! (a TLS client's handshake included); one too many gets Valkey's own `-ERR max number of
//! clients reached` and is closed. On the TLS port it is closed unanswered: it could read
//! the error only after a handshake, and handshakes beyond the limit are what the limit is
//! for. On shutdown the listeners close at once, sessions stop reading, write the replies
//! still pending, and close; after `shutdown_timeout` whatever is left is cut.

use super::identity::Identity;
use super::tls::{self, TlsClients};
use super::{session, Shared};
use crate::metrics;
use crate::net::Stream;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// How long accepting pauses after it failed (no file descriptor left, no memory).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

const MAX_CLIENTS_REACHED: &[u8] = b"-ERR max number of clients reached\r\n";

/// A socket walrus accepts clients on.
pub struct Listener {
    pub tcp: TcpListener,
    /// `Some` for the TLS port.
    pub tls: Option<Arc<TlsClients>>,
}

/// What every accept loop shares.
struct Accepting {
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    /// Tells sessions (and handshakes under way) that walrus is shutting down.
    session_stop: watch::Receiver<bool>,
}

pub async fn serve(
    shared: Arc<Shared>,
    listeners: Vec<Listener>,
    max_clients: usize,
    stop: watch::Receiver<bool>,
    shutdown_timeout: Duration,
) {
    let permits = Arc::new(Semaphore::new(max_clients));
    let (session_stop_tx, session_stop) = watch::channel(false);
    let accepting = Arc::new(Accepting {
        shared,
        permits: permits.clone(),
        session_stop,
    });
    let loops: Vec<_> = listeners
        .into_iter()
        .map(|l| tokio::spawn(accept_loop(accepting.clone(), l, stop.clone())))
        .collect();
    for l in loops {
        // Each ends when `stop` fires, dropping its listener.
        let _ = l.await;
    }
    let active = max_clients - permits.available_permits();
    tracing::info!(
        active,
        "shutting down: draining client sessions (timeout {shutdown_timeout:?})"
    );
    let _ = session_stop_tx.send(true);
    crate::fault::fail_point!("stop::drain");
    let drained =
        tokio::time::timeout(shutdown_timeout, permits.acquire_many(max_clients as u32)).await;
    match drained {
        Ok(_) => tracing::info!("all client sessions drained"),
        Err(_) => tracing::warn!(
            remaining = max_clients - permits.available_permits(),
            "shutdown timeout reached; closing remaining sessions"
        ),
    }
}

async fn accept_loop(a: Arc<Accepting>, listener: Listener, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            a = listener.tcp.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
        };
        let (mut sock, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: keep serving existing clients, and
                // try again once some may have closed (not in a loop that takes a core).
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(permit) = a.permits.clone().try_acquire_owned() else {
            metrics::CLIENTS_REJECTED.inc();
            if listener.tls.is_none() {
                tokio::spawn(async move {
                    let _ = sock.write_all(MAX_CLIENTS_REACHED).await;
                });
            }
            continue;
        };
        tracing::debug!(%peer, tls = listener.tls.is_some(), "client connected");
        let a = a.clone();
        let tls = listener.tls.clone();
        tokio::spawn(async move {
            let (stream, id) = match tls {
                None => (Stream::Tcp(sock), Identity::default()),
                Some(t) => {
                    let mut stop = a.session_stop.clone();
                    let admitted = tokio::select! {
                        r = tls::admit(&a.shared, &t, sock, peer) => r,
                        // Shutting down: a handshake under way is abandoned.
                        _ = stop.wait_for(|s| *s) => None,
                    };
                    match admitted {
                        Some(s) => s,
                        None => return,
                    }
                }
            };
            run(a, stream, id, permit).await;
        });
    }
}

async fn run(a: Arc<Accepting>, stream: Stream, id: Identity, permit: OwnedSemaphorePermit) {
    metrics::CLIENTS_ACCEPTED.inc();
    metrics::CLIENTS.inc();
    session::run(a.shared.clone(), stream, id, a.session_stop.clone()).await;
    metrics::CLIENTS.dec();
    drop(permit);
    tracing::debug!("client session ended");
}
