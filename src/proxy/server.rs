//! The accept loop and graceful shutdown.
//!
//! Each client holds one of `max_clients` permits; one too many gets Valkey's own
//! `-ERR max number of clients reached` and is closed. On shutdown the listener closes at
//! once, sessions stop reading, write the replies still pending, and close; after
//! `shutdown_timeout` whatever is left is cut.

use super::{session, Shared};
use crate::metrics;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// How long accepting pauses after it failed (no file descriptor left, no memory).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

pub async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    max_clients: usize,
    mut stop: watch::Receiver<bool>,
    shutdown_timeout: Duration,
) {
    let permits = Arc::new(Semaphore::new(max_clients));
    let (session_stop_tx, session_stop) = watch::channel(false);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
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
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics::CLIENTS_REJECTED.inc();
            tokio::spawn(async move {
                let _ = sock
                    .write_all(b"-ERR max number of clients reached\r\n")
                    .await;
            });
            continue;
        };
        tracing::debug!(%peer, "client connected");
        let shared = shared.clone();
        let stop = session_stop.clone();
        metrics::CLIENTS_ACCEPTED.inc();
        tokio::spawn(async move {
            metrics::CLIENTS.inc();
            session::run(shared, crate::net::Stream::Tcp(sock), stop).await;
            metrics::CLIENTS.dec();
            drop(permit);
        });
    }
    drop(listener);
    let active = max_clients - permits.available_permits();
    tracing::info!(
        active,
        "shutting down: draining client sessions (timeout {shutdown_timeout:?})"
    );
    let _ = session_stop_tx.send(true);
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
