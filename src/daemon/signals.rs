//! How walrus is told to stop, and how it makes sure it does: SIGTERM and SIGINT (a stop
//! bounded at twice `proxy.shutdown_timeout_ms`), SIGHUP (the TLS files read again), and the
//! service manager's watchdog, fed while the event loop turns.

use super::Fatal;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// Feeds systemd's watchdog from a task on the event loop, twice per interval as sd_notify(3)
/// advises: it is fed while the loop turns, during a restore too, and not once it stops.
pub(super) fn spawn_watchdog() {
    if let Some(every) = crate::supervisor::watchdog_interval() {
        tracing::info!(?every, "feeding the service manager's watchdog");
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every / 2);
            loop {
                tick.tick().await;
                crate::supervisor::watchdog();
            }
        });
    }
}

/// SIGTERM and SIGINT stop walrus, within `stop_bound` ([`bound_the_stop`]); SIGHUP reads
/// the TLS files again (`hup` counts them). Without a handler, SIGHUP would end the
/// process: it is handled whatever the configuration, and said to have nothing to reload
/// when there is no TLS listener.
pub(super) fn spawn_signal_handler(
    stop: watch::Sender<bool>,
    hup: watch::Sender<u64>,
    stop_bound: Duration,
) -> Result<(), Fatal> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            if hup.receiver_count() == 0 {
                tracing::info!("SIGHUP received: nothing to reload (no tls.listen)");
            } else {
                tracing::info!(
                    "SIGHUP received: reading the TLS certificate, key and CA files again"
                );
                hup.send_modify(|n| *n += 1);
            }
        }
    });
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        crate::supervisor::stopping("stopping: draining held replies, then closing the journal");
        bound_the_stop(stop_bound);
        let _ = stop.send(true);
    });
    Ok(())
}

/// Ends the process `bound` from now if the stop has not: walrus never hangs, not even on its
/// way out. Cut there, it is as after a SIGKILL (what it acknowledged is journaled; a managed
/// Valkey dies with it), and status 1 tells a supervisor to start it again. Watched from a
/// thread of its own and written with plain system calls, so that it works even when the
/// runtime's threads, or the log's writer, are stuck.
fn bound_the_stop(bound: Duration) {
    std::thread::spawn(move || {
        // A timer, not synchronization: nothing is awaited but the bound.
        std::thread::sleep(bound);
        let line = format!(
            "walrus: the stop did not finish within {} ms (twice proxy.shutdown_timeout_ms): \
             exiting now, as a SIGKILL would end it; the next start restores from the journal\n",
            bound.as_millis()
        );
        // SAFETY: a write of a live buffer to stderr, then an exit that runs nothing that
        // could wait on the stuck threads.
        unsafe {
            libc::write(2, line.as_ptr().cast(), line.len());
            libc::_exit(1);
        }
    });
}
